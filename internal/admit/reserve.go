package admit

import (
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
)

// Flat writes are client-driven: the client sends every replica its copy
// itself. To keep one order of writes per chunk without a forwarding
// head, the client first reserves the chunk's next version at rank 0,
// which holds the chunk's write (BeginHead) until the write's data comes
// or the reservation expires. Every other replica takes the write only
// after the version before it (BeginFollow with Wait). A reservation that
// expires may have been written to the other replicas: it ends as a
// doubt (Abort with InDoubt).

// Reservation is a flat write's version, reserved at rank 0.
type Reservation struct {
	Version  uint64
	Off, Len int64
	WriteID  uint64
	Client   ids.ClientID
}

// Reservations is the table of rank 0's reservations, each with the
// caller's Hold (its open write and expiry timer). It bounds how many
// chunks are reserved at once — each holds a chunk's write — and how
// many of those one client holds, so it cannot lock out the others.
// It is not safe for concurrent use.
type Reservations[H comparable] struct {
	Max, PerClient int
	m              map[ids.ChunkID]entry[H]
	byClient       map[ids.ClientID]int
	closed         bool
}

type entry[H comparable] struct {
	r    Reservation
	hold H
}

// NewReservations makes an empty table with the given bounds.
func NewReservations[H comparable](max, perClient int) *Reservations[H] {
	return &Reservations[H]{Max: max, PerClient: perClient, m: map[ids.ChunkID]entry[H]{}, byClient: map[ids.ClientID]int{}}
}

// Put reserves chunk (whose write the caller already holds) for r.
func (t *Reservations[H]) Put(chunk ids.ChunkID, r Reservation, hold H) error {
	switch {
	case t.closed:
		return &refusal{"node shutting down", ErrBusy}
	case len(t.m) >= t.Max:
		return &refusal{"too many flat writes reserved", ErrBusy}
	case t.byClient[r.Client] >= t.PerClient:
		return &refusal{fmt.Sprintf("client %v holds %d flat write reservations already", r.Client, t.PerClient), ErrBusy}
	}
	t.byClient[r.Client]++
	t.m[chunk] = entry[H]{r, hold}
	return nil
}

// Take hands chunk's reservation to its data message, which must name
// the reserved version, range and write: ErrStale if there is none (it
// expired), ErrMismatch if it names another.
func (t *Reservations[H]) Take(chunk ids.ChunkID, want Reservation) (H, error) {
	e, ok := t.m[chunk]
	var zero H
	switch {
	case !ok:
		return zero, &refusal{fmt.Sprintf("no reservation for chunk %v (expired?)", chunk), ErrStale}
	case e.r.Version != want.Version || e.r.Off != want.Off || e.r.Len != want.Len || e.r.WriteID != want.WriteID:
		return zero, &refusal{fmt.Sprintf("chunk %v is reserved for version %d [%d,+%d) of write %x, not %d [%d,+%d) of %x",
			chunk, e.r.Version, e.r.Off, e.r.Len, e.r.WriteID, want.Version, want.Off, want.Len, want.WriteID), ErrMismatch}
	}
	t.drop(chunk, e)
	return e.hold, nil
}

// Release drops chunk's reservation if it is for version of write
// writeID by client, who gave up before sending data with it: no replica
// can have the version, so no doubt is recorded. A client that releases
// a version it did write harms only its own file.
func (t *Reservations[H]) Release(chunk ids.ChunkID, version, writeID uint64, client ids.ClientID) (H, bool) {
	e, ok := t.m[chunk]
	if !ok || e.r.Version != version || e.r.WriteID != writeID || e.r.Client != client {
		var zero H
		return zero, false
	}
	t.drop(chunk, e)
	return e.hold, true
}

// Remove drops chunk's reservation if it is still hold's (it expired, or
// its request was cancelled). The caller ends it — in doubt on expiry.
func (t *Reservations[H]) Remove(chunk ids.ChunkID, hold H) bool {
	e, ok := t.m[chunk]
	if !ok || e.hold != hold {
		return false
	}
	t.drop(chunk, e)
	return true
}

// Close ends the table: it returns every hold (each to end in doubt) and
// refuses new reservations.
func (t *Reservations[H]) Close() map[ids.ChunkID]H {
	out := make(map[ids.ChunkID]H, len(t.m))
	for chunk, e := range t.m {
		out[chunk] = e.hold
	}
	t.m, t.byClient, t.closed = map[ids.ChunkID]entry[H]{}, map[ids.ClientID]int{}, true
	return out
}

// Hold returns chunk's reservation's hold, if it is reserved.
func (t *Reservations[H]) Hold(chunk ids.ChunkID) (H, bool) {
	e, ok := t.m[chunk]
	return e.hold, ok
}

// Len reports how many chunks are reserved.
func (t *Reservations[H]) Len() int { return len(t.m) }

func (t *Reservations[H]) drop(chunk ids.ChunkID, e entry[H]) {
	delete(t.m, chunk)
	if t.byClient[e.r.Client]--; t.byClient[e.r.Client] <= 0 {
		delete(t.byClient, e.r.Client)
	}
}
