package policy

import (
	"context"
	"sync"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// Host mode is the CPU-centric baseline the seed compares against
// (CPU-Ring, CPU-PBT, and "RPC" for authentication): the node receives the
// whole request into host memory, then validates it, stores it and
// forwards it whole to its children — store-and-forward at every hop.
// It is a real mode (selectable per directory as host-ring / host-tree),
// so it has the same durability and ordering as streaming; it is just
// slower, which is the point of comparing.

// hostWrites is the store-and-forward context (ModeHost).
type hostWrites struct{ *writer }

// hostState is a host-mode request: the header kept for validation after
// the data is in, the buffer the data is received into, and the store
// write it becomes.
type hostState struct {
	stored
	hdr     []byte
	buf     []byte
	got     int64
	charged int64 // bytes charged to the node's host buffer budget
}

func (x hostWrites) header(r *engine.Request, hdr []byte) error {
	var h wire.WriteHeader
	if err := parseWrite(hdr, &h); err != nil {
		return err
	}
	st := &hostState{stored: storedOf(&h)}
	// Store-and-forward validates only once the whole request is in.
	if err := x.hostHeader(st, &h, hdr); err != nil {
		return err
	}
	r.State = st
	return nil
}

func (hostWrites) payload(r *engine.Request, p *fabric.Packet) error {
	st := r.State.(*hostState)
	if err := inBounds(p, st.length); err != nil {
		return err
	}
	st.got += int64(copy(st.buf[p.Off:], p.Data))
	return nil
}

func (x hostWrites) completion(r *engine.Request) {
	st := r.State.(*hostState)
	x.background(func() { x.hostFinish(r, st) })
}

func (x hostWrites) cleanup(r *engine.Request, reason error) { x.releaseHost(r.State.(*hostState)) }

func (x hostWrites) hostHeader(st *hostState, h *wire.WriteHeader, raw []byte) error {
	ec := h.Strategy == plan.EC && h.Flags&wire.FlagEncode != 0
	if !ec && (h.Flags&^(wire.FlagBase|wire.FlagSealed) != 0 || h.Strategy == plan.Flat || h.Strategy == plan.EC) {
		return wire.Errorf(wire.StatusBadRequest, "store-and-forward writes are ring or tree writes, or erasure-coded data units that encode")
	}
	if h.Len > uint64(x.d.HostBuffer) || int64(1)<<sizeClass(int(h.Len)) > max(x.d.HostBuffer, 1) {
		return wire.Errorf(wire.StatusBadRequest, "store-and-forward write of %d bytes, at most %d", h.Len, x.d.HostBuffer)
	}
	// Admission only: a peer without a valid capability must not hold
	// host memory. The baseline still validates the whole request once it
	// is in (hostStore), as a CPU-centric server does.
	var c capability.Capability
	if err := x.check(h, &c); err != nil {
		return err
	}
	// Host memory is bounded: a request that would exceed the budget is
	// refused busy (retryable), never queued. It is charged what its
	// pooled buffer really holds.
	charge := int64(1) << sizeClass(int(h.Len))
	if ec {
		charge *= int64(c.NReplicas-c.Data) + 1 // the unit and its partial parities
	}
	if x.hostBytes.Add(charge) > x.d.HostBuffer {
		x.hostBytes.Add(-charge)
		return wire.Errorf(wire.StatusBusy, "host buffers for store-and-forward writes are full")
	}
	st.hdr, st.buf, st.charged = append([]byte(nil), raw...), x.hostBufs.get(int(h.Len)), charge
	return nil
}

func (x hostWrites) releaseHost(st *hostState) {
	if st.buf != nil {
		x.hostBytes.Add(-st.charged)
		x.hostBufs.put(st.buf)
		st.buf = nil
	}
}

// bufPools pools host buffers by power-of-two size class, as a
// CPU-centric server would keep its receive buffers: the baseline should
// pay for store-and-forward, not for garbage collection.
type bufPools [31]sync.Pool

func sizeClass(n int) int {
	c := 0
	for 1<<c < n {
		c++
	}
	return c
}

func (p *bufPools) get(n int) []byte {
	c := sizeClass(n)
	if c >= len(p) {
		return make([]byte, n)
	}
	if b, ok := p[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<c)
}

func (p *bufPools) put(b []byte) {
	if c := sizeClass(cap(b)); c < len(p) && cap(b) == 1<<c {
		b = b[:cap(b)]
		p[c].Put(&b)
	}
}

// hostFinish validates, stores and forwards a fully received request.
func (x hostWrites) hostFinish(r *engine.Request, st *hostState) {
	defer x.releaseHost(st)
	r.Finish(x.hostStore(st))
}

func (x hostWrites) hostStore(st *hostState) []byte {
	h, c, err := x.admitWrite(st.hdr)
	if err != nil {
		return wire.AppendError(nil, err)
	}
	if st.got != int64(len(st.buf)) {
		return wire.AppendError(nil, wire.Errorf(wire.StatusBadRequest, "received %d of %d bytes", st.got, len(st.buf)))
	}
	if reply, ok := x.alreadyApplied(&h); ok {
		return reply
	}
	kids, err := x.children(&h, &c)
	if err != nil {
		return wire.AppendError(nil, err)
	}
	if h.Strategy == plan.EC {
		return x.hostEncode(st, &h, &c)
	}
	var w *store.Write
	if h.Version == 0 {
		w, err = x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID)
		st.head = true
	} else {
		w, err = x.d.Store.BeginFollow(h.Chunk, int64(h.Off), int64(h.Len), h.Version, h.Base)
	}
	if err != nil {
		return wire.AppendError(nil, storeError(err))
	}
	if err := planned(w, c.Epoch); err != nil {
		return wire.AppendError(nil, err)
	}
	st.w = w
	w.SetTag(h.WriteID)
	if len(st.buf) > 0 {
		if err := w.Place(int64(h.Off), st.buf); err != nil {
			w.Abort()
			return wire.AppendError(nil, storeError(err))
		}
	}
	// Forward the whole request to every child while this copy syncs.
	errs := make([]error, len(kids))
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = x.sendWhole(k, x.forwardHeader(&h, k, w), st.buf)
		}()
	}
	err = w.Sync()
	if err != nil {
		err = storeError(err)
	}
	wg.Wait()
	partial := false
	for _, e := range errs {
		partial = partial || e == nil || wire.IsPartial(e)
		if err == nil {
			err = e
		}
	}
	return x.publish(&st.stored, err, partial)
}

