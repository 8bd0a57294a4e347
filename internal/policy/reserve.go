package policy

import (
	"log/slog"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/admit"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// Flat writes are client-driven: the client sends every replica its copy
// itself, after reserving the chunk's next version at rank 0 (the extra
// round trip the seed charges RDMA-Flat with). Rank 0 opens the store
// write — taking the chunk's write lock — and keeps it until that write's
// data arrives or the reservation expires; one that expires may have been
// written to the other replicas, so it ends as a doubt (store.Doubt). The
// rules (bounds, matching) are admit.Reservations'; this adds the store
// write and the expiry timer.

type reservations struct {
	mu      sync.Mutex
	t       *admit.Reservations[*reservation]
	timeout time.Duration
	log     *slog.Logger
}

// reservation is what a reserved chunk holds: its open write and the
// timer that ends it.
type reservation struct {
	w     *store.Write
	timer *time.Timer
}

// maxReservations bounds how many chunks can be reserved at once: each
// holds a chunk's write lock (and open files) until its data comes or it
// expires. One client may hold only a share, so it cannot lock out the
// others.
const (
	maxReservations          = 1024
	maxReservationsPerClient = 64
)

func newReservations(timeout time.Duration, log *slog.Logger) *reservations {
	return &reservations{t: admit.NewReservations[*reservation](maxReservations, maxReservationsPerClient), timeout: timeout, log: log}
}

// reserveWrites is the context of a flat write's version reservation at
// rank 0 (FlagReserve): a header-only request whose header handler opens
// the store write the reservation holds, answered at completion with the
// version; or, if it names a version, the release of that reservation.
type reserveWrites struct{ *writer }

// reserveState is a reservation being made: the write it holds.
type reserveState struct {
	chunk  ids.ChunkID
	length int64
	w      *store.Write
}

// header opens the write a flat reservation holds, or releases one.
func (x reserveWrites) header(r *engine.Request, hdr []byte) error {
	h, c, err := x.admitWrite(hdr)
	if err != nil {
		return err
	}
	if h.Version != 0 {
		x.reserved.release(h.Chunk, h.Version, h.WriteID, c.Client)
		return &engine.Answered{Reply: wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: h.Version}, nil, "released")}
	}
	w, err := x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID)
	if err != nil {
		return storeError(err)
	}
	if err := planned(w, c.Epoch); err != nil {
		return err
	}
	res := admit.Reservation{Version: w.Version(), Off: int64(h.Off), Len: int64(h.Len), WriteID: h.WriteID, Client: c.Client}
	if err := x.reserved.put(h.Chunk, res, w); err != nil {
		w.Abort()
		return err
	}
	r.State = &reserveState{chunk: h.Chunk, length: int64(h.Len), w: w}
	return nil
}

func (x reserveWrites) payload(r *engine.Request, p *fabric.Packet) error {
	if err := inBounds(p, r.State.(*reserveState).length); err != nil {
		return err
	}
	return wire.Errorf(wire.StatusBadRequest, "a version reservation carries no data packets")
}

func (reserveWrites) completion(r *engine.Request) {
	w := r.State.(*reserveState).w
	r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: w.Version(),
		Skipped: w.Version() - 1 - w.Base()}, nil, ""))
}

// cleanup: the reservation request itself failed; its client never
// learned the version, so nothing can have been written with it.
func (x reserveWrites) cleanup(r *engine.Request, reason error) {
	st := r.State.(*reserveState)
	x.reserved.cancel(st.chunk, st.w)
}

func (rs *reservations) put(chunk ids.ChunkID, res admit.Reservation, w *store.Write) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := &reservation{w: w}
	if err := rs.t.Put(chunk, res, r); err != nil {
		return storeError(err)
	}
	r.timer = time.AfterFunc(rs.timeout, func() { rs.expire(chunk, r) })
	return nil
}

// take hands the reserved write of chunk to its data message, which must
// name the reserved version, range and write.
func (rs *reservations) take(chunk ids.ChunkID, version uint64, off, n int64, writeID uint64) (*store.Write, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, err := rs.t.Take(chunk, admit.Reservation{Version: version, Off: off, Len: n, WriteID: writeID})
	if err != nil {
		return nil, storeError(err)
	}
	r.timer.Stop()
	return r.w, nil
}

// release drops the reservation of chunk for version of write writeID, if
// it still stands and is client's: its client gave up before sending any
// data with it, so no doubt is recorded (admit.Reservations.Release).
func (rs *reservations) release(chunk ids.ChunkID, version, writeID uint64, client ids.ClientID) {
	rs.mu.Lock()
	r, ok := rs.t.Release(chunk, version, writeID, client)
	rs.mu.Unlock()
	if ok {
		r.timer.Stop()
		r.w.Abort()
	}
}

// cancel drops the reservation holding w, if it still does.
func (rs *reservations) cancel(chunk ids.ChunkID, w *store.Write) {
	rs.mu.Lock()
	r, ok := rs.t.Hold(chunk)
	ok = ok && r.w == w && rs.t.Remove(chunk, r)
	rs.mu.Unlock()
	if ok {
		r.timer.Stop()
		w.Abort()
	}
}

func (rs *reservations) expire(chunk ids.ChunkID, r *reservation) {
	rs.mu.Lock()
	ok := rs.t.Remove(chunk, r)
	rs.mu.Unlock()
	if ok {
		rs.inDoubt(chunk, r)
	}
}

// inDoubt ends a reservation whose data never came: the client may have
// written the other replicas already.
func (rs *reservations) inDoubt(chunk ids.ChunkID, r *reservation) {
	if err := r.w.AbortInDoubt(); err != nil {
		rs.log.Error("flat reservation ended without its data, and its doubt could not be recorded", "chunk", chunk, "err", err)
	}
}

// closeAll ends every reservation (each becomes a doubt) and refuses new
// ones. An expiry timer that already fired finds its entry gone.
func (rs *reservations) closeAll() {
	rs.mu.Lock()
	m := rs.t.Close()
	rs.mu.Unlock()
	for chunk, r := range m {
		r.timer.Stop()
		rs.inDoubt(chunk, r)
	}
}
