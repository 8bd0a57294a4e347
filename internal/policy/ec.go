package policy

import (
	"sync"

	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// Erasure-coded writes (seed 000 §V-C "sPIN-TriEC", seed 003). A stripe
// group is one chunk id on K+M nodes: units 0..K-1 hold data, K..K+M-1
// parity. Like a flat write, the client reserves the group's next version
// at unit 0 and writes every data unit itself with it. Then, by mode:
//
//   - central: the client encodes and writes the parity units too;
//   - streaming (FlagEncode, stream mode): each data unit's node stores
//     every packet and at once sends, for each parity unit, the packet
//     times its generator-matrix coefficient (its partial parity) — the
//     per-packet path, no buffering;
//   - per-chunk (FlagEncode, host mode): the data unit's node receives the
//     whole unit first, then computes and sends its partial parities (the
//     INEC-TriEC baseline).
//
// A parity unit's node XORs the K partial parities of the same write and
// offset in a bounded pool of accumulator slots (aggregation); when the
// pool is empty, slots come from host memory instead (counted), and only
// when that budget is spent too is the write refused busy. It stores each
// slot once all K partials have arrived, commits when every byte has, and
// only then acknowledges the K data units — which publish and acknowledge
// the client only after every parity unit has. So the client's OK means
// all K+M units of the stripe are durable.

// ---- parity units: aggregation ----

// parityWrites is the context of a partial parity arriving at a parity
// unit (FlagPartial, from a data unit's node): it joins its write's
// aggregation, XORs every packet into the accumulator slots, and waits
// for the aggregation's verdict.
type parityWrites struct{ *writer }

// partialState is one data unit's partial parity being aggregated.
type partialState struct {
	agg    *aggregation
	src    uint8 // the data unit it comes from
	length int64
}

func (x parityWrites) header(r *engine.Request, hdr []byte) error {
	h, c, _, err := x.admitStream(hdr)
	if err != nil {
		return err
	}
	agg, err := x.join(&h, int(c.Data), c.Client, c.Epoch)
	if err != nil {
		return err
	}
	r.State = &partialState{agg: agg, src: h.Src, length: int64(h.Len)}
	return nil
}

func (x parityWrites) payload(r *engine.Request, p *fabric.Packet) error {
	st := r.State.(*partialState)
	if err := inBounds(p, st.length); err != nil {
		return err
	}
	x.aggs.Accumulated.Add(int64(len(p.Data)))
	return st.agg.add(p.Off, p.Data)
}

func (parityWrites) completion(r *engine.Request) {
	st := r.State.(*partialState)
	st.agg.complete(st.src, r)
}

func (parityWrites) cleanup(r *engine.Request, reason error) {
	r.State.(*partialState).agg.fail(reason)
}

// accSlot is the size of one accumulator slot.
const accSlot = 64 << 10

// Bounds on parity aggregation: writes aggregated at once, in all and per
// client (each holds an open store write), and the slots one write may
// hold (the window between its fastest and slowest data unit).
const (
	maxAggregations          = 1024
	maxAggregationsPerClient = 64
	maxSlotsPerAggregation   = 256
)

type aggKey struct {
	chunk   ids.ChunkID
	version uint64
}

// aggregations is a parity node's set of writes being aggregated and its
// accumulator pool.
type aggregations struct {
	mu       sync.Mutex
	m        map[aggKey]*aggregation
	byClient map[ids.ClientID]int
	// slots is the accumulator pool: fixed buffers, taken without waiting.
	slots chan *slot
	// Fallbacks counts slots taken from host memory because the pool was
	// empty; Accumulated counts partial-parity bytes XORed.
	Fallbacks   atomic.Int64
	Accumulated atomic.Int64
}

func newAggregations(n int) *aggregations {
	a := &aggregations{m: map[aggKey]*aggregation{}, byClient: map[ids.ClientID]int{}, slots: make(chan *slot, n)}
	for range n {
		a.slots <- &slot{buf: make([]byte, accSlot)}
	}
	return a
}

// aggregation is one write's parity being assembled from K partials.
type aggregation struct {
	x      *writer
	key    aggKey
	k      int
	client ids.ClientID
	epoch  uint64 // the capability's, of the data unit that opened it

	mu      sync.Mutex
	w       *store.Write
	off     int64 // chunk offset of the write
	length  int64
	base    uint64
	writeID uint64
	joined  uint64 // bit per data unit whose partial has begun
	done    uint64 // bit per data unit whose partial is all in
	waiting []*engine.Request
	slots   map[int64]*slot
	placed  int64
	err     error // set once failed
	ended   bool  // finished or failed
	timer   *time.Timer
	// ready is closed once the store write is open (w set) or failed to
	// open (openErr set).
	ready   chan struct{}
	openErr error
}

type slot struct {
	buf     []byte
	got     int64
	charged int64 // host memory charged (a fallback slot)
}

// join admits data unit h.Src's partial parity: into the aggregation of
// its write if one is open, else a new one (opening the store write).
func (x *writer) join(h *wire.WriteHeader, k int, client ids.ClientID, epoch uint64) (*aggregation, error) {
	a := x.aggs
	key := aggKey{h.Chunk, h.Version}
	a.mu.Lock()
	if g := a.m[key]; g != nil {
		a.mu.Unlock()
		return g.admit(h)
	}
	switch {
	case len(a.m) >= maxAggregations:
		a.mu.Unlock()
		return nil, wire.Errorf(wire.StatusBusy, "too many parity aggregations in progress")
	case a.byClient[client] >= maxAggregationsPerClient:
		a.mu.Unlock()
		return nil, wire.Errorf(wire.StatusBusy, "client %v has %d parity aggregations in progress already", client, maxAggregationsPerClient)
	}
	g := &aggregation{x: x, key: key, k: k, client: client, epoch: epoch, off: int64(h.Off), length: int64(h.Len), base: h.Base, writeID: h.WriteID,
		joined: 1 << h.Src, slots: map[int64]*slot{}, ready: make(chan struct{})}
	a.m[key] = g
	a.byClient[client]++
	a.mu.Unlock()
	// Opening the store write (which may zero a gap first) holds no lock
	// another write needs; the other data units' partials wait for it.
	if err := g.open(h); err != nil {
		return nil, err
	}
	return g, nil
}

// open opens the parity's store write and starts the aggregation's timer;
// on failure the aggregation is dropped and its waiters told why.
func (g *aggregation) open(h *wire.WriteHeader) error {
	x := g.x
	var err error
	if info, serr := x.d.Store.Stat(h.Chunk); serr == nil && info.Version < h.Base {
		err = wire.Errorf(wire.StatusBusy, "chunk %v is at version %d, write %d must wait for %d", h.Chunk, info.Version, h.Version, h.Base)
	}
	var w *store.Write
	if err == nil {
		if w, err = x.d.Store.BeginFollow(h.Chunk, int64(h.Off), int64(h.Len), h.Version, h.Base); err != nil {
			err = storeError(err)
		} else if err = planned(w, g.epoch); err != nil {
			w = nil
		} else {
			w.SetTag(h.WriteID)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	defer close(g.ready)
	if err != nil {
		g.openErr, g.ended = err, true
		x.aggs.remove(g)
		return err
	}
	g.w = w
	// Every data unit sends its header at once; one that has not within
	// the join timeout is not coming (its node died, or it was refused):
	// busy, so the client starts the whole write over. Once all have, the
	// write has the reply timeout to finish.
	g.timer = time.AfterFunc(x.d.JoinTimeout, func() {
		g.mu.Lock()
		missing := g.joined != 1<<g.k-1
		g.mu.Unlock()
		if missing {
			g.fail(wire.Errorf(wire.StatusBusy, "only some of the %d data units' partial parities arrived within %s", g.k, x.d.JoinTimeout))
			return
		}
		g.mu.Lock()
		if !g.ended {
			g.timer.Reset(x.d.ReplyTimeout)
		}
		g.mu.Unlock()
	})
	return nil
}

// admit joins data unit h.Src's partial parity to an aggregation another
// data unit's partial opened, once its store write is open.
func (g *aggregation) admit(h *wire.WriteHeader) (*aggregation, error) {
	select {
	case <-g.ready:
	case <-time.After(g.x.d.JoinTimeout):
		return nil, wire.Errorf(wire.StatusBusy, "parity of chunk %v version %d is still opening", h.Chunk, h.Version)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch bit := uint64(1) << h.Src; {
	case g.openErr != nil:
		return nil, g.openErr
	case g.ended:
		return nil, wire.Errorf(wire.StatusBusy, "parity of chunk %v version %d is ending", h.Chunk, h.Version)
	case g.off != int64(h.Off) || g.length != int64(h.Len) || g.base != h.Base || g.writeID != h.WriteID:
		return nil, wire.Errorf(wire.StatusBadRequest, "partial parity [%d,+%d) of write %x does not match the one being aggregated for chunk %v version %d ([%d,+%d) of %x)",
			h.Off, h.Len, h.WriteID, h.Chunk, h.Version, g.off, g.length, g.writeID)
	case g.joined&bit != 0:
		return nil, wire.Errorf(wire.StatusBadRequest, "partial parity from data unit %d of chunk %v version %d arrived twice (counted once)", h.Src, h.Chunk, h.Version)
	default:
		g.joined |= bit
	}
	return g, nil
}

// add XORs a partial-parity packet at write offset off into the slots,
// storing each slot that is complete.
func (g *aggregation) add(off int64, data []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return g.err
	}
	for len(data) > 0 {
		idx := off / accSlot
		so := off % accSlot
		n := min(int64(len(data)), accSlot-so)
		s := g.slots[idx]
		if s == nil && len(g.slots) >= maxSlotsPerAggregation {
			err := wire.Errorf(wire.StatusBusy, "parity of chunk %v: data units more than %d slots apart", g.key.chunk, maxSlotsPerAggregation)
			g.failLocked(err)
			return err
		}
		if s == nil {
			var err error
			if s, err = g.newSlot(idx); err != nil {
				g.failLocked(err)
				return err
			}
			g.slots[idx] = s
		}
		erasure.XOR(s.buf[so:so+n], data[:n])
		s.got += n
		if l := g.slotLen(idx); s.got == int64(g.k)*l {
			if err := g.w.Place(g.off+idx*accSlot, s.buf[:l]); err != nil {
				err = storeError(err)
				g.failLocked(err)
				return err
			}
			g.placed += l
			g.freeSlot(s)
			delete(g.slots, idx)
		}
		off += n
		data = data[n:]
	}
	return nil
}

func (g *aggregation) slotLen(idx int64) int64 { return min(accSlot, g.length-idx*accSlot) }

// newSlot takes a zeroed slot from the pool, or from host memory when the
// pool is empty (the fallback; refused busy only when that budget is
// spent too).
func (g *aggregation) newSlot(idx int64) (*slot, error) {
	l := g.slotLen(idx)
	select {
	case s := <-g.x.aggs.slots: // pooled: no allocation
		clear(s.buf[:l])
		s.got = 0
		return s, nil
	default:
	}
	charge := int64(1) << sizeClass(int(l))
	if g.x.hostBytes.Add(charge) > g.x.d.HostBuffer {
		g.x.hostBytes.Add(-charge)
		return nil, wire.Errorf(wire.StatusBusy, "parity accumulators and host buffers are full")
	}
	g.x.aggs.Fallbacks.Add(1)
	b := g.x.hostBufs.get(int(l))
	clear(b)
	return &slot{buf: b, charged: charge}, nil
}

func (g *aggregation) freeSlot(s *slot) {
	if s.charged > 0 {
		g.x.hostBufs.put(s.buf)
		g.x.hostBytes.Add(-s.charged)
		return
	}
	g.x.aggs.slots <- s
}

// complete records that data unit src's partial is all in; the request
// waits for the aggregation's verdict. The last one commits.
func (g *aggregation) complete(src uint8, r *engine.Request) {
	g.mu.Lock()
	if g.err != nil {
		err := g.err
		g.mu.Unlock()
		r.Finish(wire.AppendError(nil, err))
		return
	}
	g.done |= 1 << src
	g.waiting = append(g.waiting, r)
	last := g.done == 1<<g.k-1
	if last {
		g.ended = true
		g.timer.Stop()
	}
	g.mu.Unlock()
	if last {
		g.x.background(g.finish)
	}
}

// finish syncs and commits the parity, then answers every data unit.
func (g *aggregation) finish() {
	g.x.aggs.remove(g)
	var reply []byte
	switch {
	case g.placed != g.length:
		g.mu.Lock()
		for _, s := range g.slots {
			g.freeSlot(s)
		}
		clear(g.slots)
		g.mu.Unlock()
		g.w.Abort()
		reply = wire.AppendError(nil, wire.Errorf(wire.StatusBadRequest, "parity of chunk %v: %d of %d bytes aggregated", g.key.chunk, g.placed, g.length))
	default:
		err := g.w.Sync()
		if err == nil {
			var info store.Info
			if info, err = g.w.Commit(); err == nil {
				reply = wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length)}, nil, "")
			}
		} else {
			g.w.Abort()
		}
		if err != nil {
			reply = wire.AppendError(nil, storeError(err))
		}
	}
	g.mu.Lock()
	waiting := g.waiting
	g.waiting = nil
	g.mu.Unlock()
	for _, r := range waiting {
		r.Finish(reply)
	}
}