// sendWhole sends a whole write to a child replica and waits for its
// verdict.
func (x *writer) sendWhole(k child, hdr, data []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), x.d.ReplyTimeout)
	defer cancel()
	pc, err := x.dialReplica(ctx, k.node, &k.addr)
	if err != nil {
		return wrapReplica(k.rank, k.addr, err)
	}
	var parts [][]byte
	if len(data) > 0 {
		parts = [][]byte{data}
	}
	call, err := exchange.Post(x.d.Forward, pc, hdr, parts...)
	if err != nil {
		return wrapReplica(k.rank, k.addr, err)
	}
	// The reply timeout counts from the end of the transfer.
	if err := finalReply(call.Finish(context.Background(), x.d.ReplyTimeout)); err != nil {
		return wrapReplica(k.rank, k.addr, err)
	}
	return nil
}

// dialReplica connects to a replica at *addr; if that fails and the
// cluster map has another address for it (the map predated the replica's
// restart), it refreshes the map and tries the new address.
func dialReplicaWith(d *Deps, ctx context.Context, node ids.NodeID, addr *string, stop <-chan struct{}) (*peerConn, error) {
	pc, err := d.Forward.Get(ctx, *addr)
	if err != nil && d.RefreshMap != nil && d.ReplicaAddr != nil && !stopped(stop) {
		d.RefreshMap()
		if a, ok := d.ReplicaAddr(node); ok && a != *addr {
			*addr = a
			pc, err = d.Forward.Get(ctx, a)
		}
	}
	return pc, err
}

func (x *writer) dialReplica(ctx context.Context, node ids.NodeID, addr *string) (*peerConn, error) {
	return dialReplicaWith(x.d, ctx, node, addr, nil)
}

// hostEncode is the per-chunk erasure-coding baseline at a data unit: the
// whole unit is in host memory; store it, then compute its partial
// parities and send each parity unit its whole partial.
func (x hostWrites) hostEncode(st *hostState, h *wire.WriteHeader, c *capability.Capability) []byte {
	code, units, err := x.encodeTargets(h, c)
	if err != nil {
		return wire.AppendError(nil, err)
	}
	if h.Rank == 0 {
		st.w, err = x.reserved.take(h.Chunk, h.Version, int64(h.Off), int64(h.Len), h.WriteID)
		st.head, st.flat = true, true
	} else {
		if info, serr := x.d.Store.Stat(h.Chunk); serr == nil && info.Version < h.Base {
			return wire.AppendError(nil, wire.Errorf(wire.StatusBusy, "chunk %v is at version %d, write %d must wait for %d", h.Chunk, info.Version, h.Version, h.Base))
		}
		if st.w, err = x.d.Store.BeginFollow(h.Chunk, int64(h.Off), int64(h.Len), h.Version, h.Base); err != nil {
			err = storeError(err)
		}
	}
	if err == nil {
		if err = planned(st.w, c.Epoch); err != nil {
			st.w = nil
		}
	}
	if err != nil {
		return wire.AppendError(nil, err)
	}
	w := st.w
	w.SetTag(h.WriteID)
	fail := func(err error) []byte {
		x.abort(&st.stored, st.head)
		return wire.AppendError(nil, err)
	}
	if len(st.buf) > 0 {
		if err := w.Place(int64(h.Off), st.buf); err != nil {
			return fail(storeError(err))
		}
	}
	shards := make([][]byte, 1+code.M)
	shards[0] = st.buf
	for i := range code.M {
		shards[1+i] = x.hostBufs.get(len(st.buf))
		defer x.hostBufs.put(shards[1+i])
	}
	if err := code.Partial(int(h.Rank), shards); err != nil {
		return fail(wire.Errorf(wire.StatusIO, "computing partial parity: %v", err))
	}
	errs := make([]error, len(units))
	var wg sync.WaitGroup
	for i, u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = x.sendWhole(u, x.partialHeader(h, u, w), shards[1+i])
		}()
	}
	err = w.Sync()
	if err != nil {
		err = storeError(err)
	}
	wg.Wait()
	partial := st.flat
	for _, e := range errs {
		partial = partial || e == nil || wire.IsPartial(e)
		if err == nil {
			err = e
		}
	}
	return x.publish(&st.stored, err, partial)
}
