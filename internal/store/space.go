package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sluicefs/sluice/internal/privfs"
)

// Running out of space. A node's file system can fill up — meta keeps a
// margin, but appends to existing chunks, a burst between two reports or
// another tenant of the disk can still take the last byte — and the
// store must then fail writes cleanly and stay up:
//
//   - Recycled chunk files are space the file system could have: the
//     pool never holds more than the file system has free (Space trims
//     it), and a write that meets ENOSPC gives them all back and tries
//     once more before failing.
//   - The index must not meet ENOSPC unprepared: pebble treats a failed
//     write of its log as fatal. The store keeps a reserve file, and
//     when the index meets ENOSPC it gives back the recycled files and
//     the reserve, and the index retries (pebble's vfs.OnDiskFull). While
//     the reserve is gone, data writes are refused unless more than its
//     size is free, so what it freed stays the index's; Space allocates
//     it again once twice its size is free.
//   - Every ENOSPC is told to Options.OnNoSpace, so the node reports its
//     space to meta at once rather than at its next heartbeat.

// Space is the room the store's file system has.
type Space struct {
	Total    int64 // size of the file system
	Avail    int64 // bytes free on it for this account
	Recycled int64 // bytes in recycled chunk files, reused or given back on demand
	// Used is what the store takes on the file system (allocated bytes of
	// its chunks, recycled files, index and reserve; footprint.go), and
	// Disk names the file system (stores sharing one report the same).
	Used int64
	Disk string
}

// Free is what the store can still take: free bytes and recycled files.
func (s Space) Free() int64 { return s.Avail + s.Recycled }

// Space reports the room the store has. It also gives recycled chunk
// files back when they hold more than is free, and allocates the index's
// reserve again once there is room for it: the node calls it with every
// heartbeat.
func (s *Store) Space() (Space, error) {
	total, avail, err := fsSpace(s.dir)
	if err != nil {
		return Space{}, fmt.Errorf("store: space: %w", err)
	}
	// At most half of what is free sits in recycled files.
	if freed := s.pool.trim((avail + s.pool.size()) / 2); freed > 0 {
		avail += freed
	}
	if s.reserve.gone.Load() && avail >= 2*s.reserve.size {
		if err := s.reserve.allocate(); err == nil {
			avail -= s.reserve.size
			s.log.Info("store: the index's reserve is allocated again", "bytes", s.reserve.size)
		}
	}
	return Space{Total: total, Avail: avail, Recycled: s.pool.size(), Used: s.allocated(), Disk: s.disk}, nil
}

// noSpace reports whether err says the file system is full. Then it gives
// back the recycled chunk files and tells the node; the caller tries its
// write once more.
func (s *Store) noSpace(err error) bool {
	if !errors.Is(err, syscall.ENOSPC) {
		return false
	}
	if freed := s.pool.drain(); freed > 0 {
		s.log.Info("store: file system full: gave back recycled chunk files", "bytes", freed)
	}
	if s.onNoSpace != nil {
		s.onNoSpace()
	}
	return true
}

// writeAt is f.WriteAt, tried once more after a full file system gave
// back the recycled files. It allocates nothing (Place calls it).
func (s *Store) writeAt(f *os.File, p []byte, off int64) error {
	n, err := f.WriteAt(p, off)
	if err != nil && s.noSpace(err) {
		_, err = f.WriteAt(p[n:], off+int64(n))
	}
	return err
}

// create creates path (flag adds to O_RDWR|O_CREATE), private, tried
// once more if the file system is full.
func (s *Store) create(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|flag, privfs.FileMode)
	if err != nil && s.noSpace(err) {
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|flag, privfs.FileMode)
	}
	return f, err
}

// indexFull runs when the index meets ENOSPC (pebble then retries once).
func (s *Store) indexFull() {
	freed := s.pool.drain()
	if s.reserve.release() {
		freed += s.reserve.size
	}
	s.log.Warn("store: file system full under the index: gave back recycled chunk files and the reserve", "bytes", freed)
	if s.onNoSpace != nil {
		s.onNoSpace()
	}
}

// checkReserve refuses a data write while the index's reserve is gone and
// no more than its size is free.
func (s *Store) checkReserve() error {
	if !s.reserve.gone.Load() {
		return nil
	}
	_, avail, err := fsSpace(s.dir)
	if err != nil || avail > s.reserve.size {
		return nil
	}
	if s.onNoSpace != nil {
		s.onNoSpace()
	}
	return fmt.Errorf("file system full (%d bytes free, kept for the index): %w", avail, syscall.ENOSPC)
}

const (
	reserveFile = "reserve"
	minReserve  = 1 << 20
	maxReserve  = 16 << 20
)

// reserve is the index's reserve file.
type reserve struct {
	mu   sync.Mutex
	path string
	size int64       // 0: none (the file system's size is unknown)
	gone atomic.Bool // released, or could not be allocated
}

// open sizes the reserve for the file system holding dir (1/1024 of it,
// from 1 to 16 MiB: pebble's log and a memtable flush or two) and
// allocates it if it is not there.
func (r *reserve) open(dir string) error {
	r.path = filepath.Join(dir, reserveFile)
	total, _, err := fsSpace(dir)
	if err != nil {
		return nil // no statfs here: no reserve
	}
	r.size = min(max(total/1024, minReserve), maxReserve)
	if fi, err := os.Stat(r.path); err == nil && fi.Size() == r.size {
		return nil
	}
	if err := r.allocate(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("allocate the index's reserve: %w", err)
	}
	return nil
}

// allocate (re)creates the reserve file; on failure it is gone.
func (r *reserve) allocate() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := func() error {
		f, err := os.OpenFile(r.path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, privfs.FileMode)
		if err != nil {
			return err
		}
		err = allocate(f, r.size)
		if err == nil {
			err = fdatasync(f)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}()
	if err != nil {
		removeFile(r.path)
	}
	r.gone.Store(err != nil)
	return err
}

// release removes the reserve file, reporting whether it was there.
func (r *reserve) release() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.size == 0 || r.gone.Load() {
		return false
	}
	r.gone.Store(true)
	return removeFile(r.path) == nil
}
