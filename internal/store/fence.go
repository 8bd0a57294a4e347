package store

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/admit"
	"github.com/sluicefs/sluice/internal/ids"
)

// A fence is the lowest epoch a write to a chunk must have been planned
// on (see docs/failures.md): meta changes a chunk's replica set at a new
// epoch and has every member fenced at it, so that a writer holding the
// old layout can no longer commit anywhere. A write declares its epoch
// (Write.Planned); it is refused with ErrFenced when it begins and, in
// case the fence came meanwhile, when it commits. Fences are durable, and
// outlive Delete (a rebuild deletes the copy it replaces) and Drop. A
// tombstone (tombstone.go) is a fence no epoch passes.
//
//	e <id>   -> fence epoch (u64); for a tombstone, tombstoneEpoch and
//	            the time it is kept until (unix ns, i64)

const kindFence = 'e'

func fenceKey(id ids.ChunkID) []byte { return chunkKey(kindFence, id) }

// fenceRec is one chunk's fence; until is set for a tombstone only.
type fenceRec struct {
	epoch uint64
	until int64
}

func (f fenceRec) tombstone() bool { return f.epoch == tombstoneEpoch }

func (f fenceRec) encode() []byte {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 16), f.epoch)
	if f.tombstone() {
		v = binary.BigEndian.AppendUint64(v, uint64(f.until))
	}
	return v
}

func decodeFence(v []byte) (fenceRec, error) {
	switch len(v) {
	case 8:
		return fenceRec{epoch: binary.BigEndian.Uint64(v)}, nil
	case 16:
		f := fenceRec{epoch: binary.BigEndian.Uint64(v), until: int64(binary.BigEndian.Uint64(v[8:]))}
		if !f.tombstone() {
			return fenceRec{}, fmt.Errorf("fence value of 16 bytes at epoch %d: %w", f.epoch, ErrCorrupt)
		}
		return f, nil
	}
	return fenceRec{}, fmt.Errorf("fence value of %d bytes: %w", len(v), ErrCorrupt)
}

// fences is the in-memory copy of the fence records: a chunk never
// fenced costs a write one map lookup.
type fences struct {
	mu sync.Mutex
	m  map[ids.ChunkID]fenceRec
}

func (fs *fences) get(id ids.ChunkID) fenceRec {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.m[id]
}

func (fs *fences) set(id ids.ChunkID, f fenceRec) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[ids.ChunkID]fenceRec{}
	}
	fs.m[id] = f
}

func (fs *fences) remove(id ids.ChunkID) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	delete(fs.m, id)
}

// view describes id at committed version for admission: its fence and
// doubt from memory. The caller holds what keeps them stable enough for
// its decision (the chunk's write, or its commit lock).
func (s *Store) view(id ids.ChunkID, version uint64) admit.Chunk {
	c := admit.Chunk{ID: id, Version: version, Fence: s.fences.get(id).epoch}
	c.Doubt, c.InDoubt = s.doubts.get(id)
	return c
}

// raiseFence records what a step decided of id's fence.
func (s *Store) raiseFence(id ids.ChunkID, next admit.Chunk, d admit.Decision) error {
	if !d.SaveFence {
		return nil
	}
	f := fenceRec{epoch: next.Fence}
	if err := s.db.Set(fenceKey(id), f.encode(), pebble.Sync); err != nil {
		return err
	}
	s.fences.set(id, f)
	return nil
}

// FenceState is what a fence found: the chunk's committed state, final
// for every write planned before the fence.
type FenceState struct {
	Info  Info
	Doubt bool // the head holds an unresolved write (see Doubt)
	Fence uint64
}

