package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
)

// Redo records finish overwrites that committed but whose staged bytes
// may not have reached the chunk file: after a crash (replayAll, on Open)
// or after an I/O error during Commit (settle, on the chunk's next use).

// settle applies id's pending redo record, if Commit left one behind.
func (s *Store) settle(id ids.ChunkID, c *chunkState) error {
	if !c.redoPending.Load() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.redoPending.Load() {
		return nil
	}
	if err := s.replay(id); err != nil {
		return fmt.Errorf("apply pending redo: %w", err)
	}
	c.redoPending.Store(false)
	return nil
}

// replayAll applies every redo record, then removes staging files no
// record names: they belong to writes that never reached their commit
// point.
func (s *Store) replayAll() error {
	it, err := s.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{kindRedo},
		UpperBound: []byte{kindRedo + 1},
	})
	if err != nil {
		return fmt.Errorf("scan redo records: %w", err)
	}
	var pending []ids.ChunkID
	for ok := it.First(); ok; ok = it.Next() {
		id, err := chunkIDFromKey(it.Key())
		if err != nil {
			it.Close()
			return fmt.Errorf("scan redo records: %w", err)
		}
		pending = append(pending, id)
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("scan redo records: %w", err)
	}
	for _, id := range pending {
		if err := s.replay(id); err != nil {
			return fmt.Errorf("replay redo of %v: %w", id, err)
		}
	}
	return s.clearStaging()
}

// replay applies id's redo record, if any, and deletes it. Applying is
// idempotent: the staging file is immutable and only removed once the
// record is gone or the apply is synced, so a missing staging file means
// the bytes are already in place.
func (s *Store) replay(id ids.ChunkID) error {
	v, closer, err := s.db.Get(redoKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read redo record: %w", err)
	}
	rec, err := decodeRedo(v)
	closer.Close()
	if err != nil {
		return err
	}
	stagePath := s.stagingPath(id, rec.Version)
	stage, err := os.Open(stagePath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		s.log.Debug("store: redo already applied", "chunk", id, "version", rec.Version)
	case err != nil:
		return fmt.Errorf("open staging file: %w", err)
	default:
		err := s.applyStaged(id, rec, stage)
		stage.Close()
		if err != nil {
			return err
		}
		s.log.Info("store: replayed redo", "chunk", id, "version", rec.Version, "off", rec.Off, "len", rec.Len)
	}
	if err := s.db.Delete(redoKey(id), pebble.Sync); err != nil {
		return fmt.Errorf("delete redo record: %w", err)
	}
	if err := removeFile(stagePath); err != nil {
		return fmt.Errorf("remove staging file: %w", err)
	}
	return nil
}

// applyStaged copies a redo record's staged bytes into the chunk file and
// syncs them.
func (s *Store) applyStaged(id ids.ChunkID, rec redoRecord, stage *os.File) error {
	fi, err := stage.Stat()
	if err != nil {
		return fmt.Errorf("stat staging file: %w", err)
	}
	if fi.Size() < rec.Len {
		return fmt.Errorf("staging file %s has %d bytes, redo record wants %d: %w",
			stage.Name(), fi.Size(), rec.Len, ErrCorrupt)
	}
	f, err := os.OpenFile(s.chunkPath(id), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open chunk file: %w", err)
	}
	defer f.Close()
	bufp := s.getCopyBuf()
	defer s.putCopyBuf(bufp)
	if err := copyRange(f, rec.Off, stage, 0, rec.Len, *bufp); err != nil {
		return fmt.Errorf("apply staged bytes: %w", err)
	}
	if err := fdatasync(f); err != nil {
		return fmt.Errorf("sync applied bytes: %w", err)
	}
	return nil
}

// clearStaging removes every file in the staging directory. Called after
// all redo records are replayed, so none of them is needed.
func (s *Store) clearStaging() error {
	dir := filepath.Join(s.dir, stagingDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list staging: %w", err)
	}
	for _, e := range ents {
		if err := removeFile(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clear staging: %w", err)
		}
		s.log.Debug("store: removed uncommitted staging file", "name", e.Name())
	}
	return nil
}
