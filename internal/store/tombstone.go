package store

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/admit"
	"github.com/sluicefs/sluice/internal/ids"
)

// Tombstones. A chunk meta deleted (its file was removed, or truncated
// below it) must not come back: a write capability minted before the
// deletion stays valid for minutes, and a write replayed with it, or one
// merely late, would re-create the chunk on every replica, where no file
// refers to it. So the copy is deleted behind a tombstone: a fence no
// epoch passes, durable, checked where fences are — when a write begins
// and, under the chunk's commit lock, when it commits — so that neither
// a write arriving later nor one already open when the tombstone came
// can commit. Meta says how long to keep it (until every capability that
// could name the chunk has expired); then ExpireTombstones drops it:
// chunk ids are never reused, so no valid capability can name the chunk
// any more.

// tombstoneEpoch is a tombstone's fence epoch: above every real epoch.
const tombstoneEpoch = admit.Tombstone

func errDeleted(id ids.ChunkID) error {
	return fmt.Errorf("chunk %v was deleted, its file removed or truncated: %w", id, ErrDeleted)
}

// Tombstone deletes id for good and refuses every write to it until the
// tombstone expires at until (unix ns; ExpireTombstones). The tombstone
// is durable before anything is deleted, and excludes commits while it
// is laid, so no write open now commits afterwards. If a write is open
// the data stays and Tombstone returns ErrBusy: that write cannot commit
// any more, and the caller deletes again later (Tombstone or Drop).
// A tombstone only ever moves later.
func (s *Store) Tombstone(id ids.ChunkID, until int64) error {
	if !s.gate.enter() {
		return fmt.Errorf("store: tombstone %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c := s.chunks.acquire(id)
	c.mu.Lock()
	cur := s.fences.get(id)
	var err error
	if !cur.tombstone() || until > cur.until {
		f := fenceRec{epoch: tombstoneEpoch, until: max(until, cur.until)}
		if err = s.db.Set(fenceKey(id), f.encode(), pebble.Sync); err == nil {
			s.fences.set(id, f)
		}
	}
	c.mu.Unlock()
	s.chunks.release(id, c, false)
	if err != nil {
		return fmt.Errorf("store: tombstone %v: %w", id, err)
	}
	return s.deleteOpen(id)
}

// Tombstoned reports whether id has a tombstone, and until when.
func (s *Store) Tombstoned(id ids.ChunkID) (until int64, ok bool) {
	f := s.fences.get(id)
	return f.until, f.tombstone()
}

// expired reports whether a tombstone kept until until may go at now: a
// capability is valid while now <= its expiry, and meta's until is no
// earlier than any expiry.
func expired(until, now int64) bool { return now > until }

// ExpireTombstones drops the tombstones that expired before now (unix
// ns) and reports how many. The chunk's fence goes with it: the chunk
// is gone, and no capability that could write it is valid any more.
func (s *Store) ExpireTombstones(now int64) (int, error) {
	if !s.gate.enter() {
		return 0, fmt.Errorf("store: expire tombstones: %w", ErrClosed)
	}
	defer s.gate.exit()
	var due []ids.ChunkID
	s.fences.mu.Lock()
	for id, f := range s.fences.m {
		if f.tombstone() && expired(f.until, now) {
			due = append(due, id)
		}
	}
	s.fences.mu.Unlock()
	n := 0
	for _, id := range due {
		c := s.chunks.acquire(id)
		c.mu.Lock()
		var err error
		if f := s.fences.get(id); f.tombstone() && expired(f.until, now) {
			// Unsynced: a deletion a crash loses is found expired again.
			if err = s.db.Delete(fenceKey(id), pebble.NoSync); err == nil {
				s.fences.remove(id)
				n++
			}
		}
		c.mu.Unlock()
		s.chunks.release(id, c, false)
		if err != nil {
			return n, fmt.Errorf("store: expire tombstone of %v: %w", id, err)
		}
	}
	return n, nil
}

// Collect deletes id on meta's word that no file needs this copy (a
// node's inventory, see package inventory), judged at cluster epoch
// epoch. A copy fenced above epoch since is kept (false): meta placed a
// member here after it judged, and fences a member before it writes
// one. ErrBusy while a write is open.
func (s *Store) Collect(id ids.ChunkID, epoch uint64) (bool, error) {
	if !s.gate.enter() {
		return false, fmt.Errorf("store: collect %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c, ok := s.chunks.acquireWriter(id)
	if !ok {
		return false, fmt.Errorf("store: collect %v: a write is open: %w", id, ErrBusy)
	}
	defer s.chunks.release(id, c, true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, d := admit.Step(s.view(id, 0), admit.Collect{Epoch: epoch}); !d.Delete {
		return false, nil
	}
	if err := s.delete(id); err != nil {
		return false, fmt.Errorf("store: collect %v: %w", id, err)
	}
	c.redoPending.Store(false)
	return true, nil
}
