package policy

import (
	"context"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/wire"
)

// Host mode is the CPU-centric baseline the seed compares against
// (CPU-Ring, CPU-PBT, and "RPC" for authentication): the node receives the
// whole request into host memory, then validates it, stores it and
// forwards it whole to its children — store-and-forward at every hop.
// It is a real mode (selectable per directory as host-ring / host-tree),
// so it has the same durability and ordering as streaming; it is just
// slower, which is the point of comparing.

// hostState is a host-mode request: the header kept for validation after
// the data is in, and the buffer the data is received into.
type hostState struct {
	hdr []byte
	buf []byte
	got int64
}

func (x *writer) hostHeader(st *writeState, h *wire.WriteHeader, raw []byte) error {
	if h.Flags != 0 || h.Strategy == wire.StrategyFlat {
		return wire.Errorf(wire.StatusBadRequest, "store-and-forward writes are ring or tree writes")
	}
	if h.Len > uint64(x.d.HostBuffer) {
		return wire.Errorf(wire.StatusBadRequest, "store-and-forward write of %d bytes, at most %d", h.Len, x.d.HostBuffer)
	}
	// Host memory is bounded: a request that would exceed the budget is
	// refused busy (retryable), never queued.
	if x.hostBytes.Add(int64(h.Len)) > x.d.HostBuffer {
		x.hostBytes.Add(-int64(h.Len))
		return wire.Errorf(wire.StatusBusy, "host buffers for store-and-forward writes are full")
	}
	st.host = &hostState{hdr: append([]byte(nil), raw...), buf: x.hostBufs.get(int(h.Len))}
	return nil
}

func (x *writer) releaseHost(st *writeState) {
	if st.host != nil && st.host.buf != nil {
		x.hostBytes.Add(-int64(len(st.host.buf)))
		x.hostBufs.put(st.host.buf)
		st.host.buf = nil
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
func (x *writer) hostFinish(r *engine.Request, st *writeState) {
	defer x.releaseHost(st)
	r.Finish(x.hostStore(st))
}

func (x *writer) hostStore(st *writeState) []byte {
	hs := st.host
	var h wire.WriteHeader
	if err := wire.ParseWrite(hs.hdr, &h); err != nil {
		return wire.AppendError(nil, wire.Errorf(wire.StatusBadRequest, "%v", err))
	}
	var c capability.Capability
	if err := x.check(&h, &c); err != nil {
		return wire.AppendError(nil, err)
	}
	if hs.got != int64(len(hs.buf)) {
		return wire.AppendError(nil, wire.Errorf(wire.StatusBadRequest, "received %d of %d bytes", hs.got, len(hs.buf)))
	}
	if reply, ok := x.alreadyApplied(&h); ok {
		return reply
	}
	kids, err := x.children(&h, &c)
	if err != nil {
		return wire.AppendError(nil, err)
	}
	w, err := x.d.Store.BeginWrite(h.Chunk, int64(h.Off), int64(h.Len), h.Version)
	if err != nil {
		return wire.AppendError(nil, storeError(err))
	}
	w.SetTag(h.WriteID)
	if len(hs.buf) > 0 {
		if err := w.Place(int64(h.Off), hs.buf); err != nil {
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
			hdr := wire.AppendForward(nil, &h, uint8(k.rank), w.Version())
			errs[i] = x.sendWhole(k, hdr, hs.buf)
		}()
	}
	err = w.Sync()
	if err != nil {
		err = storeError(err)
	}
	wg.Wait()
	for _, e := range errs {
		if err == nil {
			err = e
		}
	}
	return x.publish(w, err)
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
	id := pc.NewID()
	replies := pc.Replies.Expect(id)
	var parts [][]byte
	if len(data) > 0 {
		parts = [][]byte{data}
	}
	if err := pc.Send(id, hdr, parts...); err != nil {
		pc.Close()
		return wrapReplica(k.rank, k.addr, err)
	}
	t := time.NewTimer(x.d.ReplyTimeout)
	defer t.Stop()
	select {
	case p, ok := <-replies:
		if err := replyErr(p, ok, pc); err != nil {
			pc.Close()
			return wrapReplica(k.rank, k.addr, err)
		}
		x.d.Forward.Put(pc)
		return nil
	case <-t.C:
		pc.Close()
		return wrapReplica(k.rank, k.addr, wire.Errorf(wire.StatusReplica, "no reply within %s", x.d.ReplyTimeout))
	}
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
