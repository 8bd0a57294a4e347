package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/wire"
)

// BatchRead is one read of a batch (Batcher.Read): len(Dst) bytes at
// file offset Off of File.
type BatchRead struct {
	File *File
	Off  int64
	Dst  []byte
	// Region, if set, is registered memory (RegisterBuffer) holding Dst
	// at RegionOff: pieces aligned to the node's blocks are placed there
	// by the node itself; the rest land in a staging buffer and are
	// copied after their checksums pass.
	Region    *fabric.Region
	RegionOff uint64

	// N is the bytes read (fewer than len(Dst) only at the end of the
	// file, with Err io.EOF); Err what went wrong.
	N   int
	Err error
}

// Batcher sends reads in batches: the pieces of many reads that go to
// one node travel as one request (wire.ParseBatch), which the node
// answers once, after placing every piece with one-sided WRITEs. A piece
// the batch could not serve (a refused or failed descriptor, a node that
// did not answer, a stale or corrupt copy) is read again on its own by
// the single read path, which tries the other replicas. Erasure-coded
// files are read by the single path throughout.
type Batcher struct {
	c  *Client
	bs sync.Map // node address → its block size, from its replies

	requests, reads, direct, singles atomic.Uint64
}

// BatchStats count what a Batcher did.
type BatchStats struct {
	// Requests are the batch requests sent, Reads the pieces they carried
	// (Direct of them placed in the caller's own memory); Singles the
	// pieces read by the single read path instead.
	Requests, Reads, Direct, Singles uint64
}

// NewBatcher returns a Batcher over c.
func (c *Client) NewBatcher() *Batcher { return &Batcher{c: c} }

// Stats returns the batcher's counters.
func (b *Batcher) Stats() BatchStats {
	return BatchStats{Requests: b.requests.Load(), Reads: b.reads.Load(), Direct: b.direct.Load(), Singles: b.singles.Load()}
}

// RegisterBuffer registers buf with the client's fabric endpoint so that
// nodes may place read data in it (and nothing else): the region's key
// goes into read requests. Deregister it when done.
func (c *Client) RegisterBuffer(buf []byte) *fabric.Region {
	return c.ep.Register(buf, fabric.RemoteWrite)
}

// DeregisterBuffer revokes r; it returns once no placement into it is
// under way.
func (c *Client) DeregisterBuffer(r *fabric.Region) { c.ep.Deregister(r) }

// guessBlock is the block size assumed for a node not heard from yet; a
// node with larger blocks refuses the piece, says its size, and the piece
// is read on its own.
const guessBlock = 64 << 10

// batchPiece is one chunk's part of a read.
type batchPiece struct {
	idx      int // of the read
	read     *BatchRead
	s        span // file range
	chunkOff int64
	dst      []byte
	l        metaapi.ChunkLayout
	replica  int
	desc     wire.BatchRead
	direct   bool
	err      error
}

