package sdk

import (
	"context"
	"errors"
	"time"

	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/regionmac"
	"github.com/sluicefs/sluice/internal/wire"
)

// The client's side of optimistic reads (issue 19, seed 004's ODAFS),
// on when Options.ODAFS is set: read replies from nodes with an exported
// cache carry references to the read's blocks (learnExport); a later
// small read of blocks the client holds references to reads each with
// one optimistic one-sided READ — the slot, then its generation read
// after it (fabric.Conn.ReadOptimistic) — and no request for the node's
// engine to serve (readOptimistic). Anything that
// does not check out (a slot refilled, a node restarted or no longer
// holding the chunk, an older version than the layout's) falls back to
// the read request, whose reply brings fresh references.

// maxOptimistic bounds the reads tried optimistically.
const maxOptimistic = 64 << 10

// learnExport records the references replica r's reply rep carried.
func (c *Client) learnExport(r metaapi.Replica, l *metaapi.ChunkLayout, rep *wire.Reply) {
	x := &rep.Export
	if c.od == nil || x.Block == 0 || int(x.Block) != c.od.Options().BlockSize {
		return
	}
	eb := uint64(x.Block)
	for i, ref := range x.List {
		b := x.First + uint64(i)
		if b*eb >= rep.ChunkLen {
			break
		}
		n := min(eb, rep.ChunkLen-b*eb)
		c.od.Learn(odafs.BlockID{Chunk: l.Chunk, Block: b}, odafs.Ref{Node: r.Node, Epoch: x.Epoch, Region: x.Region, Key: ref.Key,
			Ref: expcache.Ref{Slot: ref.Slot, Gen: ref.Gen, Chunk: l.Chunk, Block: b, Version: rep.Version, Len: uint32(n)}})
	}
}

// keepBlocks puts the whole export blocks of data, chunk l's bytes from
// off at version (as a read request returned them), in the client's
// block cache, if it has one.
func (c *Client) keepBlocks(l *metaapi.ChunkLayout, version uint64, off int64, data []byte, chunkLen int64) {
	if c.od == nil || c.od.Options().CacheBytes <= 0 {
		return
	}
	eb := int64(c.od.Options().BlockSize)
	for b := (off + eb - 1) / eb; ; b++ {
		lo, hi := b*eb, min((b+1)*eb, chunkLen)
		if lo >= hi || hi > off+int64(len(data)) {
			return
		}
		c.od.Keep(odafs.BlockID{Chunk: l.Chunk, Block: uint64(b)}, version, append([]byte(nil), data[lo-off:hi-off]...))
	}
}

// readOptimistic reads [off, off+n) of chunk l from the client's cache
// and through references, if every block it covers is one or the other;
// ok false says to read it by request.
func (c *Client) readOptimistic(ctx context.Context, l *metaapi.ChunkLayout, off, n int64, dst []byte) (p piece, ok bool) {
	if c.od == nil || n <= 0 || n > maxOptimistic {
		return piece{}, false
	}
	eb := int64(c.od.Options().BlockSize)
	members := make([]ids.NodeID, len(l.Replicas))
	for i, r := range l.Replicas {
		members[i] = r.Node
	}
	var out []byte
	var region *fabric.Region // the pool's, until handed over in p
	if dst != nil {
		out = dst[:n]
	} else {
		region = c.bufs.get()
		out = region.Bytes()[:n]
	}
	defer func() {
		// Not p.region: a return of piece{} has cleared it before this
		// runs (a buffer leaked per read that fell back, once).
		if !ok && region != nil {
			c.bufs.put(region)
		}
	}()
	sp := c.slots.Get().(*[]byte)
	defer c.slots.Put(sp)
	if int64(cap(*sp)) < expcache.HeaderSize+eb {
		*sp = make([]byte, expcache.HeaderSize+eb)
	}
	slot := (*sp)[:expcache.HeaderSize+eb]
	keep := c.od.Options().CacheBytes > 0
	for b := off / eb; b*eb < off+n; b++ {
		id := odafs.BlockID{Chunk: l.Chunk, Block: uint64(b)}
		path, data, ref := c.od.Plan(id, int(eb), l.Version, members)
		switch path {
		case odafs.Hit:
		case odafs.Optimistic:
			var err error
			if data, err = c.fetchSlot(ctx, l, id, ref, slot, members); err != nil {
				c.log.Debug("optimistic read fell back to a request", "chunk", l.Chunk, "block", b, "node", ref.Node, "err", err)
				c.odFallbacks.Add(1)
				return piece{}, false
			}
			if keep {
				c.od.Keep(id, ref.Version, append([]byte(nil), data...))
			}
		default:
			return piece{}, false
		}
		lo, hi := max(off, b*eb), min(off+n, (b+1)*eb)
		k := copy(out[lo-off:hi-off], data[min(int64(len(data)), lo-b*eb):])
		clear(out[lo-off+int64(k) : hi-off]) // past the chunk's end
	}
	c.odReads.Add(1)
	p.region, p.data, p.off, p.version = region, out, off, l.Version
	return p, true
}

// fetchSlot reads ref's slot, then its generation, with one-sided reads
// from the node, and returns the block if the copy is the fill ref names
// (odafs.Accept), aliasing slot.
func (c *Client) fetchSlot(ctx context.Context, l *metaapi.ChunkLayout, id odafs.BlockID, ref odafs.Ref, slot []byte, members []ids.NodeID) ([]byte, error) {
	var addr string
	for _, r := range l.Replicas {
		if r.Node == ref.Node {
			addr = r.Addr
		}
	}
	eb := c.od.Options().BlockSize
	pc, err := c.pool.Get(ctx, addr)
	if err != nil {
		return nil, err
	}
	// One round trip: the slot, then its generation read after it; a
	// refusal (a stale region key, a node restarted) is this read's alone.
	// Signed with the reference's key: the node serves only the fill it
	// names. A reference without one is to this client's own cache in
	// shared memory, which it copies itself.
	off := uint64(ref.Off(eb))
	var auth []byte
	if ref.Key != ([16]byte{}) {
		a := regionmac.NewAuth(ref.Key[:], ref.Region, off, uint32(len(slot)), ref.Gen, time.Now().UnixNano())
		var ab [regionmac.AuthSize]byte
		auth = a.Append(ab[:0])
	}
	gen, err := pc.ReadOptimistic(ctx, ref.Region, off, slot, uint64(ref.GenOff(eb)), auth)
	var re *fabric.RemoteError
	switch {
	case errors.As(err, &re):
		c.pool.Put(pc)
		c.od.Forget(id)
		return nil, err
	case err != nil:
		pc.Close()
		c.od.Forget(id)
		return nil, err
	}
	c.pool.Put(pc)
	return c.od.Accept(id, ref, slot, gen, c.od.Epoch(ref.Node), l.Version, members)
}
