package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sluicefs/sluice/internal/admit"
	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/ids"
)

// Write is an open write transaction on one byte range of one chunk. Its
// methods must not be called concurrently with each other.
type Write struct {
	s       *Store
	id      ids.ChunkID
	c       *chunkState
	version uint64
	epoch   uint64 // the epoch the write was planned on (Planned)
	old     Info   // committed state when the write began
	newLen  int64  // length after commit: max(old.Length, end)

	off, end int64 // the write covers [off, end)
	next     int64 // the next Place must start here
	ovEnd    int64 // [off, ovEnd) overwrites committed bytes and is staged

	f         *os.File // chunk file; nil for a zero-length write that changes nothing on disk
	fileSize  int64    // size of the chunk file when opened (it may exceed the committed length)
	created   bool     // this write created the chunk file (perhaps from a recycled one)
	punched   bool     // zeroGap changed the file's layout: sync metadata too
	appended  bool     // bytes went into the chunk file's append region
	stage     *os.File // staging file for [off, ovEnd); nil if nothing is overwritten
	stagePath string

	// crcs[i] accumulates the CRC32C of the part of block fb+i this write
	// covers. Place fills them in offset order; Commit completes the two
	// edge blocks.
	fb   int64
	crcs []uint32

	direct *directMap // the append region, mapped for direct placement

	tag    uint64 // recorded in the committed Info
	head   bool   // the version was chosen here (BeginHead)
	base   uint64 // the oldest version replicas may hold (see Doubt)
	doubt  bool   // a doubt record exists: commit deletes it
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
// Stat().Version+1, else ErrStale. version == 0 is BeginHead with no tag.
//
// Only one write per chunk may be open at a time: a second BeginWrite on
// the same chunk returns ErrBusy until the first commits or aborts.
// length may be 0 (a version bump, which also extends the chunk to off if
// off is beyond its end); off+length may not exceed MaxChunkSize (ErrRange).
func (s *Store) BeginWrite(id ids.ChunkID, off, length int64, version uint64) (*Write, error) {
	if version == 0 {
		return s.BeginHead(id, off, length, 0)
	}
	return s.beginWrite(id, off, length, version, version-1, 0, false)
}

// BeginHead opens a write on the head replica, which assigns versions: the
// chunk's next one, unless an unresolved write (Doubt) decides otherwise
// or refuses this one (ErrInDoubt). tag identifies the logical write
// across retries (SetTag); Version and Base report what was chosen, for
// the replicas below.
func (s *Store) BeginHead(id ids.ChunkID, off, length int64, tag uint64) (*Write, error) {
	return s.beginWrite(id, off, length, 0, 0, tag, true)
}

// BeginFollow opens a write a head chose version for: the chunk must be
// at a version from base to version-1 (base < version-1 when it skips the
// versions of an unresolved write it covers, see Doubt), else ErrStale.
func (s *Store) BeginFollow(id ids.ChunkID, off, length int64, version, base uint64) (*Write, error) {
	if err := admit.CheckFollow(version, base); err != nil {
		return nil, fmt.Errorf("store: begin write %v: %w", id, err)
	}
	return s.beginWrite(id, off, length, version, base, 0, false)
}

func (s *Store) beginWrite(id ids.ChunkID, off, length int64, version, base, tag uint64, head bool) (*Write, error) {
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
		// The writer lock is the chunk's open write: admission refuses
		// a second one.
		var ev admit.Event = admit.BeginFollow{Version: version, Base: base, Tag: tag}
		if head {
			ev = admit.BeginHead{Off: off, End: off + length, Tag: tag}
		}
		_, d := admit.Step(admit.Chunk{ID: id, Open: true}, ev)
		return nil, fmt.Errorf("store: begin write %v: %w", id, d.Err)
	}
	w := &Write{s: s, id: id, c: c, off: off, end: off + length, next: off, tag: tag, head: head, base: base}
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
	if s.fences.get(w.id).tombstone() {
		// Refused before anything is created; Commit checks again.
		return errDeleted(w.id)
	}
	if err := s.settle(w.id, w.c); err != nil {
		return err
	}
	old, err := s.loadInfo(w.id)
	if err != nil {
		return err
	}
	// The writer lock makes the doubt stable until this write ends.
	c := s.view(w.id, old.Version)
	var ev admit.Event = admit.BeginFollow{Version: version, Base: w.base}
	if w.head {
		if d := c.Doubt; c.InDoubt && d.Base != old.Version {
			return fmt.Errorf("doubt record %+v for a chunk at version %d: %w", d, old.Version, ErrCorrupt)
		}
		ev = admit.BeginHead{Off: w.off, End: w.end, Tag: w.tag}
	}
	next, d := admit.Step(c, ev)
	if d.Err != nil {
		return d.Err
	}
	version, w.base, w.doubt = d.Version, d.Base, next.Write.Resolves
	w.version, w.old = version, old
	w.newLen = max(old.Length, w.end)
	w.ovEnd = min(w.end, old.Length)

	if w.end > w.off || w.newLen > old.Length {
		if err := s.checkReserve(); err != nil {
			return err
		}
		if err := w.openChunkFile(); err != nil {
			return err
		}
	}
	if err := w.checkEdges(); err != nil {
		return err
	}
	if w.ovEnd > w.off {
		w.stagePath = s.stagingPath(w.id, version)
		f, err := s.create(w.stagePath, os.O_TRUNC)
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

// openChunkFile opens the chunk file, or makes a new one (from a
// recycled file when the pool has one), then zeroes the gap between the
// committed length and this write.
func (w *Write) openChunkFile() error {
	path := w.s.chunkPath(w.id)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if w.old.Length > 0 {
			return fmt.Errorf("chunk file %s missing for committed length %d: %w", path, w.old.Length, ErrCorrupt)
		}
		if ok, rerr := w.s.pool.take(path, w.end); rerr == nil && ok {
			f, err = os.OpenFile(path, os.O_RDWR, 0)
		} else {
			f, err = w.s.create(path, os.O_EXCL)
		}
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
	w.fileSize = fi.Size()
	return w.zeroGap()
}

// zeroGap makes [committed length, start of this write) read as zeros.
// The file may hold stale bytes there — from a recycled file, an aborted
// write or a crash — which a hole in the chunk must not expose. Bytes
// past the end of this write stay stale and stay invisible.
func (w *Write) zeroGap() error {
	from, to := w.old.Length, min(w.off, w.fileSize)
	if to <= from {
		return nil
	}
	err := unix.Fallocate(int(w.f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, from, to-from)
	if err != nil {
		// No hole punching here: write the zeros.
		if err = writeZeros(w.f, from, to-from); err != nil && w.s.noSpace(err) {
			err = writeZeros(w.f, from, to-from)
		}
		if err != nil {
			return fmt.Errorf("zero the gap before the write: %w", err)
		}
	}
	w.punched, w.appended = true, true // syncData must make it durable
	return nil
}

func writeZeros(f *os.File, off, n int64) error {
	zeros := make([]byte, min(n, 1<<20))
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if _, err := f.WriteAt(zeros[:k], off); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// Version returns the version this write commits as.
func (w *Write) Version() uint64 { return w.version }

// Planned records the epoch the write was planned on (its capability's)
// and refuses it with ErrFenced if the chunk is fenced past it; Commit
// checks again. A write that never says is planned on epoch 0: it
// commits only to chunks never fenced.
func (w *Write) Planned(epoch uint64) error {
	w.epoch = epoch
	if _, d := admit.Step(w.view(), admit.Plan{Epoch: epoch}); d.Err != nil {
		return fmt.Errorf("store: write %v v%d: %w", w.id, w.version, d.Err)
	}
	return nil
}

// view describes the chunk with this write open, for admission.
func (w *Write) view() admit.Chunk {
	c := w.s.view(w.id, w.old.Version)
	c.Write, c.Open = admit.Write{Version: w.version, Base: w.base, Head: w.head, Epoch: w.epoch,
		Tag: w.tag, Off: w.off, End: w.end, Resolves: w.doubt}, true
	return c
}

// Base is the oldest version the replicas below may hold for this write
// (Version-1 unless it covers an unresolved write).
func (w *Write) Base() uint64 { return w.base }

// SetTag sets the tag the committed version records (see Info.Tag).
func (w *Write) SetTag(tag uint64) { w.tag = tag }

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
		if err := w.s.writeAt(w.stage, q[:k], pos-w.off); err != nil {
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
		if err := w.s.writeAt(w.f, q, pos); err != nil {
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
// the CRC with crc32c.Update is the combine step at no extra cost.
func (w *Write) accumulate(off int64, p []byte) {
	shift := w.s.blockShift
	bsize := int64(1) << shift
	for len(p) > 0 {
		b := off >> shift
		k := min(int64(len(p)), (b+1)*bsize-off)
		i := b - w.fb
		w.crcs[i] = crc32c.Update(w.crcs[i], p[:k])
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

// discard removes what the write left on disk. Bytes it placed past the
// committed length stay there, stale and invisible (the next write zeroes
// any gap it leaves); a chunk that never committed gives its file back to
// the recycle pool. Failures only cost space, so they are logged.
func (w *Write) discard() {
	if w.f != nil && w.created && w.old.Version == 0 {
		path := w.f.Name()
		w.closeFiles()
		if err := w.s.pool.put(path); err != nil {
			w.s.log.Warn("store: abort: recycling chunk file", "chunk", w.id, "err", err)
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