// Read performs reads, setting each one's N and Err, and calls done (if
// not nil) with a read's index as soon as that read is complete: the
// reads one request carries complete together, in their order, without
// waiting for the other requests. done may run on any goroutine. Read
// returns when every read is complete.
func (b *Batcher) Read(ctx context.Context, reads []BatchRead, done func(i int)) {
	c := b.c
	byNode := map[string][]*batchPiece{}
	var nodes []string
	var singles, now []*batchPiece
	left := make([]int32, len(reads)) // pieces not complete, per read
	var mu sync.Mutex                 // over the reads' Err
	complete := func(i int) {
		if rd := &reads[i]; rd.Err == nil && rd.N < len(rd.Dst) {
			rd.Err = io.EOF
		}
		if done != nil {
			done(i)
		}
	}
	finish := func(p *batchPiece) {
		mu.Lock()
		rd := &reads[p.idx]
		if p.err != nil && rd.Err == nil {
			rd.N, rd.Err = 0, pathErr("read", rd.File.path, p.err)
		}
		left[p.idx]--
		last := left[p.idx] == 0
		mu.Unlock()
		if last {
			complete(p.idx)
		}
	}
	var empty []int
	for i := range reads {
		rd := &reads[i]
		rd.N, rd.Err = 0, nil
		a := rd.File.Attr()
		if rd.Off < 0 {
			rd.Err = pathErr("read", rd.File.path, metaapi.Errorf(metaapi.EINVAL, "negative offset"))
			empty = append(empty, i)
			continue
		}
		n := min(int64(len(rd.Dst)), a.Size-rd.Off)
		if n <= 0 {
			empty = append(empty, i)
			continue
		}
		rd.N = int(n)
		_, ec := ecGeomOf(&a)
		for _, s := range c.split(a.ChunkSize, rd.Off, n) {
			p := &batchPiece{idx: i, read: rd, s: s, chunkOff: s.off % a.ChunkSize, dst: rd.Dst[s.off-rd.Off:][:s.n]}
			left[i]++
			if ec {
				singles = append(singles, p)
				continue
			}
			ls, _, err := c.chunkLayouts(ctx, a.Ino, a.ChunkSize, s.off, s.n, false)
			if err != nil {
				p.err = err
				now = append(now, p)
				continue
			}
			l, ok := ls[s.off/a.ChunkSize]
			if !ok {
				clear(p.dst) // a hole
				now = append(now, p)
				continue
			}
			p.l = l
			p.replica = int(uint64(l.Chunk) % uint64(len(l.Replicas)))
			addr := l.Replicas[p.replica].Addr
			if byNode[addr] == nil {
				nodes = append(nodes, addr)
			}
			byNode[addr] = append(byNode[addr], p)
		}
	}
	for _, i := range empty {
		complete(i)
	}
	for _, p := range now {
		finish(p)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, c.opts.Parallel)
	for _, addr := range nodes {
		for _, ps := range b.plan(addr, byNode[addr]) {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				b.send(ctx, addr, ps)
				for _, p := range ps {
					if p.err != nil {
						b.single(ctx, p)
					}
					finish(p)
				}
			}()
		}
	}
	for _, p := range singles {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			b.single(ctx, p)
			finish(p)
		}()
	}
	wg.Wait()
}

// single reads p by the single read path, from another replica first.
func (b *Batcher) single(ctx context.Context, p *batchPiece) {
	b.singles.Add(1)
	p.err = p.read.File.readPiece(ctx, p.s, p.replica+1, func(d []byte) { copy(p.dst, d) })
}

// blockSize is what node addr's blocks are known (or guessed) to be.
func (b *Batcher) blockSize(addr string) (int64, bool) {
	if v, ok := b.bs.Load(addr); ok {
		return v.(int64), true
	}
	return guessBlock, false
}

