package store

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"

	"github.com/sluicefs/sluice/internal/ids"
)

// Write is an open write transaction on one byte range of one chunk. Its
// methods must not be called concurrently with each other.
type Write struct {
	s       *Store
	id      ids.ChunkID
	c       *chunkState
	version uint64
	old     Info  // committed state when the write began
	newLen  int64 // length after commit: max(old.Length, end)

	off, end int64 // the write covers [off, end)
	next     int64 // the next Place must start here
	ovEnd    int64 // [off, ovEnd) overwrites committed bytes and is staged

	f         *os.File // chunk file; nil for a zero-length write that changes nothing on disk
	created   bool     // this write created the chunk file
	appended  bool     // bytes went into the chunk file's append region
	stage     *os.File // staging file for [off, ovEnd); nil if nothing is overwritten
	stagePath string

	// crcs[i] accumulates the CRC32C of the part of block fb+i this write
	// covers. Place fills them in offset order; Commit completes the two
	// edge blocks.
	fb   int64
	crcs []uint32

	direct *directMap // the append region, mapped for direct placement

	state  writeState
	synced bool  // Sync made the placed bytes durable; Commit skips that step
	err    error // sticky I/O failure: the write can only be aborted
}

type writeState uint8

const (
	writeOpen writeState = iota
	writeCommitted
	writeAborted
	writeCrashed // a test hook stopped Commit as if the process died
)

