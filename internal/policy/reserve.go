package policy

import (
	"log/slog"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// Flat writes are client-driven: the client sends every replica its copy
// itself. To keep the one-order-per-chunk guarantee without a forwarding
// head, the client first reserves the chunk's next version at rank 0 (the
// extra round trip the seed charges RDMA-Flat with): rank 0 opens the
// store write — taking the chunk's write lock — and keeps it until that
// write's data arrives or the reservation expires. Every other replica
// accepts the write only after the version before it (busy while an
// earlier one is still on its way, stale if it is behind for good). A
// reservation that expires may have been written to the other replicas,
// so rank 0 records it as a doubt (store.Doubt).

type reservations struct {
	mu       sync.Mutex
	m        map[ids.ChunkID]*reservation
	byClient map[ids.ClientID]int
	closed   bool
	timeout  time.Duration
	log      *slog.Logger
}

type reservation struct {
	w        *store.Write
	off, len int64
	writeID  uint64
	client   ids.ClientID
	timer    *time.Timer
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
	return &reservations{m: map[ids.ChunkID]*reservation{}, byClient: map[ids.ClientID]int{}, timeout: timeout, log: log}
}

// reserveHeader opens the write a flat reservation holds.
func (x *writer) reserveHeader(st *writeState, h *wire.WriteHeader, c *capability.Capability) error {
	w, err := x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID)
	if err != nil {
		return storeError(err)
	}
	if err := planned(w, c.Epoch); err != nil {
		return err
	}
	if err := x.reserved.put(h.Chunk, &reservation{w: w, off: int64(h.Off), len: int64(h.Len), writeID: h.WriteID, client: c.Client}); err != nil {
		w.Abort()
		return err
	}
	st.w, st.reserve = w, true
	return nil
}

func (rs *reservations) put(chunk ids.ChunkID, r *reservation) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	switch {
	case rs.closed:
		return wire.Errorf(wire.StatusBusy, "node shutting down")
	case len(rs.m) >= maxReservations:
		return wire.Errorf(wire.StatusBusy, "too many flat writes reserved")
	case rs.byClient[r.client] >= maxReservationsPerClient:
		return wire.Errorf(wire.StatusBusy, "client %v holds %d flat write reservations already", r.client, maxReservationsPerClient)
	}
	rs.byClient[r.client]++
	r.timer = time.AfterFunc(rs.timeout, func() { rs.expire(chunk, r) })
	rs.m[chunk] = r
	return nil
}

// take hands the reserved write of chunk to its data message, which must
// name the reserved version, range and write.
func (rs *reservations) take(chunk ids.ChunkID, version uint64, off, n int64, writeID uint64) (*store.Write, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.m[chunk]
	switch {
	case r == nil:
		return nil, wire.Errorf(wire.StatusStale, "no reservation for chunk %v (expired?)", chunk)
	case r.w.Version() != version || r.off != off || r.len != n || r.writeID != writeID:
		return nil, wire.Errorf(wire.StatusBadRequest, "chunk %v is reserved for version %d [%d,+%d) of write %x, not %d [%d,+%d) of %x",
			chunk, r.w.Version(), r.off, r.len, r.writeID, version, off, n, writeID)
	}
	r.timer.Stop()
	rs.drop(chunk, r)
	return r.w, nil
}

// drop removes r, reserved for chunk. Caller holds mu.
func (rs *reservations) drop(chunk ids.ChunkID, r *reservation) {
	delete(rs.m, chunk)
	if rs.byClient[r.client]--; rs.byClient[r.client] <= 0 {
		delete(rs.byClient, r.client)
	}
}

// release drops the reservation of chunk for version of write writeID, if
// it still stands: its client gave up before sending any data with it
// (a failed read-modify-write read, say), so no replica can have the
// version and no doubt is recorded. A client that releases a version it
// did write harms only its own file (its replicas then refuse the next
// write with that version until repaired).
func (rs *reservations) release(chunk ids.ChunkID, version, writeID uint64, client ids.ClientID) {
	rs.mu.Lock()
	r := rs.m[chunk]
	if r == nil || r.w.Version() != version || r.writeID != writeID || r.client != client {
		rs.mu.Unlock()
		return
	}
	r.timer.Stop()
	rs.drop(chunk, r)
	rs.mu.Unlock()
	r.w.Abort()
}

// cancel drops the reservation holding w, if it still does.
func (rs *reservations) cancel(chunk ids.ChunkID, w *store.Write) {
	rs.mu.Lock()
	r := rs.m[chunk]
	if r == nil || r.w != w {
		rs.mu.Unlock()
		return
	}
	r.timer.Stop()
	rs.drop(chunk, r)
	rs.mu.Unlock()
	w.Abort()
}

func (rs *reservations) expire(chunk ids.ChunkID, r *reservation) {
	rs.mu.Lock()
	if rs.m[chunk] != r {
		rs.mu.Unlock()
		return
	}
	rs.drop(chunk, r)
	rs.mu.Unlock()
	rs.inDoubt(chunk, r)
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
	m := rs.m
	rs.m, rs.byClient, rs.closed = map[ids.ChunkID]*reservation{}, map[ids.ClientID]int{}, true
	rs.mu.Unlock()
	for chunk, r := range m {
		r.timer.Stop()
		rs.inDoubt(chunk, r)
	}
}
