package sdk

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/wire"
)

// piece is verified chunk data sitting in a registered buffer.
type piece struct {
	region  *fabric.Region
	data    []byte // the requested bytes (zeros where the chunk is short)
	off     int64  // the chunk offset data starts at
	version uint64 // the replica's version
	length  int64  // the replica's chunk length
	// bad are the chunk offsets in [off, off+len(data)) whose bytes failed
	// their checksums (only from partial reads): take them from elsewhere.
	bad extent.List
}

// directRead reports whether a read of [off, off+n) of a chunk can land
// in the caller's buffer itself, saving a copy: a reply starts at the
// block holding off and runs to the end of the block holding off+n-1, so
// the range must be whole blocks of any size a node may use.
func directRead(off, n int64) bool {
	return n > 0 && off%maxBlockSize == 0 && n%maxBlockSize == 0
}

// maxReadLen is the largest read request this client sends: its reply's
// checksums must fit one packet.
func (c *Client) maxReadLen() int {
	blocks := wire.MaxReadBlocks(c.opts.MTU) - 2
	return min(c.opts.ReadReq, blocks*int(minAssumedBlock))
}

// minAssumedBlock is the smallest block size a store accepts; sizing read
// requests with it keeps their checksum list within a reply packet.
const minAssumedBlock = wire.MinBlockSize