// plan cuts one node's pieces into requests within the batch bounds: the
// count, the node's answer within one packet (counting checksums with
// the smallest block a node may use), the read request size, and the
// staging buffer. Each piece gets its descriptor, minus capability and
// staging region.
func (b *Batcher) plan(addr string, ps []*batchPiece) [][]*batchPiece {
	c := b.c
	bs, known := b.blockSize(addr)
	const minBS = wire.MinBlockSize
	var out [][]*batchPiece
	var cur []*batchPiece
	var blocks []int
	var total, staged int64
	for _, p := range ps {
		off, n := p.chunkOff, p.s.n
		p.desc = wire.BatchRead{Chunk: p.l.Chunk, Off: uint64(off), Len: uint32(n)}
		rd := p.read
		p.direct = rd.Region != nil && known && off%bs == 0 && n%bs == 0
		var window int64
		if p.direct {
			window = n
			p.desc.RegionKey, p.desc.RegionOff = rd.Region.Key(), rd.RegionOff+uint64(p.s.off-rd.Off)
		} else {
			window = (off+n+bs-1)/bs*bs - off/bs*bs
			p.desc.RegionOff = uint64(staged) // in the request's staging buffer
		}
		p.desc.Window = uint32(window)
		nb := int((off+n+minBS-1)/minBS - off/minBS)
		fits := len(cur) < wire.MaxBatch && total+n <= int64(c.opts.ReadReq) &&
			wire.BatchReplySize(append(blocks, nb)) <= c.opts.MTU && (p.direct || staged+window <= int64(c.bufs.size))
		if !fits && len(cur) > 0 {
			out = append(out, cur)
			cur, blocks, total, staged = nil, nil, 0, 0
			if !p.direct {
				p.desc.RegionOff = 0
			}
		}
		cur = append(cur, p)
		blocks = append(blocks, nb)
		total += n
		if !p.direct {
			staged += window
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// send sends one planned batch to addr and judges each piece's answer;
// a piece that fails keeps its error (for the single path).
func (b *Batcher) send(ctx context.Context, addr string, ps []*batchPiece) {
	c := b.c
	stage := c.bufs.get()
	defer c.bufs.put(stage)
	descs := make([]wire.BatchRead, len(ps))
	var caps [][]byte
	capOf := map[ids.ChunkID]uint16{}
	for i, p := range ps {
		d := p.desc
		if !p.direct {
			d.RegionKey = stage.Key()
		}
		j, ok := capOf[d.Chunk]
		if !ok {
			j = uint16(len(caps))
			capOf[d.Chunk] = j
			caps = append(caps, p.l.Cap)
		}
		d.Cap = j
		descs[i] = d
	}
	fail := func(err error) {
		for _, p := range ps {
			p.err = &NodeError{Op: "batched read", Addr: addr, Err: err}
		}
	}
	if err := ctx.Err(); err != nil {
		fail(err)
		return
	}
	hdr, err := wire.AppendBatch(nil, descs, caps)
	if err != nil {
		fail(err)
		return
	}
	b.requests.Add(1)
	b.reads.Add(uint64(len(ps)))
	pk, err := exchange.Do(ctx, c.pool, addr, replyTimeout, hdr)
	if err != nil {
		fail(err)
		return
	}
	defer pk.Release()
	if len(pk.Data) > 0 && wire.Op(pk.Data[0]) == wire.OpReply {
		// The whole batch was refused.
		var r wire.Reply
		if err := wire.ParseReply(pk.Data, &r); err != nil {
			fail(err)
		} else if err := r.Err(); err != nil {
			fail(err)
		} else {
			fail(errors.New("a plain OK reply to a batch"))
		}
		return
	}
	err = wire.ParseBatchReply(pk.Data, len(ps), func(i int, r *wire.Reply) error {
		ps[i].err = b.accept(addr, ps[i], &descs[i], stage, r)
		return nil
	})
	if err != nil {
		fail(err)
	}
}

// accept judges one piece's answer and puts its bytes in place.
func (b *Batcher) accept(addr string, p *batchPiece, d *wire.BatchRead, stage *fabric.Region, r *wire.Reply) error {
	bs := int64(r.BlockSize)
	validBS := bs >= wire.MinBlockSize && bs <= wire.MaxBlockSize && bs&(bs-1) == 0
	if validBS {
		b.bs.Store(addr, bs)
	}
	if err := r.Err(); err != nil {
		return err
	}
	var buf []byte
	if p.direct {
		buf = p.read.Region.Bytes()
	} else {
		buf = stage.Bytes()
	}
	if d.RegionOff+uint64(d.Window) > uint64(len(buf)) {
		return fmt.Errorf("region window [%d, +%d) outside the %d-byte region", d.RegionOff, d.Window, len(buf))
	}
	buf = buf[d.RegionOff : d.RegionOff+uint64(d.Window)]
	data, _, err := b.c.checkRead(p.l.Replicas[p.replica], &p.l, r, buf, p.chunkOff, p.s.n, false)
	if err != nil {
		return err
	}
	if p.direct {
		if &data[0] != &p.dst[0] {
			return fmt.Errorf("direct placement landed at the wrong place (region offset %d)", d.RegionOff)
		}
		b.direct.Add(1)
	} else {
		copy(p.dst, data)
	}
	return nil
}
