package policy

import (
	"errors"

	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/wire"
)

// finish makes a streamed write durable and visible: sync while the
// children work, then publish only after every child has (so a child's
// refusal aborts this replica too), then acknowledge.
func (x *writer) finish(r *engine.Request, st *streamState) {
	if st.got != st.length {
		// The message ended short of what its header declared (its last
		// packet came early): nothing may be published, and the replicas
		// below, which never get their last packet either, are stopped.
		err := wire.Errorf(wire.StatusBadRequest, "write of %d bytes ended after %d", st.length, st.got)
		for _, f := range st.fwds {
			f.abort(err)
		}
		for _, f := range st.fwds {
			f.wait()
		}
		r.Finish(x.publish(&st.stored, err, st.flat))
		return
	}
	err := st.w.Sync()
	if err != nil {
		err = storeError(err)
	}
	partial := st.flat
	for _, f := range st.fwds {
		ferr := f.wait()
		partial = partial || ferr == nil || wire.IsPartial(ferr)
		if err == nil {
			err = ferr
		}
	}
	r.Finish(x.publish(&st.stored, err, partial))
}

// publish commits st's write if err is nil and returns the reply;
// otherwise it aborts the write and returns the error reply. partial says
// a replica below (or, for a flat write, beside) may have committed it:
// the reply says so, and the head records a doubt so the version is not
// given to another write (store.Doubt).
func (x *writer) publish(st *stored, err error, partial bool) []byte {
	w := st.w
	if err == nil {
		info, cerr := w.Commit()
		if cerr == nil {
			return wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length)}, nil, "")
		}
		// Every replica below has committed; and a commit that failed
		// after its commit point has committed here too.
		err, partial = storeError(cerr), partial || info.Version != 0
	}
	x.abort(st, partial)
	if partial && !wire.IsPartial(err) {
		err = &wire.PartialError{Err: err}
	}
	return wire.AppendError(nil, err)
}

// abort drops st's write, recording a doubt at the head if partial.
func (x *writer) abort(st *stored, partial bool) {
	if !partial || !st.head {
		st.w.Abort()
		return
	}
	if err := st.w.AbortInDoubt(); err != nil {
		x.d.Logger.Error("write failed after a replica may have committed it, and the doubt could not be recorded",
			"chunk", st.chunk, "version", st.w.Version(), "err", err)
	}
}

// cleanupStream ends a streamed write cut off mid-message. It must not
// block the worker: a forward still dialing or sending to a slow replica
// takes time to stop, so the store write is aborted once it has (it may
// still be sending from the pages the abort releases).
func (x *writer) cleanupStream(st *streamState, reason error) {
	// A ring or tree write cleaned up never sent its last packet on, so
	// no replica below can have committed it; a flat write's other
	// replicas may have (and recording that takes a synced index write).
	if len(st.fwds) == 0 && !st.flat {
		st.w.Abort()
		return
	}
	for _, f := range st.fwds {
		f.abort(reason)
	}
	x.background(func() {
		for _, f := range st.fwds {
			f.wait()
		}
		x.abort(&st.stored, st.flat)
	})
}

// wrapReplica names the downstream replica in an error from it. A busy
// downstream stays retryable; a replica error from further down is
// extended rather than re-prefixed, so the client reads the whole path:
// "replica rank 1 (a): replica rank 2 (b): connection refused".
func wrapReplica(rank int, addr string, err error) error {
	err2 := wrapReplicaErr(rank, addr, err)
	if wire.IsPartial(err) {
		return &wire.PartialError{Err: err2}
	}
	return err2
}

func wrapReplicaErr(rank int, addr string, err error) error {
	var we *wire.Error
	if errors.As(err, &we) {
		switch we.Status {
		case wire.StatusBusy:
			return wire.Errorf(wire.StatusBusy, "replica rank %d (%s): %s", rank, addr, we.Msg)
		case wire.StatusFenced, wire.StatusGone:
			// The layout is stale, not a replica broken: the client
			// fetches a fresh one.
			return wire.Errorf(we.Status, "replica rank %d (%s): %s", rank, addr, we.Msg)
		case wire.StatusReplica:
			return wire.Errorf(wire.StatusReplica, "replica rank %d (%s): %s", rank, addr, we.Msg)
		}
		return wire.Errorf(wire.StatusReplica, "replica rank %d (%s): %s: %s", rank, addr, we.Status, we.Msg)
	}
	return wire.Errorf(wire.StatusReplica, "replica rank %d (%s): %v", rank, addr, err)
}