// fail ends the aggregation: the write is aborted and every data unit
// waiting for it is told why.
func (g *aggregation) fail(err error) {
	g.mu.Lock()
	g.failLocked(err)
	g.mu.Unlock()
}

func (g *aggregation) failLocked(err error) {
	if g.ended || g.w == nil { // ended, or not open yet (open settles it)
		return
	}
	g.ended, g.err = true, err
	g.timer.Stop()
	for _, s := range g.slots {
		g.freeSlot(s)
	}
	clear(g.slots)
	waiting := g.waiting
	g.waiting = nil
	g.x.background(func() {
		g.x.aggs.remove(g)
		g.w.Abort()
		reply := wire.AppendError(nil, err)
		for _, r := range waiting {
			r.Finish(reply)
		}
	})
}

func (a *aggregations) remove(g *aggregation) {
	a.mu.Lock()
	if a.m[g.key] == g {
		delete(a.m, g.key)
		if a.byClient[g.client]--; a.byClient[g.client] <= 0 {
			delete(a.byClient, g.client)
		}
	}
	a.mu.Unlock()
}

// failAll ends every aggregation (node shutdown).
func (a *aggregations) failAll() {
	a.mu.Lock()
	gs := make([]*aggregation, 0, len(a.m))
	for _, g := range a.m {
		gs = append(gs, g)
	}
	a.mu.Unlock()
	for _, g := range gs {
		g.fail(wire.Errorf(wire.StatusBusy, "node shutting down"))
	}
}