// BeginWrite opens a write transaction on [off, off+length) of chunk id.
// version is the version this write will commit as; it must be
// Stat().Version+1, else ErrStale. version == 0 assigns the next version
// (the head replica does this); Write.Version reports it.
//
// Only one write per chunk may be open at a time: a second BeginWrite on
// the same chunk returns ErrBusy until the first commits or aborts.
// length may be 0 (a version bump, which also extends the chunk to off if
// off is beyond its end); off+length may not exceed MaxChunkSize (ErrRange).
func (s *Store) BeginWrite(id ids.ChunkID, off, length int64, version uint64) (*Write, error) {
	if !s.gate.enter() {
		return nil, fmt.Errorf("store: begin write %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	if off < 0 || length < 0 || off > s.maxChunk || length > s.maxChunk-off {
		return nil, fmt.Errorf("store: begin write %v [%d, +%d): max chunk size is %d: %w",
			id, off, length, s.maxChunk, ErrRange)
	}
	c, ok := s.chunks.acquireWriter(id)
	if !ok {
		return nil, fmt.Errorf("store: begin write %v: another write is open: %w", id, ErrBusy)
	}
	w := &Write{s: s, id: id, c: c, off: off, end: off + length, next: off}
	if err := w.begin(version); err != nil {
		w.closeFiles()
		if w.stagePath != "" {
			_ = os.Remove(w.stagePath)
		}
		s.chunks.release(id, c, true)
		return nil, fmt.Errorf("store: begin write %v [%d, +%d) v%d: %w", id, off, length, version, err)
	}
	return w, nil
}

func (w *Write) begin(version uint64) error {
	s := w.s
	if err := s.settle(w.id, w.c); err != nil {
		return err
	}
	old, err := s.loadInfo(w.id)
	if err != nil {
		return err
	}
	switch {
	case version == 0:
		version = old.Version + 1
	case version != old.Version+1:
		return fmt.Errorf("chunk is at version %d, want %d: %w", old.Version, old.Version+1, ErrStale)
	}
	w.version, w.old = version, old
	w.newLen = max(old.Length, w.end)
	w.ovEnd = min(w.end, old.Length)

	if w.end > w.off || w.newLen > old.Length {
		if err := w.openChunkFile(); err != nil {
			return err
		}
	}
	if w.ovEnd > w.off {
		w.stagePath = s.stagingPath(w.id, version)
		f, err := os.OpenFile(w.stagePath, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return fmt.Errorf("create staging file: %w", err)
		}
		w.stage = f
	}
	if w.end > w.off {
		w.fb = w.off >> s.blockShift
		lb := (w.end - 1) >> s.blockShift
		w.crcs = make([]uint32, lb-w.fb+1)
	}
	w.setupDirect()
	return nil
}

// openChunkFile opens (or creates) the chunk file and cuts off anything
// beyond the committed length: bytes an aborted or crashed write left in
// the append region would otherwise show through holes this write leaves.
func (w *Write) openChunkFile() error {
	path := w.s.chunkPath(w.id)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if w.old.Length > 0 {
			return fmt.Errorf("chunk file %s missing for committed length %d: %w", path, w.old.Length, ErrCorrupt)
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		w.created = err == nil
	}
	if err != nil {
		return fmt.Errorf("open chunk file: %w", err)
	}
	w.f = f
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat chunk file: %w", err)
	}
	if fi.Size() > w.old.Length {
		// Rare (only after an abort whose cleanup failed, or a crash), so
		// pay for a sync: the cut must be durable before this write's data
		// lands beyond it, or a crash could resurrect the garbage.
		if err := f.Truncate(w.old.Length); err != nil {
			return fmt.Errorf("truncate uncommitted tail of chunk file: %w", err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("sync truncated chunk file: %w", err)
		}
		w.s.log.Debug("store: cut uncommitted tail", "chunk", w.id, "size", fi.Size(), "length", w.old.Length)
	}
	return nil
}

// Version returns the version this write commits as.
func (w *Write) Version() uint64 { return w.version }

// Place writes p at absolute chunk offset off. Calls come in increasing,
// contiguous offset order and together cover the write's range exactly;
// anything else is ErrRange. p is not retained.
//
// This is the per-packet hot path: no allocation, one pwrite (two when the
// packet straddles the committed length), and the packet's CRC computed
// here while it is still in cache.
func (w *Write) Place(off int64, p []byte) error {
	if w.state != writeOpen {
		return fmt.Errorf("store: place %v at %d: write is finished: %w", w.id, off, ErrClosed)
	}
	if w.err != nil {
		return w.err
	}
	n := int64(len(p))
	if off != w.next || n > w.end-off {
		return fmt.Errorf("store: place %v [%d, +%d): expected the next packet at %d, write ends at %d: %w",
			w.id, off, n, w.next, w.end, ErrRange)
	}
	if n == 0 {
		return nil
	}
	w.accumulate(off, p)

	// Overwritten bytes go to staging, the rest straight into the chunk.
	q, pos := p, off
	if pos < w.ovEnd {
		k := min(n, w.ovEnd-pos)
		if _, err := w.stage.WriteAt(q[:k], pos-w.off); err != nil {
			w.err = fmt.Errorf("store: place %v [%d, +%d): write staging file: %w", w.id, pos, k, err)
			return w.err
		}
		q, pos = q[k:], pos+k
	}
	if len(q) > 0 && w.isDirect(pos, q) {
		// Already in place: the fabric received it into the mapping.
		q = nil
	}
	if len(q) > 0 {
		if _, err := w.f.WriteAt(q, pos); err != nil {
			w.err = fmt.Errorf("store: place %v [%d, +%d): write chunk file: %w", w.id, pos, len(q), err)
			return w.err
		}
		w.appended = true
	}
	w.next = off + n
	return nil
}

// accumulate folds p, placed at off, into the per-block CRCs. Places are
// contiguous, so each block's covered part arrives in order and continuing
// the CRC with crc32.Update is the combine step at no extra cost.
func (w *Write) accumulate(off int64, p []byte) {
	shift := w.s.blockShift
	bsize := int64(1) << shift
	for len(p) > 0 {
		b := off >> shift
		k := min(int64(len(p)), (b+1)*bsize-off)
		i := b - w.fb
		w.crcs[i] = crc32.Update(w.crcs[i], castagnoli, p[:k])
		p, off = p[k:], off+k
	}
}

// Abort discards the write: nothing of it becomes visible, committed data
// is untouched and the chunk is free for the next write. It is a no-op
// after Commit and when called again.
func (w *Write) Abort() {
	if w.state != writeOpen {
		if w.state == writeCrashed {
			w.closeFiles()
		}
		return
	}
	w.state = writeAborted
	// A packet may still be arriving into the mapped region: the cleanup
	// waits for it (see directMap).
	w.closeDirect(func() {
		w.discard()
		w.s.chunks.release(w.id, w.c, true)
	})
}

// discard removes what the write left on disk. Failures only cost space:
// the next BeginWrite cuts the chunk file back to its committed length and
// Open clears staging, so they are logged, not returned.
func (w *Write) discard() {
	if w.f != nil {
		var err error
		if w.created && w.old.Version == 0 {
			// A chunk that never committed: drop the file altogether.
			err = os.Remove(w.f.Name())
		} else if w.appended || w.newLen > w.old.Length {
			err = w.f.Truncate(w.old.Length)
		}
		if err != nil {
			w.s.log.Warn("store: abort: cleaning chunk file", "chunk", w.id, "err", err)
		}
	}
	if w.stage != nil {
		if err := os.Remove(w.stagePath); err != nil {
			w.s.log.Warn("store: abort: removing staging file", "chunk", w.id, "err", err)
		}
	}
	w.closeFiles()
}

func (w *Write) closeFiles() {
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
	if w.stage != nil {
		_ = w.stage.Close()
		w.stage = nil
	}
}
