package store

import (
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
	walking atomic.Bool
	mu      sync.Mutex
	walked  bool
	next    time.Time // when the next walk may start
	bytes   int64     // allocated bytes under the store's directory, as walked
	used    int64     // Usage's bytes when the walk began
	pooled  int64     // the pool's bytes when the walk began
}

// allocated is the bytes the store takes on its file system now: the last
// walk's, moved by what was committed and recycled since. The first call
// walks at once; later ones start a walk in the background when one is due.
func (s *Store) allocated() int64 {
	fp := &s.footprint
	fp.mu.Lock()
	walked := fp.walked
	fp.mu.Unlock()
	if !walked {
		s.walkFootprint()
	} else if time.Now().After(fp.next) && fp.walking.CompareAndSwap(false, true) {
		go s.walkFootprint()
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return max(fp.bytes+s.usedBytes.Load()-fp.used+s.pool.size()-fp.pooled, 0)
}

// walkFootprint sums the allocated blocks of every file under the store's
// directory (links in it are not followed). Files vanishing under it (a chunk deleted, a staging file
// committed) are skipped: the next walk sees where they went.
func (s *Store) walkFootprint() {
	fp := &s.footprint
	defer fp.walking.Store(false)
	start := time.Now()
	used, pooled := s.usedBytes.Load(), s.pool.size()
	var bytes int64
	// WalkDir takes a root that is a symbolic link for a file: walk
	// where a linked data directory points.
	root, err := filepath.EvalSymlinks(s.dir)
	if err != nil {
		root = s.dir
	}
	err = filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
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
// host (machine id and boot id, so two hosts whose disks have the same
// numbers differ). Empty if the platform cannot say.
func diskID(dir string) string {
	dev, fsid, ok := fsIdentity(dir)
	if !ok {
		return ""
	}
	h := sha256.New()
	for _, f := range []string{"/etc/machine-id", "/proc/sys/kernel/random/boot_id"} {
		if b, err := os.ReadFile(f); err == nil {
			h.Write(b)
		}
	}
	h.Write([]byte(dev + "/" + fsid))
	return hex.EncodeToString(h.Sum(nil)[:12])
}
