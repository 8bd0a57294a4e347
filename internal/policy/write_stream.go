package policy

import (
	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// streamWrites is the streaming write context (ring, tree, and a flat
// write's data): the header handler admits the write, opens the store
// write and starts a forward to each child; every packet is placed at its
// offset and forwarded as it arrives; completion syncs, waits for the
// children and publishes (write_commit.go).
type streamWrites struct{ *writer }

// streamState is a streamed write's state (the sPIN write descriptor).
type streamState struct {
	stored
	got  int64      // data bytes received
	fwds []*forward // one per child (none at a leaf), or per parity unit
}

func (x streamWrites) header(r *engine.Request, hdr []byte) error {
	h, c, kids, err := x.admitStream(hdr)
	if err != nil {
		return err
	}
	st := &streamState{stored: storedOf(&h)}
	if err := x.openStream(st, &h, &c, kids); err != nil {
		return err
	}
	r.State = st
	return nil
}

// admitStream admits a streamed write (admitWrite), answers a retry this
// replica committed before, and resolves the children it goes on to.
func (x *writer) admitStream(hdr []byte) (h wire.WriteHeader, c capability.Capability, kids []child, err error) {
	if h, c, err = x.admitWrite(hdr); err != nil {
		return h, c, nil, err
	}
	if reply, ok := x.alreadyApplied(&h); ok {
		return h, c, nil, &engine.Answered{Reply: reply}
	}
	kids, err = x.children(&h, &c)
	return h, c, kids, err
}

// openStream opens a streamed write's store write and starts a forward to
// each child.
func (x *writer) openStream(st *streamState, h *wire.WriteHeader, c *capability.Capability, kids []child) error {
	var err error
	switch {
	case (h.Strategy == plan.Flat || h.Strategy == plan.EC) && h.Rank == 0:
		// The data of a flat write whose version rank 0 reserved.
		if st.w, err = x.reserved.take(h.Chunk, h.Version, int64(h.Off), int64(h.Len), h.WriteID); err != nil {
			return err
		}
		st.head, st.flat = true, true
	case h.Version == 0:
		// Rank 0 of a ring or tree chooses the version.
		if st.w, err = x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID); err != nil {
			return storeError(err)
		}
		st.head = true
	default:
		if h.Strategy == plan.Flat || h.Strategy == plan.EC {
			// An earlier flat write may not have reached this replica yet:
			// busy, not stale (the store decides the rest).
			if err := awaitPredecessor(x.d.Store, h); err != nil {
				return err
			}
		}
		if st.w, err = x.d.Store.BeginFollow(h.Chunk, int64(h.Off), int64(h.Len), h.Version, h.Base); err != nil {
			return storeError(err)
		}
	}
	if err := planned(st.w, c.Epoch); err != nil {
		st.w = nil
		return err
	}
	st.w.SetTag(h.WriteID)
	for _, k := range kids {
		st.fwds = append(st.fwds, startForward(x.d, k.node, k.addr, k.rank, x.forwardHeader(h, k, st.w), h.Len == 0))
	}
	return nil
}

// direct runs on the fabric's reader: a data packet in the append region
// is received straight into the chunk file's mapped pages. (The store
// makes this safe even while the request is being aborted.)
func (s *stored) direct(off int64, n int) []byte { return s.w.DirectBegin(s.chunkOff+off, n) }

func (streamWrites) direct(state any, off int64, n int) []byte {
	return state.(*streamState).direct(off, n)
}

func (streamWrites) directDone(state any) { state.(*streamState).w.DirectEnd() }

// payload is the per-packet path: place the packet, then hand it to the
// forwards, which send it to the children at once.
func (x streamWrites) payload(r *engine.Request, p *fabric.Packet) error {
	st := r.State.(*streamState)
	if err := x.place(st, p); err != nil {
		return err
	}
	for _, f := range st.fwds {
		p.Retain()
		f.push(p)
	}
	return nil
}

// place puts a data packet in the store at its offset (usually it is
// already there: direct placement). Placing before sending on means a
// packet this replica could not store never reaches the replicas after
// it, so a local failure cannot leave them ahead.
func (x *writer) place(st *streamState, p *fabric.Packet) error {
	if err := inBounds(p, st.length); err != nil {
		return err
	}
	for _, f := range st.fwds {
		if err := f.failed(); err != nil {
			return err // the ring is broken: stop early, the client learns now
		}
	}
	if err := st.w.Place(st.chunkOff+p.Off, p.Data); err != nil {
		return storeError(err)
	}
	st.got += int64(len(p.Data))
	return nil
}

// completion runs on the worker; the durable part goes to the host side.
func (x streamWrites) completion(r *engine.Request) {
	st := r.State.(*streamState)
	x.background(func() { x.finish(r, st) })
}

func (x streamWrites) cleanup(r *engine.Request, reason error) {
	x.cleanupStream(r.State.(*streamState), reason)
}
