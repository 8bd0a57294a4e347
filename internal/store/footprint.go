package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// What the store really takes on its file system. The committed lengths
// of its chunks (Usage) say neither what holes save nor what the index,
// the recycled chunk files and the reserve take; the capacity a node
// reports (what its file system can still hold plus what the store uses
// there, docs/space.md) needs the allocated bytes. They come from a walk
// of the store's directory summing every file's allocated blocks. A walk
// costs a stat per chunk file, so it runs in the background at most every
// footprintEvery, and never more than a fiftieth of the time; between two
// walks the estimate moves with the committed bytes and the recycle pool.

// footprintEvery is the least time between two walks.
const footprintEvery = 10 * time.Second

type footprint struct {
	walking atomic.Bool // a walk is under way: one at a time
	mu      sync.Mutex
	walked  bool
	next    time.Time // when the next walk may start
	bytes   int64     // allocated bytes under the store's directory, as walked
	used    int64     // Usage's bytes when the walk began
	pooled  int64     // the pool's bytes when the walk began
	// beforeWalk, if set, runs as a walk starts (tests hold a walk with it).
	beforeWalk func()
}

// allocated is the bytes the store takes on its file system now: the last
// walk's, moved by what was committed and recycled since. A walk due
// (the first one too) starts in the background; until the first ends,
// what is known counts: the committed bytes and the recycle pool. The
// first call must not wait for it: the node reports its space when it
// registers, and walking a large store would hold up its start.
func (s *Store) allocated() int64 {
	fp := &s.footprint
	fp.mu.Lock()
	due := time.Now().After(fp.next)
	fp.mu.Unlock()
	if due && fp.walking.CompareAndSwap(false, true) {
		go func() {
			defer fp.walking.Store(false)
			s.walkFootprint()
		}()
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return max(fp.bytes+s.usedBytes.Load()-fp.used+s.pool.size()-fp.pooled, 0)
}

// walkFootprint sums the allocated blocks of every file under the store's
// directory (links in it are not followed, nor other file systems mounted
// in it: they are not the store's). Files vanishing under it (a chunk
// deleted, a staging file committed) are skipped: the next walk sees
// where they went.
func (s *Store) walkFootprint() {
	fp := &s.footprint
	if fp.beforeWalk != nil {
		fp.beforeWalk()
	}
	start := time.Now()
	used, pooled := s.usedBytes.Load(), s.pool.size()
	var bytes int64
	// WalkDir takes a root that is a symbolic link for a file: walk
	// where a linked data directory points.
	root, err := filepath.EvalSymlinks(s.dir)
	if err != nil {
		root = s.dir
	}
	var rootDev uint64
	rootKnown := false
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		dev, ok := deviceOf(fi)
		switch {
		case path == root:
			rootDev, rootKnown = dev, ok
		case ok && rootKnown && dev != rootDev:
			if d.IsDir() {
				return fs.SkipDir // another file system mounted here
			}
			return nil // a file bind-mounted here
		}
		bytes += allocatedBytes(fi)
		return nil
	})
	took := time.Since(start)
	fp.mu.Lock()
	defer fp.mu.Unlock()
	fp.next = time.Now().Add(max(footprintEvery, 50*took))
	if err != nil {
		s.log.Warn("store: measuring the space the store takes", "err", err)
		return
	}
	fp.walked, fp.bytes, fp.used, fp.pooled = true, bytes, used, pooled
}

// diskID names the file system holding dir so that stores sharing one
// are counted once: its device number and statfs id, qualified by the
// running kernel's boot id, so that two hosts whose disks have the same
// numbers differ while containers on one kernel and disk agree. Not the
// machine id: containers may each have their own over one disk, which
// would then count once per container. Only where no boot id is readable
// does the machine id stand in for it. Empty if the platform cannot say.
func diskID(dir string) string {
	dev, fsid, ok := fsIdentity(dir)
	if !ok {
		return ""
	}
	return diskIDOf(hostID(os.ReadFile), dev, fsid)
}

// hostID is what tells this host's file systems from another's with the
// same numbers: the boot id, else the machine id, read with read.
func hostID(read func(string) ([]byte, error)) []byte {
	for _, f := range []string{"/proc/sys/kernel/random/boot_id", "/etc/machine-id"} {
		if b, err := read(f); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return b
		}
	}
	return nil
}

func diskIDOf(host []byte, dev, fsid string) string {
	h := sha256.New()
	h.Write(host)
	h.Write([]byte(dev + "/" + fsid))
	return hex.EncodeToString(h.Sum(nil)[:12])
}
