package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// near reports whether got is within slack of want.
func near(got, want, slack int64) bool { return got >= want-slack && got <= want+slack }

// TestCapacityCountsEachDiskOnce (issue 17, item 3): three nodes whose
// data directories share one 512 MiB tmpfs make a cluster of 512 MiB —
// on `df` of a FUSE mount and in `sluice status` — not of 1.5 GiB; other
// data on that file system leaves Sluice less room; data Sluice stores
// moves space from free to used, not out of the capacity; a fourth node
// on a tmpfs of its own adds that one.
func TestCapacityCountsEachDiskOnce(t *testing.T) {
	dir := baseDir(t)
	shared, own := filepath.Join(dir, "shared"), filepath.Join(dir, "own")
	const sharedSize, ownSize = 512 << 20, 256 << 20
	mountTmpfs(t, shared, sharedSize)
	mountTmpfs(t, own, ownSize)
	c := startMeta(t, dir, "--min-free", fmt.Sprint(16<<20), "--min-free-percent", "0")
	for i := 1; i <= 3; i++ {
		c.startNodeIn(t, fmt.Sprintf("n%d", i), filepath.Join(shared, fmt.Sprintf("n%d", i)))
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	m := mountAt(t, c.conf, "mnt")

	// Slack: what the stores' indexes allocate between two measurements.
	const slack = 12 << 20
	df := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(m.dir, &st); err != nil {
			t.Fatalf("statfs %s: %v", m.dir, err)
		}
		return int64(st.Blocks) * st.Bsize
	}
	want := func(what string, capacity int64, disks int, minUsed int64) metaapi.StatusResp {
		t.Helper()
		var st metaapi.StatusResp
		eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
			st = status(t, c.conf)
			got := df()
			return near(st.Totals.Capacity, capacity, slack) && near(got, capacity, slack) && st.Totals.Disks == disks &&
					st.Totals.Used >= minUsed && st.Totals.Free <= st.Totals.Capacity-minUsed,
				fmt.Sprintf("%s: status %+v, df %d bytes; want %d bytes on %d file systems", what, st.Totals, got, capacity, disks)
		})
		return st
	}

	st := want("three nodes on one tmpfs", sharedSize, 1, 0)
	if out := string(mustRun(t, c.conf, nil, "status").stdout); !strings.Contains(out, "on 1 file system(s)") || !strings.Contains(out, "RECLAIMABLE") {
		t.Errorf("status text:\n%s", out)
	}
	t.Logf("three nodes on one tmpfs: %+v", st.Totals)

	// Another tenant of the disk takes 128 MiB.
	if err := os.WriteFile(filepath.Join(shared, "other"), make([]byte, 128<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	want("128 MiB of other data on the tmpfs", sharedSize-128<<20, 1, 0)

	// 24 MiB stored three times: used, not lost.
	mustRun(t, c.conf, nil, "mkdir", "/r3")
	mustRun(t, c.conf, nil, "policy", "set", "/r3", "--replicas", "3")
	data := randomBytes(t, 24<<20)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/r3/f")
	want("24 MiB stored three times", sharedSize-128<<20, 1, 3*24<<20)

	// A fourth node with a file system of its own.
	c.startNodeIn(t, "n4", filepath.Join(own, "n4"))
	waitNodesUp(t, c.conf, 4, 15*time.Second)
	st = want("a fourth node on its own tmpfs", sharedSize-128<<20+ownSize, 2, 3*24<<20)
	// Each node reports its file system's size (the margin's base), not
	// its Capacity (which leaves out the other tenant's 128 MiB).
	sizes := map[int64]int{}
	for _, n := range st.Nodes {
		sizes[n.FSSize]++
	}
	if len(st.Nodes) != 4 || sizes[sharedSize] != 3 || sizes[ownSize] != 1 {
		t.Errorf("file system sizes the nodes report (size: nodes): %v; want 3 of %d and 1 of %d", sizes, sharedSize, ownSize)
	}
	t.Logf("four nodes on two file systems: %+v", st.Totals)
}

// TestSparseFileBlocks (issue 17, item 3): on a FUSE mount, st_blocks
// (`stat -c %b`) counts what a sparse file stores. A file truncated to
// 1 GiB with 4 KiB appended reports those 4 KiB (meta knows which chunk
// is the last and where the file ends), so does an erasure-coded one
// (data, not parity); 4 KiB written at the end of the 1 GiB itself
// report at most their chunk, from its start (meta does not know where
// in a chunk writes landed); a dense file reports its size.
func TestSparseFileBlocks(t *testing.T) {
	c, m := fuseCluster(t)
	const size = 1 << 30
	sparse := func(name string, at int64) (gotSize, allocated int64) {
		t.Helper()
		p := filepath.Join(m.dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(randomBytes(t, 4096), at); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("stat", "-c", "%s %b %B", p).Output()
		if err != nil {
			t.Fatal(err)
		}
		var blocks, unit int64
		if _, err := fmt.Sscan(string(out), &gotSize, &blocks, &unit); err != nil {
			t.Fatalf("stat output %q: %v", out, err)
		}
		t.Logf("%s: 1 GiB with 4 KiB written at %d: stat says %s", name, at, strings.TrimSpace(string(out)))
		return gotSize, blocks * unit
	}
	if gotSize, alloc := sparse("appended", size); gotSize != size+4096 || alloc != 4096 {
		t.Errorf("1 GiB hole, 4 KiB appended: size %d, %d bytes allocated; want %d, 4096", gotSize, alloc, size+4096)
	}
	if gotSize, alloc := sparse("at-end", size-4096); gotSize != size || alloc > metaapi.DefaultChunkSize || alloc == 0 {
		t.Errorf("1 GiB hole, 4 KiB at its end: size %d, %d bytes allocated; want at most one chunk (%d bytes), more than none",
			gotSize, alloc, metaapi.DefaultChunkSize)
	}
	// Erasure-coded RS(2,1) on the three nodes: 6 KiB are stored for 4
	// KiB of data, st_blocks counts the data as du would on one host.
	mustRun(t, c.conf, nil, "mkdir", "/ec")
	mustRun(t, c.conf, nil, "policy", "set", "/ec", "--ec", "2+1", "--cell", "4096")
	if gotSize, alloc := sparse("ec/appended", size); gotSize != size+4096 || alloc != 4096 {
		t.Errorf("RS(2,1), 1 GiB hole, 4 KiB appended: size %d, %d bytes allocated; want %d, 4096", gotSize, alloc, size+4096)
	}

	dense := filepath.Join(m.dir, "dense")
	if err := os.WriteFile(dense, randomBytes(t, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(dense, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks*512 != 3<<20 {
		t.Errorf("dense 3 MiB file: %d blocks", st.Blocks)
	}
}
