package policy

import (
	"errors"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// writer is the write execution context: auth + ring replication +
// direct placement + checksums.
type writer struct {
	d *Deps
}

// writeState is the per-request state (the sPIN write descriptor). Only
// fixed-size values survive the header handler: the header packet's
// bytes are released when it returns.
type writeState struct {
	chunkOff int64 // where the write starts in the chunk
	length   int64
	rank     int
	w        *store.Write
	fwd      *forward // nil at the tail of the ring

	hdr    wire.WriteHeader
	cap    capability.Capability
	fwdHdr []byte
}

func newWriter(d *Deps) *writer { return &writer{d: d} }

func (x *writer) context() *engine.Context {
	return &engine.Context{Name: "write", Class: wire.OpWrite, Handlers: engine.Handlers{
		Header:     x.header,
		Payload:    x.payload,
		Completion: x.completion,
		Cleanup:    x.cleanup,
		Direct:     x.direct,
		DirectDone: x.directDone,
	}}
}

// header admits a write. Its state is not pooled: the fabric's reader may
// still be finishing a direct placement when a failed request is cleaned
// up, and must find the state intact (the store makes the late placement
// harmless).
func (x *writer) header(r *engine.Request, hdr []byte) error {
	st := &writeState{}
	if err := x.admit(st, hdr); err != nil {
		return err
	}
	r.State = st
	return nil
}

func (x *writer) admit(st *writeState, hdr []byte) error {
	h := &st.hdr
	if err := wire.ParseWrite(hdr, h); err != nil {
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	// Authentication: no round trip, no per-client state.
	c := &st.cap
	if _, err := x.d.Keys.Open(h.Cap, x.d.Now(), c); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	if err := c.Allows(capability.Write, h.Chunk, h.Off, h.Len); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	rank := c.RankOf(x.d.Self())
	if rank != int(h.Rank) {
		return wire.Errorf(wire.StatusAuth, "node %v is not replica rank %d of chunk %v", x.d.Self(), h.Rank, h.Chunk)
	}
	if h.Addrs.Len() != int(c.NReplicas) {
		return wire.Errorf(wire.StatusBadRequest, "%d replica addresses for %d replicas", h.Addrs.Len(), c.NReplicas)
	}
	if h.Strategy != wire.StrategyRing {
		return wire.Errorf(wire.StatusBadRequest, "unknown replication strategy %v", h.Strategy)
	}
	if (rank == 0) != (h.Version == 0) {
		return wire.Errorf(wire.StatusBadRequest, "version %d at rank %d", h.Version, rank)
	}
	var next string
	var nextID ids.NodeID
	if rank+1 < h.Addrs.Len() {
		nextID = c.Replicas[rank+1]
		if x.d.ReplicaAddr == nil {
			next = string(h.Addrs.At(rank + 1))
		} else {
			var known bool
			if next, known = x.d.ReplicaAddr(c.Replicas[rank+1]); !known {
				return wire.Errorf(wire.StatusBusy, "replica %v is not in this node's cluster map yet", c.Replicas[rank+1])
			}
		}
	}
	w, err := x.d.Store.BeginWrite(h.Chunk, int64(h.Off), int64(h.Len), h.Version)
	if err != nil {
		return storeError(err)
	}
	st.w, st.rank, st.chunkOff, st.length = w, rank, int64(h.Off), int64(h.Len)
	if next != "" {
		st.fwdHdr = wire.AppendForward(st.fwdHdr[:0], h, uint8(rank+1), w.Version())
		st.fwd = startForward(x.d, nextID, next, rank+1, st.fwdHdr, h.Len == 0)
	}
	st.hdr = wire.WriteHeader{} // drop references into the released packet
	return nil
}

// storeError maps a store failure to the status the client should see.
func storeError(err error) error {
	switch {
	case errors.Is(err, store.ErrBusy):
		return wire.Errorf(wire.StatusBusy, "%v", err)
	case errors.Is(err, store.ErrStale):
		return wire.Errorf(wire.StatusStale, "%v", err)
	case errors.Is(err, store.ErrRange), errors.Is(err, store.ErrIncomplete):
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	return wire.Errorf(wire.StatusIO, "%v", err)
}

// direct runs on the fabric's reader: a data packet in the append region
// is received straight into the chunk file's mapped pages. (The store
// makes this safe even while the request is being aborted.)
func (x *writer) direct(state any, off int64, n int) []byte {
	st := state.(*writeState)
	return st.w.DirectBegin(st.chunkOff+off, n)
}

func (x *writer) directDone(state any) { state.(*writeState).w.DirectEnd() }

// payload is the per-packet path: place the packet in the store at its
// offset (usually it is already there: direct placement), then hand it
// to the forward, which sends it to the next replica at once. Placing
// first means a packet this replica could not store never reaches the
// replicas after it, so a local failure cannot leave them ahead.
func (x *writer) payload(r *engine.Request, p *fabric.Packet) error {
	st := r.State.(*writeState)
	if end := p.Off + int64(len(p.Data)); end > st.length || (st.length == 0 && p.Off == 0) {
		// Beyond what the header declared (a zero-length write carries no
		// data packet at all).
		return wire.Errorf(wire.StatusBadRequest, "data packet [%d, %d) beyond the write's %d bytes", p.Off, end, st.length)
	}
	if st.fwd != nil {
		if err := st.fwd.failed(); err != nil {
			return err // the ring is broken: stop early, the client learns now
		}
	}
	if err := st.w.Place(st.chunkOff+p.Off, p.Data); err != nil {
		return storeError(err)
	}
	if st.fwd != nil {
		p.Retain()
		st.fwd.push(p)
	}
	return nil
}

// completion runs on the worker; the durable part goes to the host side.
func (x *writer) completion(r *engine.Request) {
	go x.finish(r, r.State.(*writeState))
}

func (x *writer) finish(r *engine.Request, st *writeState) {
	err := st.w.Sync()
	if err != nil {
		err = storeError(err)
	}
	if st.fwd != nil {
		if ferr := st.fwd.wait(); err == nil {
			err = ferr
		}
	}
	var reply []byte
	if err == nil {
		var info store.Info
		if info, err = st.w.Commit(); err == nil {
			reply = wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length)}, nil, "")
		} else {
			err = storeError(err)
		}
	}
	if err != nil {
		st.w.Abort()
		reply = wire.AppendError(nil, err)
	}
	r.Finish(reply)
}

