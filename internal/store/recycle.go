package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/sluicefs/sluice/internal/privfs"
)

// Chunk files are recycled. When a chunk is deleted (or a new chunk's
// first write aborts) its file goes to a bounded pool instead of being
// unlinked, and the next new chunk takes a file from the pool instead of
// creating one. The pages (tmpfs) or blocks (disk) are reused rather than
// freed and allocated again — on tmpfs, allocating and zeroing pages costs
// more than receiving the data into them. RocksDB recycles its log files
// for the same reason.
//
// A recycled file holds stale bytes. That is safe under the store's
// invariant: bytes past a chunk's committed length are never read, and a
// write that starts past the length first zeroes the gap (see
// Write.zeroGap), so holes always read as zeros.
//
// Recycled files are space the file system could have: the pool keeps a
// file only while it would hold no more than the file system has free,
// and gives its files back when space runs short (see space.go).

const freeDir = "free"

// DefaultRecycleBytes bounds the pool when Options.RecycleBytes is 0.
const DefaultRecycleBytes = 1 << 30

type pool struct {
	mu    sync.Mutex
	dir   string
	limit int64
	next  uint64
	files []freeFile
	bytes int64
}

type freeFile struct {
	path string
	size int64
}

// open scans the pool directory left by an earlier run.
func (p *pool) open(dir string, limit int64) error {
	p.dir, p.limit = filepath.Join(dir, freeDir), limit
	if err := privfs.MkdirAll(p.dir); err != nil {
		return err
	}
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		path := filepath.Join(p.dir, e.Name())
		n, err := strconv.ParseUint(strings.TrimSuffix(e.Name(), ".free"), 10, 64)
		fi, serr := e.Info()
		if err != nil || serr != nil || !fi.Mode().IsRegular() || p.bytes+fi.Size() > p.limit {
			removeFile(path)
			continue
		}
		p.files = append(p.files, freeFile{path, fi.Size()})
		p.bytes += fi.Size()
		p.next = max(p.next, n+1)
	}
	sort.Slice(p.files, func(i, j int) bool { return p.files[i].size < p.files[j].size })
	return nil
}

// put recycles the file at path (or removes it if the pool is full, or
// would hold more than the file system has free).
func (p *pool) put(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	avail := int64(-1)
	if _, a, err := fsSpace(p.dir); err == nil {
		avail = a
	}
	p.mu.Lock()
	if p.limit <= 0 || p.bytes+fi.Size() > p.limit || fi.Size() == 0 || avail >= 0 && p.bytes+fi.Size() > avail {
		p.mu.Unlock()
		return removeFile(path)
	}
	dst := filepath.Join(p.dir, strconv.FormatUint(p.next, 10)+".free")
	p.next++
	if err := os.Rename(path, dst); err != nil {
		p.mu.Unlock()
		return removeFile(path)
	}
	i := sort.Search(len(p.files), func(i int) bool { return p.files[i].size >= fi.Size() })
	p.files = append(p.files, freeFile{})
	copy(p.files[i+1:], p.files[i:])
	p.files[i] = freeFile{dst, fi.Size()}
	p.bytes += fi.Size()
	p.mu.Unlock()
	return nil
}

// take moves a recycled file to path, preferring the smallest one holding
// at least want bytes (else the largest). It reports false when the pool
// is empty.
func (p *pool) take(path string, want int64) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.files) == 0 {
		return false, nil
	}
	i := sort.Search(len(p.files), func(i int) bool { return p.files[i].size >= want })
	if i == len(p.files) {
		i--
	}
	f := p.files[i]
	if err := os.Rename(f.path, path); err != nil {
		return false, fmt.Errorf("reuse recycled chunk file: %w", err)
	}
	p.files = append(p.files[:i], p.files[i+1:]...)
	p.bytes -= f.size
	return true, nil
}

// size is the bytes in the pool.
func (p *pool) size() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// trim removes the largest files until the pool holds at most target
// bytes, and returns the bytes removed.
func (p *pool) trim(target int64) (freed int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.files) > 0 && p.bytes > target {
		f := p.files[len(p.files)-1]
		p.files = p.files[:len(p.files)-1]
		p.bytes -= f.size
		if removeFile(f.path) == nil {
			freed += f.size
		}
	}
	return freed
}

// drain removes every file in the pool, returning the bytes removed.
func (p *pool) drain() int64 { return p.trim(0) }

// Recycled reports the files and bytes waiting in the pool.
func (s *Store) Recycled() (files int, bytes int64) {
	s.pool.mu.Lock()
	defer s.pool.mu.Unlock()
	return len(s.pool.files), s.pool.bytes
}
