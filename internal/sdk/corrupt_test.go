package sdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/sdk"
)

// chunkFiles returns node i's chunk files.
func chunkFiles(t *testing.T, c *cluster.Cluster, i int) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(nodeDir(c, i), "store", "chunks", "*", "*.chunk"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// flipAt inverts byte off of file f.
func flipAt(t *testing.T, f string, off int64) {
	t.Helper()
	fh, err := os.OpenFile(f, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	b := []byte{0}
	if _, err := fh.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := fh.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", d, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// corruptReplicas puts a one-chunk file with three replicas and flips
// one byte of each copy at offs[i] (different 16 KiB blocks): every byte
// is still intact in two copies. It returns the data and the chunk files.
func corruptReplicas(t *testing.T, c *cluster.Cluster, cl *sdk.Client, offs [3]int64) ([]byte, []string) {
	t.Helper()
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	data := randBytes(rand.New(rand.NewPCG(15, 1)), testChunk)
	if _, err := cl.Put(ctx, "/r3/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var files []string
	for i, off := range offs {
		fs := chunkFiles(t, c, i)
		if len(fs) != 1 {
			t.Fatalf("node %d holds %d chunk files, want 1", i, len(fs))
		}
		flipAt(t, fs[0], off)
		files = append(files, fs[0])
	}
	return data, files
}

func startClusterWith(t testing.TB, opts cluster.Options) *cluster.Cluster {
	t.Helper()
	opts.Dir, opts.MetaListen, opts.ChunkSize = tmpDir(t), "127.0.0.1:0", testChunk
	c, err := cluster.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// healed waits until every file holds want (or its first len(want) bytes).
func healed(t *testing.T, d time.Duration, files []string, want func(i int) []byte) {
	t.Helper()
	waitFor(t, d, func() (bool, string) {
		for i, f := range files {
			b, err := os.ReadFile(f)
			if w := want(i); err != nil || len(b) < len(w) || !bytes.Equal(b[:len(w)], w) {
				return false, fmt.Sprintf("%s is not healed (%v)", f, err)
			}
		}
		return true, ""
	})
}

// TestReadsFailOverBlockByBlock: three copies of a chunk, each with one
// bad block in a different place, still hold every byte twice: reads
// starting at any replica, large and small, take each block from a copy
// where it is intact.
func TestReadsFailOverBlockByBlock(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	data, _ := corruptReplicas(t, c, cl, [3]int64{1000, 300000, 700000})
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/r3/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("read with a bad block on every replica: %v (equal %v)", err, bytes.Equal(out.Bytes(), data))
	}
	f, err := cl.Open(ctx, "/r3/f")
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 298000, 690000, testChunk - 5000} {
		buf := make([]byte, 5000)
		if n, err := f.ReadAt(buf, off); err != nil || n != len(buf) || !bytes.Equal(buf, data[off:off+5000]) {
			t.Fatalf("a read of [%d, +5000) over bad blocks: %d, %v", off, n, err)
		}
	}
	whole := make([]byte, testChunk) // an aligned read lands in the caller's buffer
	if n, err := f.ReadAt(whole, 0); err != nil || n != testChunk || !bytes.Equal(whole, data) {
		t.Fatalf("a direct read over bad blocks: %d, %v", n, err)
	}
}

// TestEveryReplicaHealedInPlace: the nodes' scrubs find the bad block in
// each of the three copies, and meta has each healed from the others, in
// place: the chunk files keep their identity, only the bad blocks are
// rewritten; status comes back to full redundancy.
func TestEveryReplicaHealedInPlace(t *testing.T) {
	c := startClusterWith(t, cluster.Options{Nodes: 3, ScrubInterval: time.Second})
	cl := newClient(t, c, sdk.Options{})
	since := time.Now()
	data, files := corruptReplicas(t, c, cl, [3]int64{1000, 300000, 700000})
	var before []os.FileInfo
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, fi)
	}
	healed(t, 60*time.Second, files, func(int) []byte { return data })
	for i, f := range files {
		fi, err := os.Stat(f)
		if err != nil || !os.SameFile(fi, before[i]) {
			t.Fatalf("node %d's chunk file was replaced, not healed in place", i+1)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := cl.WaitRepaired(ctx, since)
	if err != nil {
		t.Fatal(err)
	}
	if st.Repair.Done == 0 {
		t.Fatalf("status reports no repair: %+v", st.Repair)
	}
}

// TestReadReportsCorruption: bad blocks a read meets are reported by the
// reader, and healed within a minute, with no scrub running.
func TestReadReportsCorruption(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	data := randBytes(rand.New(rand.NewPCG(15, 4)), testChunk)
	if _, err := cl.Put(ctx, "/r3/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	// The copies the read tries first (replicas 0 and 1) are bad in the
	// same block; replica 2 has it intact.
	_, l := firstGroup(t, cl, "/r3/f", false)
	var files []string
	for _, r := range l.Replicas[:2] {
		for i, n := range c.Nodes {
			if n.ID() == r.Node {
				f := chunkFiles(t, c, i)[0]
				flipAt(t, f, 500000)
				files = append(files, f)
			}
		}
	}
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/r3/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("read: %v (equal %v)", err, bytes.Equal(out.Bytes(), data))
	}
	healed(t, 60*time.Second, files, func(int) []byte { return data })
}

// TestBlockBadEverywhereIsUnavailable: the same block bad in every copy is
// lost: the read fails and says so, and status counts the chunk
// unavailable (not at full redundancy) while meta keeps trying.
func TestBlockBadEverywhereIsUnavailable(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	corruptReplicas(t, c, cl, [3]int64{4096, 4097, 4098})
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/r3/f", &out); err == nil || !bytesContain(err, "checksums on every replica") {
		t.Fatalf("read of a block bad everywhere: %v", err)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		st, err := cl.Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		r := st.Redundancy.Replicated
		return r.Unavailable == 1 && r.Full == 0, fmt.Sprintf("redundancy %+v", r)
	})
}

// TestBadBlockInEveryUnit: an RS(3,2) stripe group whose five units each
// have a bad block in a different place holds every byte in four units:
// reads decode each stretch from the units intact there, and every unit
// is healed.
func TestBadBlockInEveryUnit(t *testing.T) {
	c := startCluster(t, 5)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	ecDir(t, cl, "/ec", 3, 2, 4096)
	data := randBytes(rand.New(rand.NewPCG(15, 3)), 3*200000)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var files []string
	var want [][]byte
	for i := range 5 {
		fs := chunkFiles(t, c, i)
		if len(fs) != 1 {
			t.Fatalf("node %d holds %d unit files, want 1", i, len(fs))
		}
		b, err := os.ReadFile(fs[0])
		if err != nil {
			t.Fatal(err)
		}
		files, want = append(files, fs[0]), append(want, b)
		flipAt(t, fs[0], int64(10000+i*40000))
	}
	for range 2 {
		var out bytes.Buffer
		if _, err := cl.Get(ctx, "/ec/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("read with a bad block in every unit: %v (equal %v)", err, bytes.Equal(out.Bytes(), data))
		}
	}
	waitFor(t, 60*time.Second, func() (bool, string) {
		for i, f := range files {
			b, err := os.ReadFile(f)
			if err != nil || !bytes.Equal(b, want[i]) {
				return false, "a unit file is not healed"
			}
		}
		return true, ""
	})
}

var jsonMarshal = json.Marshal