// cleanup must not block the worker: a forward still dialing or sending
// to a slow replica takes time to stop, so the store write is aborted
// once it has (it may still be sending from the pages the abort releases).
func (x *writer) cleanup(r *engine.Request, reason error) {
	st := r.State.(*writeState)
	if st.fwd == nil {
		st.w.Abort()
		return
	}
	st.fwd.abort(reason)
	go func() {
		st.fwd.wait()
		st.w.Abort()
	}()
}

// errAborted is the reason a forward stops when its request is cleaned up.
var errAborted = errors.New("request aborted")

// wrapReplica names the downstream replica in an error from it. A busy
// downstream stays retryable; a replica error from further down is
// extended rather than re-prefixed, so the client reads the whole path:
// "replica rank 1 (a): replica rank 2 (b): connection refused".
func wrapReplica(rank int, addr string, err error) error {
	var we *wire.Error
	if errors.As(err, &we) {
		switch we.Status {
		case wire.StatusBusy:
			return wire.Errorf(wire.StatusBusy, "replica rank %d (%s): %s", rank, addr, we.Msg)
		case wire.StatusReplica:
			return wire.Errorf(wire.StatusReplica, "replica rank %d (%s): %s", rank, addr, we.Msg)
		}
		return wire.Errorf(wire.StatusReplica, "replica rank %d (%s): %s: %s", rank, addr, we.Status, we.Msg)
	}
	return wire.Errorf(wire.StatusReplica, "replica rank %d (%s): %v", rank, addr, err)
}
