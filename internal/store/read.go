package store

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/sluicefs/sluice/internal/ids"
)

// Read is a consistent view of one chunk's committed state: its Info,
// checksums and data do not change while it is open, because it holds the
// chunk's shared lock and commits wait for it. Keep it short.
type Read struct {
	s    *Store
	id   ids.ChunkID
	c    *chunkState
	info Info
	f    *os.File // nil when the chunk has no data

	page    int64 // checksum page cached in entries, -1 if none
	entries []uint32
	done    bool
}

// OpenRead takes a read view of id. An unknown chunk gives a view of
// length 0, not an error.
func (s *Store) OpenRead(id ids.ChunkID) (*Read, error) {
	if !s.gate.enter() {
		return nil, fmt.Errorf("store: open read %v: %w", id, ErrClosed)
	}
	defer s.gate.exit()
	c := s.chunks.acquire(id)
	if err := s.lockShared(id, c); err != nil {
		s.chunks.release(id, c, false)
		return nil, fmt.Errorf("store: open read %v: %w", id, err)
	}
	r := &Read{s: s, id: id, c: c, page: -1}
	if err := r.open(); err != nil {
		r.Close()
		return nil, fmt.Errorf("store: open read %v: %w", id, err)
	}
	return r, nil
}

func (r *Read) open() error {
	info, err := r.s.loadInfo(r.id)
	if err != nil {
		return err
	}
	r.info = info
	if info.Length == 0 {
		return nil
	}
	f, err := os.Open(r.s.chunkPath(r.id))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("chunk file missing for committed length %d: %w", info.Length, ErrCorrupt)
	}
	if err != nil {
		return fmt.Errorf("open chunk file: %w", err)
	}
	r.f = f
	return nil
}

// Info returns the committed state this view shows.
func (r *Read) Info() Info { return r.info }

// numBlocks is the number of checksum blocks in the view.
func (r *Read) numBlocks() int64 {
	return (r.info.Length + int64(r.s.blockSize) - 1) >> r.s.blockShift
}

// Checksums appends to dst the CRC32C of blocks first..first+n-1, where
// block i covers [i*B, min((i+1)*B, Length)). ErrRange if a block is not
// within Length.
func (r *Read) Checksums(first, n int, dst []uint32) ([]uint32, error) {
	if r.done {
		return dst, fmt.Errorf("store: checksums %v: read is closed: %w", r.id, ErrClosed)
	}
	if first < 0 || n < 0 || int64(first)+int64(n) > r.numBlocks() {
		return dst, fmt.Errorf("store: checksums %v blocks [%d, +%d): chunk has %d: %w",
			r.id, first, n, r.numBlocks(), ErrRange)
	}
	s := r.s
	if !s.gate.enter() {
		return dst, fmt.Errorf("store: checksums %v: %w", r.id, ErrClosed)
	}
	defer s.gate.exit()
	for i := int64(first); i < int64(first)+int64(n); i++ {
		if page := i / crcsPerPage; page != r.page {
			var err error
			if r.entries, err = s.loadPage(r.id, page, r.entries[:0]); err != nil {
				r.page = -1
				return dst, fmt.Errorf("store: checksums %v: %w", r.id, err)
			}
			r.page = page
		}
		dst = append(dst, s.storedCRC(r.entries, i, r.info.Length))
	}
	return dst, nil
}

// ReadAt reads committed data, unverified: the client checks it against
// Checksums. Like os.File, reading beyond Length returns io.EOF; holes read
// as zeros.
func (r *Read) ReadAt(p []byte, off int64) (int, error) {
	if r.done {
		return 0, fmt.Errorf("store: read %v: read is closed: %w", r.id, ErrClosed)
	}
	if off < 0 {
		return 0, fmt.Errorf("store: read %v at %d: negative offset: %w", r.id, off, ErrRange)
	}
	if off >= r.info.Length {
		return 0, io.EOF
	}
	var eof error
	if rest := r.info.Length - off; int64(len(p)) > rest {
		p, eof = p[:rest], io.EOF
	}
	if err := readFull(r.f, p, off); err != nil {
		return 0, fmt.Errorf("store: read %v [%d, +%d): %w", r.id, off, len(p), err)
	}
	return len(p), eof
}

// Close releases the view; commits on the chunk may proceed. Idempotent.
func (r *Read) Close() {
	if r.done {
		return
	}
	r.done = true
	if r.f != nil {
		_ = r.f.Close()
	}
	r.c.mu.RUnlock()
	r.s.chunks.release(r.id, r.c, false)
}
