package store

import (
	"fmt"
	"os"
	"sync"

	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// Corruption is judged block by block: a chunk whose copy here has a bad
// block still holds every other block, and only the bad ones are replaced
// (Heal) — from other replicas, or rebuilt from other units.

// maxSuspects bounds the chunks the store remembers as corrupt. Past it a
// finding is still reported (Options.OnCorrupt) but not remembered: the
// scrub finds it again.
const maxSuspects = 4096

// suspects are chunks known to hold blocks failing their checksums (found
// by Verify, a scaled read, or a write's edge check), until verified clean
// or deleted. In memory only: after a restart the scrub finds them again.
type suspects struct {
	mu sync.Mutex
	m  map[ids.ChunkID]suspect
}

type suspect struct {
	version uint64
	bad     extent.List
}

func (t *suspects) add(id ids.ChunkID, version uint64, bad extent.List) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[ids.ChunkID]suspect{}
	}
	old, ok := t.m[id]
	switch {
	case ok && old.version == version:
		t.m[id] = suspect{version, bounded(old.bad.Union(bad))}
	case ok || len(t.m) < maxSuspects:
		t.m[id] = suspect{version, bounded(append(extent.List(nil), bad...))}
	}
}

// bounded cuts a list to maxSuspectExtents (still more than a report can
// list, so it reads as "more than can be said").
func bounded(l extent.List) extent.List {
	return l[:min(len(l), maxSuspectExtents)]
}

// carry moves id's findings from version old to new, a write committed in
// between, less the bytes [off, end) it rewrote. (A write never covers a
// bad block in part: it is refused as it begins. So the blocks it touched
// are whole again.)
func (t *suspects) carry(id ids.ChunkID, old, new uint64, off, end int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sp, ok := t.m[id]
	if !ok || sp.version != old {
		return
	}
	if bad := sp.bad.Remove(off, end-off); len(bad) > 0 {
		t.m[id] = suspect{new, bad}
	} else {
		delete(t.m, id)
	}
}

// clear forgets id's findings if they were about version (0: any).
func (t *suspects) clear(id ids.ChunkID, version uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.m[id]; ok && (version == 0 || old.version == version) {
		delete(t.m, id)
	}
}

// Suspect returns the bad extents found in id's copy at version, if any
// were found and it has not been verified clean since.
func (s *Store) Suspect(id ids.ChunkID, version uint64) extent.List {
	s.suspects.mu.Lock()
	defer s.suspects.mu.Unlock()
	if sp, ok := s.suspects.m[id]; ok && sp.version == version {
		return append(extent.List(nil), sp.bad...)
	}
	return nil
}

// NoteCorrupt records that bad of id's copy at version fail their
// checksums (a reader outside the store found it) and reports it.
func (s *Store) NoteCorrupt(id ids.ChunkID, version uint64, bad extent.List) {
	s.noteCorrupt(id, version, bad)
}

func (s *Store) noteCorrupt(id ids.ChunkID, version uint64, bad extent.List) {
	if len(bad) == 0 {
		return
	}
	s.suspects.add(id, version, bad)
	s.log.Error("store: chunk has blocks failing their checksums", "chunk", id, "version", version, "bad", bad)
	if s.onCorrupt != nil {
		s.onCorrupt(id, version, bad)
	}
}

// Heal puts back blocks of id's committed copy that fail their checksums:
// data is the chunk's bytes [off, off+len(data)) at version, whole blocks
// (the last may end at the chunk's length), from another replica or
// rebuilt from other units. Every block of data must match the checksum
// stored here, so healing restores what was committed and can never
// change it; blocks here that verify are left alone. The rewritten blocks
// are durable when it returns them. ErrBusy while a write is open,
// ErrStale if the chunk is not at version.
func (s *Store) Heal(id ids.ChunkID, version uint64, off int64, data []byte) (extent.List, error) {
	if !s.gate.enter() {
		return nil, fmt.Errorf("store: heal %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c, ok := s.chunks.acquireWriter(id)
	if !ok {
		return nil, fmt.Errorf("store: heal %v: a write is open: %w", id, ErrBusy)
	}
	defer s.chunks.release(id, c, true)
	healed, err := s.heal(id, c, version, off, data)
	if err != nil {
		return healed, fmt.Errorf("store: heal %v v%d [%d, +%d): %w", id, version, off, len(data), err)
	}
	return healed, nil
}

func (s *Store) heal(id ids.ChunkID, c *chunkState, version uint64, off int64, data []byte) (extent.List, error) {
	if err := s.settle(id, c); err != nil {
		return nil, err
	}
	info, err := s.loadInfo(id)
	if err != nil {
		return nil, err
	}
	bsize := int64(s.blockSize)
	end := off + int64(len(data))
	switch {
	case info.Version != version:
		return nil, fmt.Errorf("chunk is at version %d: %w", info.Version, ErrStale)
	case off < 0 || off%bsize != 0 || end > info.Length || (end%bsize != 0 && end != info.Length):
		return nil, fmt.Errorf("not whole blocks of a chunk of %d bytes: %w", info.Length, ErrRange)
	case len(data) == 0:
		return nil, nil
	}
	f, err := os.OpenFile(s.chunkPath(id), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open chunk file: %w", err)
	}
	defer f.Close()
	// Readers wait: none may see a block half rewritten.
	c.mu.Lock()
	defer c.mu.Unlock()
	view := &Read{s: s, id: id, c: c, info: info, page: -1}
	first, n := off/bsize, (end-off+bsize-1)/bsize
	sums, err := view.Checksums(int(first), int(n), make([]uint32, 0, n))
	if err != nil {
		return nil, err
	}
	cur := make([]byte, bsize)
	var healed extent.List
	for j, want := range sums {
		b := data[int64(j)*bsize : min(int64(j+1)*bsize, int64(len(data)))]
		at := off + int64(j)*bsize
		if got := crc32c.Checksum(b); got != want {
			return healed, fmt.Errorf("the block at %d given has crc %#08x, this copy's checksum is %#08x: %w", at, got, want, ErrCorrupt)
		}
		// A block that cannot be read (an I/O error) is rewritten too.
		if p := cur[:len(b)]; readFull(f, p, at) == nil && crc32c.Checksum(p) == want {
			continue
		}
		if err := s.writeAt(f, b, at); err != nil {
			return healed, fmt.Errorf("rewrite block at %d: %w", at, err)
		}
		healed = healed.Add(at, int64(len(b)))
	}
	if len(healed) > 0 {
		if err := fdatasync(f); err != nil {
			return nil, fmt.Errorf("sync healed blocks: %w", err)
		}
		s.log.Info("store: healed blocks", "chunk", id, "version", version, "healed", healed)
	}
	return healed, nil
}