// Fence raises id's fence to epoch (never lowers it) and reports the
// chunk's committed state. It excludes commits while it runs, so no
// write planned before epoch commits after it has returned; the state it
// reports is the last such writes left. The chunk need not exist; a
// chunk with a tombstone is ErrDeleted.
func (s *Store) Fence(id ids.ChunkID, epoch uint64) (FenceState, error) {
	if !s.gate.enter() {
		return FenceState{}, fmt.Errorf("store: fence %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c := s.chunks.acquire(id)
	defer s.chunks.release(id, c, false)
	if err := s.settle(id, c); err != nil {
		return FenceState{}, fmt.Errorf("store: fence %v: %w", id, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next, d := admit.Step(s.view(id, 0), admit.Fence{Epoch: epoch})
	if d.Err != nil {
		return FenceState{}, fmt.Errorf("store: fence %v: %w", id, d.Err)
	}
	if err := s.raiseFence(id, next, d); err != nil {
		return FenceState{}, fmt.Errorf("store: fence %v: %w", id, err)
	}
	info, err := s.loadInfo(id)
	if err != nil {
		return FenceState{}, fmt.Errorf("store: fence %v: %w", id, err)
	}
	_, doubt := s.doubts.get(id)
	return FenceState{Info: info, Doubt: doubt, Fence: s.fences.get(id).epoch}, nil
}

// Drop deletes id for good (garbage collection of a copy meta moved
// elsewhere). Its fence stays: a writer holding a layout from before the
// move must still be refused here, not create the chunk anew where
// nobody will look for it. (A chunk meta deleted altogether gets a
// Tombstone instead.)
func (s *Store) Drop(id ids.ChunkID) error { return s.Delete(id) }

// DropAt discards id's copy for a reconciliation planned at epoch that
// found it at version (it saw no complete write to keep): it raises the
// fence to epoch, and deletes only if no later reconciliation fenced the
// chunk and it is still at version — all under the chunk's write
// ownership, so a later repair's copy cannot land in between and go.
// ErrFenced, ErrStale, ErrBusy (a write is open) otherwise.
func (s *Store) DropAt(id ids.ChunkID, epoch, version uint64) error {
	if !s.gate.enter() {
		return fmt.Errorf("store: drop %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c, ok := s.chunks.acquireWriter(id)
	if !ok {
		return fmt.Errorf("store: drop %v: a write is open: %w", id, ErrBusy)
	}
	defer s.chunks.release(id, c, true)
	if err := s.settle(id, c); err != nil {
		return fmt.Errorf("store: drop %v: %w", id, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	info, err := s.loadInfo(id)
	if err != nil {
		return fmt.Errorf("store: drop %v: %w", id, err)
	}
	next, d := admit.Step(s.view(id, info.Version), admit.Drop{Epoch: epoch, Version: version})
	if err := s.raiseFence(id, next, d); err != nil {
		return fmt.Errorf("store: drop %v: %w", id, err)
	}
	if d.Err != nil {
		return fmt.Errorf("store: drop %v: %w", id, d.Err)
	}
	if err := s.delete(id); err != nil {
		return fmt.Errorf("store: drop %v: %w", id, err)
	}
	c.redoPending.Store(false)
	return nil
}

// loadFences reads every fence record into memory at open.
func (s *Store) loadFences() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{kindFence}, UpperBound: []byte{kindFence + 1}})
	if err != nil {
		return fmt.Errorf("scan fence records: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		id, err := chunkIDFromKey(it.Key())
		var f fenceRec
		if err == nil {
			f, err = decodeFence(it.Value())
		}
		if err != nil {
			it.Close()
			return fmt.Errorf("scan fence records: %w", err)
		}
		s.fences.set(id, f)
	}
	return it.Close()
}

// ResolveDoubt clears id's unresolved write if the chunk is still at
// version: the caller made sure no replica holds the write any more
// (every member was fenced and is at version). ErrBusy while a write is
// open.
func (s *Store) ResolveDoubt(id ids.ChunkID, version uint64) error {
	if !s.gate.enter() {
		return fmt.Errorf("store: resolve doubt %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c, ok := s.chunks.acquireWriter(id)
	if !ok {
		return fmt.Errorf("store: resolve doubt %v: a write is open: %w", id, ErrBusy)
	}
	defer s.chunks.release(id, c, true)
	info, err := s.loadInfo(id)
	if err != nil {
		return fmt.Errorf("store: resolve doubt %v: %w", id, err)
	}
	if _, d := admit.Step(s.view(id, info.Version), admit.Resolve{Version: version}); !d.ClearDoubt {
		return nil
	}
	if err := s.db.Delete(doubtKey(id), pebble.Sync); err != nil {
		return fmt.Errorf("store: resolve doubt %v: %w", id, err)
	}
	s.doubts.clear(id)
	return nil
}
