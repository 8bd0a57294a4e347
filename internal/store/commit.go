package store

import (
	"fmt"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/admit"
)

// Commit makes the write durable and visible atomically. ErrIncomplete if
// not every byte was placed (the write stays open). On a nil error the
// data, the new length (max(old, off+length)), the new version and the
// block checksums are durable.
//
// The order is what makes a crash at any point safe:
//
//  1. fdatasync the chunk file's append region and the staging file; until
//     step 2 these bytes are invisible (beyond the committed length, or in
//     staging).
//  2. One synced pebble batch: new Info, changed checksum pages and, for an
//     overwrite, a redo record. This is the commit point.
//  3. Copy staged bytes into the chunk file (under the chunk's exclusive
//     lock, so no reader sees the new version with old bytes).
//  4. fdatasync the chunk file, delete the redo record (unsynced: replaying
//     it is harmless), remove the staging file.
//
// A failure before the commit point aborts the write. A failure after it
// returns an error although the write is committed (the returned Info is
// then valid): the redo record stays and the chunk is repaired before
// anyone uses it again. Calling Abort after any error is always safe.
func (w *Write) Commit() (Info, error) {
	switch {
	case w.state != writeOpen:
		return Info{}, fmt.Errorf("store: commit %v v%d: write is finished: %w", w.id, w.version, ErrClosed)
	case w.err != nil:
		return Info{}, w.err
	case w.next != w.end:
		return Info{}, fmt.Errorf("store: commit %v v%d: placed [%d, %d) of [%d, %d): %w",
			w.id, w.version, w.off, w.next, w.off, w.end, ErrIncomplete)
	}
	s := w.s
	if !s.gate.enter() {
		return Info{}, fmt.Errorf("store: commit %v v%d: %w", w.id, w.version, ErrClosed)
	}
	defer s.gate.exit()

	info := Info{Version: w.version, Length: w.newLen, Tag: w.tag}
	published, err := w.commit(info)
	switch {
	case w.state == writeCrashed:
		return Info{}, err
	case err != nil && !published:
		w.state = writeAborted
		w.closeDirect(func() {
			w.discard()
			s.chunks.release(w.id, w.c, true)
		})
		return Info{}, fmt.Errorf("store: commit %v v%d: %w", w.id, w.version, err)
	}
	w.state = writeCommitted
	bs := int64(s.blockSize)
	s.suspects.carry(w.id, w.old.Version, w.version, w.off/bs*bs, (w.end+bs-1)/bs*bs)
	s.usedBytes.Add(info.Length - w.old.Length)
	if w.old.Version == 0 {
		s.numChunks.Add(1)
	}
	w.closeFiles()
	s.chunks.release(w.id, w.c, true)
	if err != nil {
		return info, fmt.Errorf("store: commit %v v%d: committed, but: %w", w.id, w.version, err)
	}
	return info, nil
}

// commit runs the steps above; published reports whether the commit point
// was passed.
func (w *Write) commit(info Info) (published bool, err error) {
	s := w.s
	if !w.synced {
		if err := w.syncData(); err != nil {
			return false, err
		}
	}
	// Every byte is placed and durable; a replica forwarding from the
	// mapped pages has finished before it commits. The mapping is done.
	w.closeDirect(func() {})

	b := s.db.NewBatch()
	defer b.Close()
	bufp := s.getCopyBuf()
	defer s.putCopyBuf(bufp)
	if err := w.stageChecksums(b, *bufp); err != nil {
		return false, err
	}
	if err := b.Set(infoKey(w.id), encodeInfo(info), nil); err != nil {
		return false, fmt.Errorf("batch info: %w", err)
	}
	if w.doubt {
		// This write resolves the chunk's unresolved one (see Doubt).
		if err := b.Delete(doubtKey(w.id), nil); err != nil {
			return false, fmt.Errorf("batch doubt record: %w", err)
		}
	}
	var redo redoRecord
	if w.stage != nil {
		redo = redoRecord{Version: w.version, Off: w.off, Len: w.ovEnd - w.off}
		if err := b.Set(redoKey(w.id), redo.encode(), nil); err != nil {
			return false, fmt.Errorf("batch redo record: %w", err)
		}
	}
	if err := w.crashHook(s.hooks.beforeIndexCommit); err != nil {
		return false, err
	}

	w.c.mu.Lock()
	// A fence excludes commits while it reads the chunk's state (Fence).
	_, d := admit.Step(w.view(), admit.Commit{})
	if d.Err != nil {
		w.c.mu.Unlock()
		return false, d.Err
	}
	if err := b.Commit(pebble.Sync); err != nil {
		w.c.mu.Unlock()
		return false, fmt.Errorf("commit index batch: %w", err)
	}
	if s.onChange != nil {
		s.onChange(w.id)
	}
	if d.ClearDoubt {
		s.doubts.clear(w.id)
	}
	if err := w.crashHook(s.hooks.afterIndexCommit); err != nil {
		w.c.mu.Unlock()
		return true, err
	}
	if w.stage == nil {
		w.c.mu.Unlock()
		return true, nil
	}
	if h := s.hooks.applyFault; h != nil {
		err = h()
	}
	if err == nil {
		err = copyRange(w.f, redo.Off, w.stage, 0, redo.Len, *bufp)
	}
	if err != nil {
		w.c.redoPending.Store(true)
		w.c.mu.Unlock()
		return true, fmt.Errorf("apply staged bytes: %w", err)
	}
	w.c.mu.Unlock()
	// Readers now see the applied bytes through the page cache; the redo
	// record keeps them durable until this sync.
	if err := fdatasync(w.f); err != nil {
		w.c.redoPending.Store(true)
		return true, fmt.Errorf("sync applied bytes: %w", err)
	}
	w.finishRedo()
	return true, nil
}