// readChunk reads [off, off+n) of chunk l, trying its replicas in turn
// from replica first, and returns the verified bytes in a registered
// buffer (release it with c.bufs.put(p.region)) — or, if dst is not nil,
// in dst itself (see directRead; nothing to release).
//
// Checksums are judged block by block: a replica whose reply has a bad
// block still gives every other block, and only the bad ones are read
// from the next replicas (at the same version). The read fails only if
// some block is intact nowhere. Bad blocks are reported to meta, which
// has the copy healed.
//
// A replica answering busy (a write committed while it was sending) is
// retried with backoff for up to BusyRetry once every replica has been
// tried.
func (c *Client) readChunk(ctx context.Context, l *metaapi.ChunkLayout, off, n int64, first int, dst []byte) (piece, error) {
	if p, ok := c.readOptimistic(ctx, l, off, n, dst); ok {
		return p, nil
	}
	deadline := time.Now().Add(c.opts.BusyRetry)
	backoff := time.Millisecond
	for {
		var errs []error
		busy := false
		var base piece // a reply with bad blocks, being patched
		have := false
		for i := range l.Replicas {
			r := l.Replicas[(first+i)%len(l.Replicas)]
			var err error
			if !have {
				var p piece
				if p, err = c.readCopy(ctx, r, l, off, n, dst, true); err == nil {
					if len(p.bad) == 0 {
						return p, nil
					}
					base, have = p, true
					continue
				}
			} else if err = c.patch(ctx, r, l, &base); err == nil && len(base.bad) == 0 {
				return base, nil
			}
			if ctx.Err() != nil {
				c.release(base, dst)
				return piece{}, ctx.Err()
			}
			if err == nil {
				continue
			}
			if s, ok := statusOf(err); ok && s.Retryable() {
				busy = true
			}
			c.log.Debug("read from replica failed, trying the next", "chunk", l.Chunk, "node", r.Node, "addr", r.Addr, "err", err)
			errs = append(errs, &NodeError{Op: fmt.Sprintf("read chunk %v", l.Chunk), Addr: r.Addr, Err: err})
		}
		if have {
			c.release(base, dst)
			errs = append(errs, fmt.Errorf("bytes %v of chunk %v fail their checksums on every replica at version %d", base.bad, l.Chunk, base.version))
		}
		if !busy || time.Now().After(deadline) {
			return piece{}, fmt.Errorf("no replica of chunk %v could be read: %w", l.Chunk, oneLine(errs))
		}
		select {
		case <-ctx.Done():
			return piece{}, ctx.Err()
		case <-time.After(backoff + rand.N(backoff)):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// release gives back a piece's buffer (none when it is the caller's dst).
func (c *Client) release(p piece, dst []byte) {
	if dst == nil && p.region != nil {
		c.bufs.put(p.region)
	}
}

// patch reads base's bad bytes from replica r and puts those that pass
// their checksums there into base, leaving in base.bad what is still
// missing. Only a replica at base's version and length can stand in.
func (c *Client) patch(ctx context.Context, r metaapi.Replica, l *metaapi.ChunkLayout, base *piece) error {
	var still extent.List
	for _, e := range base.bad {
		q, err := c.readCopy(ctx, r, l, e.Off, e.Len, nil, true)
		if err != nil {
			return err
		}
		if q.version != base.version || q.length != base.length {
			c.bufs.put(q.region)
			return fmt.Errorf("at version %d (%d bytes), the rest of the read is from version %d (%d bytes)", q.version, q.length, base.version, base.length)
		}
		for _, s := range extent.Segments(e.Off, e.Len, []extent.List{q.bad}, nil) {
			if len(s.Good) == 0 {
				still = still.Add(s.Off, s.Len)
				continue
			}
			copy(base.data[s.Off-base.off:s.End()-base.off], q.data[s.Off-e.Off:])
		}
		c.bufs.put(q.region)
	}
	base.bad = still
	return nil
}

// errStale: the replica has not seen the last committed write.
var errStale = errors.New("replica is stale")

// readReplica reads [off, off+n) of l from replica r, every block intact.
func (c *Client) readReplica(ctx context.Context, r metaapi.Replica, l *metaapi.ChunkLayout, off, n int64, dst []byte) (piece, error) {
	return c.readCopy(ctx, r, l, off, n, dst, false)
}

// readCopy reads [off, off+n) of l from replica r. Blocks that fail their
// checksums are reported to meta; with partial their bytes are listed in
// the piece's bad (the rest is good), else the read fails.
func (c *Client) readCopy(ctx context.Context, r metaapi.Replica, l *metaapi.ChunkLayout, off, n int64, dst []byte, partial bool) (piece, error) {
	var region *fabric.Region
	if dst != nil {
		// Registered for this read only: no node can write into the
		// caller's memory outside it.
		region = c.bufs.ep.Register(dst, fabric.RemoteWrite)
	} else {
		region = c.bufs.get()
	}
	ok := false
	defer func() {
		if dst != nil {
			c.bufs.ep.Deregister(region)
		} else if !ok {
			c.bufs.put(region)
		}
	}()
	hdr, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: l.Chunk, Off: uint64(off), Len: uint64(n), RegionKey: region.Key(), Cap: l.Cap})
	if err != nil {
		return piece{}, err
	}
	rep, err := parseReply(exchange.Do(ctx, c.pool, r.Addr, replyTimeout, hdr))
	if err != nil {
		return piece{}, err
	}
	data, bad, err := c.checkRead(r, l, &rep, region.Bytes(), off, n, partial)
	if err != nil {
		return piece{}, err
	}
	if len(bad) == 0 {
		c.learnExport(r, l, &rep)
		c.keepBlocks(l, rep.Version, off, data, int64(rep.ChunkLen))
	}
	ok = true
	return piece{region: region, data: data, off: off, version: rep.Version, length: int64(rep.ChunkLen), bad: bad}, nil
}

// checkRead judges replica r's reply rep to a read of [off, off+n) of l
// whose data was placed in buf from the reply's DataOff: the replica
// must be at the layout's version or later, and every block must pass
// its checksum (with partial, failing bytes are returned in bad instead).
// It returns the requested bytes, aliasing buf.
func (c *Client) checkRead(r metaapi.Replica, l *metaapi.ChunkLayout, rep *wire.Reply, buf []byte, off, n int64, partial bool) ([]byte, extent.List, error) {
	if rep.Version < l.Version {
		// A member behind meta's record (it lost its copy, or missed a
		// write) needs reconciling as much as a corrupt one: report it
		// bad throughout.
		c.reportCorrupt(l, r.Node, rep.Version, nil)
		return nil, nil, fmt.Errorf("%w: at version %d, the last committed write is %d", errStale, rep.Version, l.Version)
	}
	data, bad, err := rep.ReadData(buf, off, n)
	if err != nil {
		return nil, nil, err
	}
	if l.ZeroFrom > 0 && off+n > l.ZeroFrom {
		// Bytes past a truncation point inside this chunk are stale.
		clear(data[max(0, l.ZeroFrom-off):])
		bad = bad.Clip(off, l.ZeroFrom-off)
	}
	if len(bad) > 0 {
		c.reportCorrupt(l, r.Node, rep.Version, bad)
		if !partial {
			return nil, nil, fmt.Errorf("bytes %v fail their checksums", bad)
		}
	}
	return data, bad, nil
}

// reportWindow is how long a client stays quiet about a copy it has
// reported corrupt: meta heals it within seconds, and a reader meeting the
// same bad block again and again need not say so each time.
const reportWindow = 30 * time.Second

// reports remembers the copies a client reported lately.
type reports struct {
	mu       sync.Mutex
	sent     map[reportKey]time.Time
	inflight sync.WaitGroup
}

// reportFlush bounds how long Close waits for reports in flight.
const reportFlush = 5 * time.Second

// flush waits up to d for the reports in flight.
func (r *reports) flush(d time.Duration) {
	done := make(chan struct{})
	go func() { r.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

type reportKey struct {
	chunk ids.ChunkID
	node  ids.NodeID
}

// maxRecentReports bounds what a client remembers of its reports.
const maxRecentReports = 1024

// due reports whether k has not been reported within the window, and
// notes that it is being reported now.
func (r *reports) due(k reportKey, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.sent[k]; ok && now.Sub(t) < reportWindow {
		return false
	}
	if r.sent == nil || len(r.sent) >= maxRecentReports {
		r.sent = map[reportKey]time.Time{}
	}
	r.sent[k] = now
	return true
}

// reportCorrupt tells meta, in the background, that node's copy of l's
// chunk at version holds the bad bytes (nil: it is bad throughout, or
// behind); the layout's read capability proves the client may say so.
func (c *Client) reportCorrupt(l *metaapi.ChunkLayout, node ids.NodeID, version uint64, bad extent.List) {
	c.log.Debug("read blocks failing their checksums; reading them from another copy and reporting", "chunk", l.Chunk, "node", node, "version", version, "bad", bad)
	if !c.reported.due(reportKey{l.Chunk, node}, time.Now()) {
		return
	}
	if len(bad) > metaapi.MaxBadExtents {
		bad = nil
	}
	req := metaapi.ReportCorruptReq{Cap: l.Cap, Copy: metaapi.CorruptCopy{Chunk: l.Chunk, Node: node, Version: version, Bad: bad}}
	c.reported.inflight.Add(1)
	go func() {
		defer c.reported.inflight.Done()
		ctx, cancel := context.WithTimeout(context.Background(), reportFlush)
		defer cancel()
		if err := c.meta.Call(ctx, metaapi.OpReportBad, req, nil); err != nil {
			c.log.Warn("reporting a corrupt copy to meta", "chunk", l.Chunk, "node", node, "err", err)
		}
	}()
}
