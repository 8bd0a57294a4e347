package store

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestSpaceUsedIsAllocation: a store's Used is what it takes on its file
// system — a chunk with a large hole counts its written blocks, not its
// length; the index and reserve count too; recycled files stay counted
// (they still take the space) — and other files on the disk do not count.
func TestSpaceUsedIsAllocation(t *testing.T) {
	dir := smallFS(t, 64<<20)
	s := openStore(t, Options{Dir: filepath.Join(dir, "store"), BlockSize: 4096})
	rng := rand.New(rand.NewPCG(1, 2))
	// A first chunk: the index preallocates its log.
	if _, err := write(s, rng, 9, 0, randBytes(rng, 4096), 0); err != nil {
		t.Fatal(err)
	}
	s.walkFootprint()
	sp0, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	// Measured: the store's files (index, reserve, the chunk).
	if sp0.Used <= 1<<20 || sp0.Used > sp0.Total-sp0.Avail {
		t.Fatalf("Used %d, file system has %d in use", sp0.Used, sp0.Total-sp0.Avail)
	}
	// 16 KiB written past a 16 MiB hole.
	if _, err := write(s, rng, 1, 16<<20, randBytes(rng, 16<<10), 0); err != nil {
		t.Fatal(err)
	}
	if b, _ := s.Usage(); b != 4096+16<<20+16<<10 {
		t.Fatalf("committed length %d", b)
	}
	s.walkFootprint()
	sp, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	grew := sp.Used - sp0.Used
	if grew < 16<<10 || grew > 1<<20 {
		t.Errorf("a chunk of 16 KiB written after a 16 MiB hole grew Used by %d bytes", grew)
	}
	// Another tenant of the disk: free space shrinks, Used does not move.
	if err := os.WriteFile(filepath.Join(dir, "other"), make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	s.walkFootprint()
	sp2, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	if sp2.Used != sp.Used || sp.Avail-sp2.Avail < 8<<20 {
		t.Errorf("after 8 MiB of other data: Used %d -> %d, Avail %d -> %d", sp.Used, sp2.Used, sp.Avail, sp2.Avail)
	}
	// Deleted and recycled: still on disk, still counted (and recycled).
	recycle(t, s, rng, 2, 3)
	sp3, err := s.Space()
	if err != nil || sp3.Recycled != 2<<20 || sp3.Used < sp2.Used+2<<20 {
		t.Errorf("with 2 MiB recycled: %+v (%v), Used before %d", sp3, err, sp2.Used)
	}
}

// TestSpaceDiskNamesTheFileSystem: stores on one file system report the
// same Disk, a store on another a different one.
func TestSpaceDiskNamesTheFileSystem(t *testing.T) {
	a, b := smallFS(t, 16<<20), smallFS(t, 16<<20)
	var st1, st2 syscall.Stat_t
	if syscall.Stat(a, &st1) != nil || syscall.Stat(b, &st2) != nil || st1.Dev == st2.Dev {
		t.Skip("no distinct devices")
	}
	disk := func(dir string) string {
		s := openStore(t, Options{Dir: dir, BlockSize: 4096})
		sp, err := s.Space()
		if err != nil {
			t.Fatal(err)
		}
		return sp.Disk
	}
	a1, a2, b1 := disk(filepath.Join(a, "s1")), disk(filepath.Join(a, "s2")), disk(filepath.Join(b, "s1"))
	if a1 == "" || a1 != a2 || a1 == b1 {
		t.Errorf("disks: %q and %q on one file system, %q on another", a1, a2, b1)
	}
}

// TestSpaceUsedThroughSymlinkedDir: a data directory that is a symbolic
// link (to a disk mounted elsewhere, say) is walked where it points: the
// walk must not stop at the link and report next to nothing as used.
func TestSpaceUsedThroughSymlinkedDir(t *testing.T) {
	real := filepath.Join(t.TempDir(), "store")
	if err := os.MkdirAll(real, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "data")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, Options{Dir: link, BlockSize: 4096})
	rng := rand.New(rand.NewPCG(1, 2))
	if _, err := write(s, rng, 9, 0, randBytes(rng, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	s.walkFootprint()
	sp, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	if sp.Used < 1<<20 {
		t.Errorf("a store holding a 1 MiB chunk through a symlinked directory reports %d bytes used", sp.Used)
	}
}

// TestFootprintStaysOnItsFileSystem: a file system mounted inside the
// data directory is not the store's: the walk does not count what it
// holds as used.
func TestFootprintStaysOnItsFileSystem(t *testing.T) {
	dir := smallFS(t, 64<<20)
	sdir := filepath.Join(dir, "store")
	s := openStore(t, Options{Dir: sdir, BlockSize: 4096})
	rng := rand.New(rand.NewPCG(3, 4))
	if _, err := write(s, rng, 9, 0, randBytes(rng, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	s.walkFootprint()
	sp0, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	inner := filepath.Join(sdir, "mnt")
	if err := os.Mkdir(inner, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", inner, "tmpfs", 0, "size=32m"); err != nil {
		t.Skipf("mounting a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(inner, syscall.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(inner, "other"), make([]byte, 16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	s.walkFootprint()
	sp, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	if grew := sp.Used - sp0.Used; grew > 1<<20 {
		t.Errorf("16 MiB on a file system mounted inside the data directory grew Used by %d bytes (%d -> %d)", grew, sp0.Used, sp.Used)
	}
}

// TestFirstFootprintWalkDoesNotBlock: the first walk runs in the
// background — Space answers at once with what is known (the committed
// bytes), so a node with a large store registers without waiting for it
// — and callers meanwhile, however many, start no second walk.
func TestFirstFootprintWalkDoesNotBlock(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096})
	rng := rand.New(rand.NewPCG(5, 6))
	if _, err := write(s, rng, 9, 0, randBytes(rng, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	var walks atomic.Int32
	release := make(chan struct{})
	s.footprint.beforeWalk = func() {
		walks.Add(1)
		<-release
	}
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sp, err := s.Space()
			if err == nil && sp.Used < 1<<20 {
				err = fmt.Errorf("Used %d before the first walk, with 1 MiB committed", sp.Used)
			}
			errs <- err
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Space waited for the first walk of the store's directory")
	}
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	close(release)
	released = true
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.footprint.mu.Lock()
		walked := s.footprint.walked
		s.footprint.mu.Unlock()
		if walked && !s.footprint.walking.Load() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first walk did not finish")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := walks.Load(); n != 1 {
		t.Errorf("%d concurrent first calls walked %d times, want 1", callers, n)
	}
}

// TestDiskIDIgnoresMachineID: containers on one kernel and disk, each
// with a machine id of its own, name the disk alike (the boot id, one per
// running kernel, tells hosts apart); other kernels differ; without a
// boot id the machine id stands in.
func TestDiskIDIgnoresMachineID(t *testing.T) {
	files := func(boot, machine string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			v := map[string]string{"/proc/sys/kernel/random/boot_id": boot, "/etc/machine-id": machine}[name]
			if v == "" {
				return nil, os.ErrNotExist
			}
			return []byte(v + "\n"), nil
		}
	}
	id := func(boot, machine string) string { return diskIDOf(hostID(files(boot, machine)), "803", "1:2:ef53") }
	if a, b := id("boot-1", "container-a"), id("boot-1", "container-b"); a != b {
		t.Errorf("two containers on one kernel and disk: %s and %s", a, b)
	}
	if a, b := id("boot-1", "m"), id("boot-2", "m"); a == b {
		t.Errorf("two kernels with the same device numbers: both %s", a)
	}
	if a, b := id("", "host-a"), id("", "host-b"); a == b {
		t.Errorf("no boot id, two machine ids: both %s", a)
	}
	if diskIDOf(nil, "803", "1:2:ef53") == diskIDOf(nil, "804", "1:2:ef53") {
		t.Error("two devices named alike")
	}
}
