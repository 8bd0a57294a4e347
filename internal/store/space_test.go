package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// smallFS mounts a tmpfs of size bytes for the test: a file system that
// really fills up. It needs root.
func smallFS(t *testing.T, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fillFS writes dir/filler until the file system is full.
func fillFS(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for buf := make([]byte, 1<<20); len(buf) > 0; {
		if _, err := f.Write(buf); errors.Is(err, syscall.ENOSPC) {
			buf = buf[:len(buf)/2]
		} else if err != nil {
			t.Fatal(err)
		}
	}
}

// recycle writes 1 MiB chunks first to last, then deletes them: their
// files go to the recycle pool.
func recycle(t *testing.T, s *Store, rng *rand.Rand, first, last ids.ChunkID) {
	t.Helper()
	for id := first; id <= last; id++ {
		if _, err := write(s, rng, id, 0, randBytes(rng, 1<<20), 0); err != nil {
			t.Fatal(err)
		}
	}
	for id := first; id <= last; id++ {
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFullFileSystemGivesBackRecycledFiles: a write that finds the file
// system full gives back the recycled chunk files and succeeds in the
// space they held, and the store says so (OnNoSpace).
func TestFullFileSystemGivesBackRecycledFiles(t *testing.T) {
	dir := smallFS(t, 16<<20)
	var told atomic.Int32
	s := openStore(t, Options{Dir: filepath.Join(dir, "store"), BlockSize: 4096, OnNoSpace: func() { told.Add(1) }})
	rng := rand.New(rand.NewPCG(5, 6))
	recycle(t, s, rng, 1, 2)
	if n, b := s.Recycled(); n != 2 || b != 2<<20 {
		t.Fatalf("recycled %d files, %d bytes; want 2 of 1 MiB", n, b)
	}
	sp, err := s.Space()
	if err != nil || sp.Recycled != 2<<20 || sp.Free() != sp.Avail+sp.Recycled {
		t.Fatalf("Space %+v, %v", sp, err)
	}
	fillFS(t, dir)
	// 1.5 MiB: the first recycled file holds 1 MiB of it; the rest needs
	// the space the other one holds.
	data := randBytes(rng, 3<<19)
	in, err := write(s, rng, 10, 0, data, 0)
	if err != nil {
		t.Fatalf("write on a full file system with 1 MiB recycled: %v", err)
	}
	if err := checkChunk(s, 10, in, data); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.Recycled(); n != 0 {
		t.Errorf("%d recycled files left after the file system filled", n)
	}
	if told.Load() == 0 {
		t.Error("OnNoSpace was not called")
	}
	// Nothing more to give back: the next write fails cleanly, with
	// ENOSPC, and the chunk is untouched.
	if _, err := write(s, rng, 10, in.Length, randBytes(rng, 1<<20), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write with no space: %v, want ENOSPC", err)
	}
	if err := checkChunk(s, 10, in, data); err != nil {
		t.Fatal(err)
	}

	// Space gives recycled files back once they hold more than is free.
	os.Remove(filepath.Join(dir, "filler"))
	recycle(t, s, rng, 3, 6)
	if n, _ := s.Recycled(); n != 4 {
		t.Fatalf("%d files recycled, want 4", n)
	}
	fillFS(t, dir)
	sp, err = s.Space()
	if err != nil || sp.Recycled > sp.Avail || sp.Recycled == 0 || sp.Recycled >= 4<<20 {
		t.Errorf("full: Space %+v (%v), want less recycled than free, but some", sp, err)
	}
}

// TestFullFileSystemIndexKeepsWorking: with the file system full, the
// index still commits (fences, deletions) — pebble would otherwise stop
// the process — by giving back the store's reserve; data writes are then
// refused until the reserve can be allocated again.
func TestFullFileSystemIndexKeepsWorking(t *testing.T) {
	// Too small for pebble to preallocate its log (1.1 memtables), so
	// the log needs new pages as it grows.
	dir := smallFS(t, 4<<20)
	var told atomic.Int32
	s := openStore(t, Options{Dir: filepath.Join(dir, "store"), BlockSize: 4096, OnNoSpace: func() { told.Add(1) }})
	rng := rand.New(rand.NewPCG(7, 8))
	data := randBytes(rng, 256<<10)
	in, err := write(s, rng, 1, 0, data, 0)
	if err != nil {
		t.Fatal(err)
	}
	fillFS(t, dir)
	for i := range 2000 {
		if _, err := s.Fence(ids.ChunkID(100+i), 7); err != nil {
			t.Fatalf("fence %d on a full file system: %v", i, err)
		}
	}
	if !s.reserve.gone.Load() || told.Load() == 0 {
		t.Fatalf("the index never needed the reserve (gone %v, told %d): the test shows nothing", s.reserve.gone.Load(), told.Load())
	}
	if _, err := write(s, rng, 2, 0, randBytes(rng, 4096), 0); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("data write while the reserve is gone: %v, want ENOSPC", err)
	}
	if err := checkChunk(s, 1, in, data); err != nil {
		t.Fatal(err)
	}
	// Room again: the reserve comes back, and with it writes.
	os.Remove(filepath.Join(dir, "filler"))
	if _, err := s.Space(); err != nil {
		t.Fatal(err)
	}
	if s.reserve.gone.Load() {
		t.Fatal("reserve not allocated again with room for it")
	}
	if fi, err := os.Stat(s.reserve.path); err != nil || fi.Size() != s.reserve.size {
		t.Fatalf("reserve file: %v, %v", fi, err)
	}
	if _, err := write(s, rng, 2, 0, randBytes(rng, 4096), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(1); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s)
	if _, err := s.Fence(ids.ChunkID(100), 8); err != nil {
		t.Fatal(err)
	}
}
