package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Corruption judged block by block, against real processes (issue 15,
// defects 1 and 2).

// chunkPath is where node dir keeps chunk c.
func chunkPath(dir string, c ids.ChunkID) string {
	return filepath.Join(dir, "store", "chunks", fmt.Sprintf("%02x", uint64(c)&0xff), chunkFileName(c))
}

// flipByte inverts byte off of file p.
func flipByte(t *testing.T, p string, off int64) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// replicaFiles returns the chunk file of each replica of the file's only
// chunk, in replica order.
func replicaFiles(t *testing.T, c *splitCluster, path string) []string {
	t.Helper()
	_, chunks := layoutOf(t, metaClient(t, c.conf), path)
	if len(chunks) != 1 {
		t.Fatalf("%s has %d chunks, want 1", path, len(chunks))
	}
	var out []string
	for _, r := range chunks[0].Replicas {
		n := c.nodes[r.Node]
		if n == nil {
			t.Fatalf("%s: replica on unknown node %v", path, r.Node)
		}
		out = append(out, chunkPath(n.dir, chunks[0].Chunk))
	}
	return out
}

// beginsWith reports whether file p begins with want.
func beginsWith(p string, want []byte) bool {
	b, err := os.ReadFile(p)
	return err == nil && len(b) >= len(want) && bytes.Equal(b[:len(want)], want)
}

// TestBadBlockOnEveryCopy is the scenario: 1 MiB with three
// replicas, one byte flipped at offset 1000 of copy 1, 300000 of copy 2
// and 700000 of copy 3, so each 16 KiB block still has two intact copies.
// `sluice get` returns the file; after the nodes restart their scrubs
// report every copy, status counts the chunk below full redundancy, and
// meta heals each copy in place from the others; status comes back to
// full. A second file with the same block bad in every copy is lost for
// those bytes: reads fail and say so, and status counts it unavailable.
func TestBadBlockOnEveryCopy(t *testing.T) {
	c := startMeta(t, baseDir(t), "--repair-grace", "2s")
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	data, lost := randomBytes(t, 1<<20), randomBytes(t, 1<<20)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")
	mustRun(t, c.conf, bytes.NewReader(lost), "put", "-", "/lost")
	files := replicaFiles(t, c, "/f")
	var before []os.FileInfo
	for i, off := range []int64{1000, 300000, 700000} {
		flipByte(t, files[i], off)
		fi, err := os.Stat(files[i])
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, fi)
	}
	for i, p := range replicaFiles(t, c, "/lost") {
		flipByte(t, p, int64(5000+i)) // one block, bad everywhere
	}

	out := filepath.Join(t.TempDir(), "f")
	mustRun(t, c.conf, nil, "get", "/f", out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("sluice get returned wrong bytes")
	}
	mustFail(t, c.conf, []string{"checksums on every replica"}, "cat", "/lost")

	// Restart the nodes: each scrubs at start and reports its copies.
	for _, n := range c.nodes {
		n.proc.kill()
	}
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		for _, f := range files {
			if !beginsWith(f, data) {
				return false, f + " is not healed; repair " + fmt.Sprintf("%+v", status(t, c.conf).Repair)
			}
		}
		return true, ""
	})
	for i, f := range files {
		if fi, err := os.Stat(f); err != nil || !os.SameFile(fi, before[i]) {
			t.Errorf("copy %d was replaced, not healed in place", i+1)
		}
	}
	healedAt := time.Now()
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		r := st.Redundancy
		return r.ScannedAt > healedAt.UnixNano() && r.Replicated == metaapi.RedundancyCounts{Full: 1, Unavailable: 1},
			fmt.Sprintf("redundancy %+v", r.Replicated)
	})
	mustRun(t, c.conf, nil, "get", "/f", out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("sluice get after healing returned wrong bytes")
	}
	mustFail(t, c.conf, []string{"checksums on every replica"}, "cat", "/lost")
	// The fsck agrees: the healed file is whole, the other has one block
	// intact nowhere.
	res := checkReport(t, c.conf, "--verify")
	if len(res.Problems) != 1 || res.Problems[0].Kind != metaapi.CheckBelowPolicy || res.Problems[0].Count != 1 ||
		!strings.Contains(res.Problems[0].Examples[0], "0 of 3 copies intact at bytes [0, 16384)") {
		t.Fatalf("sluice check: %+v", res.Problems)
	}
}

// TestReadReportsBadBlock: with no scrub due, the only one to see a bad
// block is a reader. `sluice cat` reads replicas 0 and 1 of the chunk,
// both bad in one block, takes the block from replica 2, reports both
// copies, and meta has them healed within a minute.
func TestReadReportsBadBlock(t *testing.T) {
	c := startMeta(t, baseDir(t), "--repair-grace", "2s")
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i), "--scrub-interval", "24h")
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	data := randomBytes(t, 1<<20)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")
	files := replicaFiles(t, c, "/f")
	flipByte(t, files[0], 500000)
	flipByte(t, files[1], 500001)
	read := time.Now()
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; !bytes.Equal(got, data) {
		t.Fatal("sluice cat returned wrong bytes")
	}
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		return beginsWith(files[0], data) && beginsWith(files[1], data), "copies not healed yet"
	})
	t.Logf("both copies healed %s after the read", time.Since(read).Round(100*time.Millisecond))
	checkClean(t, c.conf, 30*time.Second)
}

// TestBadBlockInEveryUnit: the same for an RS(3,2) stripe group: each of
// its five units has one bad block, in different places, so every byte
// is still intact in four units (K is 3). `sluice get` decodes each
// stretch from units intact there; after the nodes restart their scrubs
// report every unit, and each is healed in place from K others.
func TestBadBlockInEveryUnit(t *testing.T) {
	c := startMeta(t, baseDir(t), "--repair-grace", "2s")
	for i := 1; i <= 5; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 5, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--ec", "3+2", "--cell", "4096")
	data := randomBytes(t, 3*300000)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")
	units := replicaFiles(t, c, "/f")
	var want [][]byte
	var before []os.FileInfo
	for i, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := os.Stat(u)
		want, before = append(want, b), append(before, fi)
		flipByte(t, u, int64(20000+i*50000))
	}
	out := filepath.Join(t.TempDir(), "f")
	mustRun(t, c.conf, nil, "get", "/f", out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("sluice get returned wrong bytes")
	}
	for _, n := range c.nodes {
		n.proc.kill()
	}
	for i := 1; i <= 5; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		for i, u := range units {
			if b, err := os.ReadFile(u); err != nil || !bytes.Equal(b, want[i]) {
				return false, fmt.Sprintf("unit %d is not healed", i)
			}
		}
		return true, ""
	})
	for i, u := range units {
		if fi, err := os.Stat(u); err != nil || !os.SameFile(fi, before[i]) {
			t.Errorf("unit %d was replaced, not healed in place", i)
		}
	}
	checkClean(t, c.conf, 30*time.Second)
}