// Sync makes every placed byte durable without making the write visible:
// the expensive part of Commit, which a replica can overlap with waiting
// for its downstream replicas before it publishes with Commit (or drops
// everything with Abort). All bytes must have been placed.
func (w *Write) Sync() error {
	switch {
	case w.state != writeOpen:
		return fmt.Errorf("store: sync %v v%d: write is finished: %w", w.id, w.version, ErrClosed)
	case w.err != nil:
		return w.err
	case w.next != w.end:
		return fmt.Errorf("store: sync %v v%d: placed [%d, %d) of [%d, %d): %w",
			w.id, w.version, w.off, w.next, w.off, w.end, ErrIncomplete)
	}
	if err := w.syncData(); err != nil {
		w.err = fmt.Errorf("store: sync %v v%d: %w", w.id, w.version, err)
		return w.err
	}
	w.synced = true
	return nil
}

// syncData makes everything the write put on disk durable before the
// commit point.
func (w *Write) syncData() error {
	if err := w.syncDirect(); err != nil {
		return err
	}
	if w.f != nil {
		if w.end == w.off && w.newLen > w.fileSize {
			// A zero-length write that extends the chunk: the new tail is
			// a hole, but the file must reach the new length.
			if err := w.f.Truncate(w.newLen); err != nil {
				return fmt.Errorf("extend chunk file: %w", err)
			}
		}
		switch {
		case w.punched:
			// A punched hole is a change of the file's block map: fsync,
			// not just fdatasync, so it cannot come back as stale data.
			if err := w.f.Sync(); err != nil {
				return fmt.Errorf("sync chunk file: %w", err)
			}
		case w.appended || w.newLen > w.old.Length:
			if err := fdatasync(w.f); err != nil {
				return fmt.Errorf("sync chunk file: %w", err)
			}
		}
		if w.created {
			if err := syncDir(filepath.Dir(w.f.Name())); err != nil {
				return fmt.Errorf("sync chunk directory: %w", err)
			}
		}
	}
	if w.stage != nil {
		if err := fdatasync(w.stage); err != nil {
			return fmt.Errorf("sync staging file: %w", err)
		}
		// The redo record will name this file: it must survive a crash.
		if err := syncDir(filepath.Dir(w.stagePath)); err != nil {
			return fmt.Errorf("sync staging directory: %w", err)
		}
	}
	return nil
}

// finishRedo drops the redo record and the staging file once the staged
// bytes are applied and synced. The delete is not synced: if it is lost,
// Open finds the record again and either re-applies it (idempotent) or,
// the staging file being gone, knows it was applied — the file is only
// removed after the apply was synced.
func (w *Write) finishRedo() {
	s := w.s
	if err := s.db.Delete(redoKey(w.id), pebble.NoSync); err != nil {
		s.log.Warn("store: commit: deleting redo record", "chunk", w.id, "err", err)
		return // keep the staging file: the record still names it
	}
	_ = w.stage.Close()
	w.stage = nil
	if err := removeFile(w.stagePath); err != nil {
		s.log.Warn("store: commit: removing staging file", "chunk", w.id, "err", err)
	}
}

// crashHook runs a test hook; a non-nil result stops the commit as if the
// process died here, leaving everything on disk as it is.
func (w *Write) crashHook(h func() error) error {
	if h == nil {
		return nil
	}
	if err := h(); err != nil {
		w.state = writeCrashed
		return err
	}
	return nil
}
