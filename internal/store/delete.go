package store

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
)

// Delete removes id's data and metadata. ErrBusy while a write on it is
// open; it waits for open reads. Deleting an unknown chunk is not an error.
func (s *Store) Delete(id ids.ChunkID) error {
	if !s.gate.enter() {
		return fmt.Errorf("store: delete %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	return s.deleteOpen(id)
}

// deleteOpen is Delete for a caller inside the gate.
func (s *Store) deleteOpen(id ids.ChunkID) error {
	c, ok := s.chunks.acquireWriter(id)
	if !ok {
		return fmt.Errorf("store: delete %v: a write is open: %w", id, ErrBusy)
	}
	defer s.chunks.release(id, c, true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := s.delete(id); err != nil {
		return fmt.Errorf("store: delete %v: %w", id, err)
	}
	c.redoPending.Store(false) // its redo record went with the rest
	return nil
}

// delete removes metadata first: once that is durable the chunk is gone
// (a file left behind by a crash holds only stale bytes past length 0).
func (s *Store) delete(id ids.ChunkID) error {
	info, err := s.loadInfo(id)
	if err != nil {
		return err
	}
	var stagePath string
	v, closer, err := s.db.Get(redoKey(id))
	switch {
	case err == nil:
		rec, derr := decodeRedo(v)
		closer.Close()
		if derr == nil {
			stagePath = s.stagingPath(id, rec.Version)
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("read redo record: %w", err)
	}

	b := s.db.NewBatch()
	defer b.Close()
	if err := errors.Join(b.Delete(infoKey(id), nil), b.Delete(redoKey(id), nil), b.Delete(doubtKey(id), nil)); err != nil {
		return fmt.Errorf("batch delete: %w", err)
	}
	// Pages exist only for blocks below the committed length, so point
	// deletes cover them all (at most 256 for a 1 GiB chunk of 16 KiB
	// blocks); a range tombstone would tax every later index read until
	// compacted away.
	nb := (info.Length + int64(s.blockSize) - 1) >> s.blockShift
	for page := int64(0); page*crcsPerPage < nb; page++ {
		if err := b.Delete(pageKey(id, page), nil); err != nil {
			return fmt.Errorf("batch delete: %w", err)
		}
	}
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("commit delete: %w", err)
	}
	if s.onChange != nil {
		s.onChange(id)
	}
	s.doubts.clear(id)
	s.suspects.clear(id, 0)
	if info.Version != 0 {
		s.usedBytes.Add(-info.Length)
		s.numChunks.Add(-1)
	}
	if err := s.pool.put(s.chunkPath(id)); err != nil {
		return fmt.Errorf("recycle chunk file: %w", err)
	}
	if stagePath != "" {
		if err := removeFile(stagePath); err != nil {
			return fmt.Errorf("remove staging file: %w", err)
		}
	}
	return nil
}
