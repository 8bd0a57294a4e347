package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/store"
)

const testChunk = 1 << 20 // small chunks so tests cross chunk boundaries

func tmpDir(tb testing.TB) string {
	tb.Helper()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "sluice-client-")
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	return tb.TempDir()
}

func startCluster(tb testing.TB, nodes int) *cluster.Cluster {
	tb.Helper()
	opts := cluster.Options{Dir: tmpDir(tb), Nodes: nodes, MetaListen: "127.0.0.1:0", ChunkSize: testChunk}
	if os.Getenv("SLUICE_TEST_LOG") != "" {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := cluster.Start(context.Background(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func newClient(tb testing.TB, c *cluster.Cluster, opts sdk.Options) *sdk.Client {
	tb.Helper()
	return newBenchClient(tb, c, opts, sdk.BenchOptions{})
}

// newBenchClient is newClient with benchmark knobs.
func newBenchClient(tb testing.TB, c *cluster.Cluster, opts sdk.Options, bench sdk.BenchOptions) *sdk.Client {
	tb.Helper()
	conf, err := c.Conf()
	if err != nil {
		tb.Fatal(err)
	}
	opts.Conf = conf
	cl, err := sdk.NewBench(opts, bench)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cl.Close() })
	return cl
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

func dirWithPolicy(t *testing.T, cl *sdk.Client, dir string, k int) {
	t.Helper()
	ctx := context.Background()
	if err := cl.MkdirAll(ctx, dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cl.SetPolicy(ctx, dir, metaapi.Policy{Replicas: k, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
		t.Fatal(err)
	}
}

func TestPutGetAcrossChunks(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{WriteMsg: 300 << 10, ReadReq: 200 << 10})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	for _, k := range []int{1, 3} {
		dir := fmt.Sprintf("/k%d", k)
		dirWithPolicy(t, cl, dir, k)
		for _, n := range []int{0, 1, 4095, testChunk - 1, testChunk, testChunk + 1, 3*testChunk + 12345} {
			data := randBytes(rng, n)
			p := fmt.Sprintf("%s/f%d", dir, n)
			if got, err := cl.Put(ctx, p, bytes.NewReader(data), 0o644); err != nil || got != int64(n) {
				t.Fatalf("put %s: %d, %v", p, got, err)
			}
			var out bytes.Buffer
			if _, err := cl.Get(ctx, p, &out); err != nil {
				t.Fatalf("get %s: %v", p, err)
			}
			if !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("%s: got %d bytes back, differing from the %d put", p, out.Len(), n)
			}
			a, err := cl.Stat(ctx, p)
			if err != nil || a.Size != int64(n) || a.Policy == nil || a.Policy.Replicas != k {
				t.Fatalf("stat %s: %+v %v", p, a, err)
			}
		}
	}
	// Put replaced files atomically and left no temporaries behind.
	ents, err := cl.ReadDir(ctx, "/k3")
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 7 {
		t.Fatalf("/k3 has %d entries: %+v", len(ents), ents)
	}
}

// TestRandomWritesMatchModel writes at random offsets (overwrites, holes,
// chunk-crossing writes) and compares reads with an in-memory model.
func TestRandomWritesMatchModel(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{WriteMsg: 256 << 10})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/m", 2)
	f, err := cl.Create(ctx, "/m/file", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	var model []byte
	for step := 0; step < 60; step++ {
		off := rng.Int64N(int64(len(model)) + 2*testChunk)
		n := rng.IntN(testChunk + testChunk/2)
		if step%5 == 0 {
			n = rng.IntN(100)
		}
		data := randBytes(rng, n)
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatalf("step %d: write [%d,+%d): %v", step, off, n, err)
		}
		if end := off + int64(n); end > int64(len(model)) {
			model = append(model, make([]byte, end-int64(len(model)))...)
		}
		copy(model[off:], data)
		// A fresh handle sees everything (close-to-open).
		g, err := cl.Open(ctx, "/m/file")
		if err != nil {
			t.Fatal(err)
		}
		if g.Size() != int64(len(model)) {
			t.Fatalf("step %d: size %d, want %d", step, g.Size(), len(model))
		}
		ro := rng.Int64N(int64(len(model)) + 1)
		buf := make([]byte, rng.IntN(2*testChunk))
		got, err := g.ReadAt(buf, ro)
		want := model[min(ro, int64(len(model))):min(ro+int64(len(buf)), int64(len(model)))]
		if got != len(want) || (err != nil && err != io.EOF) || !bytes.Equal(buf[:got], want) {
			t.Fatalf("step %d: read [%d,+%d) = %d, %v; want %d bytes", step, ro, len(buf), got, err, len(want))
		}
	}
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/m/file", &out); err != nil || !bytes.Equal(out.Bytes(), model) {
		t.Fatalf("final content differs: %v", err)
	}
	assertReplicasIdentical(t, c)
}

// assertReplicasIdentical compares every chunk present on several nodes.
func assertReplicasIdentical(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	type copyOf struct {
		node ids.NodeID
		info store.Info
		data []byte
	}
	chunks := map[ids.ChunkID][]copyOf{}
	for _, n := range c.Nodes {
		s := n.Store()
		var list []ids.ChunkID
		s.List(func(id ids.ChunkID, _ store.Info) bool { list = append(list, id); return true })
		for _, id := range list {
			rd, err := s.OpenRead(id)
			if err != nil {
				t.Fatal(err)
			}
			info := rd.Info()
			data := make([]byte, info.Length)
			if _, err := rd.ReadAt(data, 0); err != nil && err != io.EOF {
				t.Fatal(err)
			}
			rd.Close()
			chunks[id] = append(chunks[id], copyOf{n.ID(), info, data})
		}
	}
	for id, copies := range chunks {
		for _, cp := range copies[1:] {
			if cp.info != copies[0].info || !bytes.Equal(cp.data, copies[0].data) {
				t.Fatalf("chunk %v: replica on %v (%+v) differs from replica on %v (%+v)", id, cp.node, cp.info, copies[0].node, copies[0].info)
			}
		}
	}
}

// TestConcurrentOverlappingWriters: several clients write overlapping
// ranges of one chunk at once. Replicas must end byte-identical, and
// every written range must hold one writer's bytes in full.
func TestConcurrentOverlappingWriters(t *testing.T) {
	c := startCluster(t, 3)
	ctx := context.Background()
	setup := newClient(t, c, sdk.Options{})
	dirWithPolicy(t, setup, "/cw", 3)
	f0, err := setup.Create(ctx, "/cw/shared", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f0.WriteAt(make([]byte, testChunk), 0); err != nil {
		t.Fatal(err)
	}
	const writers, rounds = 4, 15
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cl := newClient(t, c, sdk.Options{})
			f, err := cl.Open(ctx, "/cw/shared")
			if err != nil {
				t.Error(err)
				return
			}
			for r := 0; r < rounds; r++ {
				// Every write covers the same window (straddling checksum
				// blocks) with the writer's own byte, alternating with a
				// shorter write inside it; each write is atomic, so the
				// window always ends as one whole write.
				off, n := int64(10000), 70000
				if r%2 == 1 {
					off, n = 20000, 30000
				}
				if _, err := f.WriteAt(bytes.Repeat([]byte{byte(1 + w)}, n), off); err != nil {
					t.Errorf("writer %d: %v", w, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	assertReplicasIdentical(t, c)
	var out bytes.Buffer
	if _, err := setup.Get(ctx, "/cw/shared", &out); err != nil {
		t.Fatal(err)
	}
	// [10000, 80000) is covered by every long write, and [20000, 50000)
	// also by the short ones: the window outside the short range holds the
	// last long write's byte throughout, and the short range one writer's.
	got := out.Bytes()
	uniform := func(b []byte) bool { return b[0] != 0 && bytes.Equal(b, bytes.Repeat(b[:1], len(b))) }
	outer := append(append([]byte(nil), got[10000:20000]...), got[50000:80000]...)
	if !uniform(outer) || !uniform(got[20000:50000]) {
		t.Fatalf("a write was torn: bytes at 10000=%d 49999=%d 50000=%d 79999=%d", got[10000], got[49999], got[50000], got[79999])
	}
	if got[9999] != 0 || got[80000] != 0 {
		t.Fatal("bytes outside every write changed")
	}
}

// TestReadsSurviveCorruptionAndNodeLoss: a flipped byte on one replica is
// caught by the checksum and served from another; with every replica
// gone or bad, the read fails rather than returning wrong bytes.
func TestReadsSurviveCorruptionAndNodeLoss(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	dirWithPolicy(t, cl, "/r1", 1)
	rng := rand.New(rand.NewPCG(3, 3))
	data := randBytes(rng, 2*testChunk+777)
	for _, p := range []string{"/r3/f", "/r1/f"} {
		if _, err := cl.Put(ctx, p, bytes.NewReader(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	corruptAll := func(skip int) {
		for i, n := range c.Nodes {
			if i == skip {
				continue
			}
			files, _ := filepath.Glob(filepath.Join(nodeDir(c, i), "store", "chunks", "*", "*.chunk"))
			for _, f := range files {
				fh, err := os.OpenFile(f, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				b := []byte{0}
				fh.ReadAt(b, 100)
				b[0] ^= 0xff
				fh.WriteAt(b, 100)
				fh.Close()
			}
			_ = n
		}
	}
	// Corrupt every chunk on all nodes but the last: /r3 still reads
	// correctly from the clean replica.
	corruptAll(2)
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/r3/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("replicas=3 with two corrupt copies: %v (equal=%v)", err, bytes.Equal(out.Bytes(), data))
	}
	// /r1 lives on one node; if it is corrupted there, the read fails.
	out.Reset()
	_, err := cl.Get(ctx, "/r1/f", &out)
	if err == nil && !bytes.Equal(out.Bytes(), data) {
		t.Fatal("returned corrupt data without an error")
	}
	// Lose the node with the clean copies of /r3: every remaining copy of
	// its first chunk is corrupt, so reads must fail, not lie.
	c.Nodes[2].Close()
	out.Reset()
	if _, err := cl.Get(ctx, "/r3/f", &out); err == nil {
		t.Fatal("read succeeded with only corrupt replicas left")
	} else if !bytesContain(err, "checksum") {
		t.Fatalf("error does not mention the checksum: %v", err)
	}
}

func bytesContain(err error, s string) bool { return bytes.Contains([]byte(err.Error()), []byte(s)) }

func nodeDir(c *cluster.Cluster, i int) string {
	return filepath.Join(filepath.Dir(c.ConfPath), fmt.Sprintf("node%d", i+1))
}

func TestNodeDownReadsContinue(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	data := randBytes(rand.New(rand.NewPCG(4, 4)), 3*testChunk)
	if _, err := cl.Put(ctx, "/r3/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Nodes[0].Close()
	for i := 0; i < 3; i++ { // each read starts at a different replica
		var out bytes.Buffer
		if _, err := cl.Get(ctx, "/r3/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("read %d with a node down: %v", i, err)
		}
	}
	// Writes need every replica: they fail with an error naming the node.
	f, err := cl.Open(ctx, "/r3/f")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = f.WriteAtContext(wctx, []byte("x"), 10)
	var ne *sdk.NodeError
	if err == nil || !errors.As(err, &ne) {
		t.Fatalf("write with a replica down: %v", err)
	}
}

func TestTruncateThenExtendReadsZeros(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	f, err := cl.Create(ctx, "/t", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{7}, 300<<10), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("end"), 200<<10); err != nil {
		t.Fatal(err)
	}
	g, _ := cl.Open(ctx, "/t")
	buf := make([]byte, g.Size())
	if _, err := g.ReadAt(buf, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	want := append(bytes.Repeat([]byte{7}, 100), make([]byte, 200<<10-100)...)
	want = append(want, "end"...)
	if !bytes.Equal(buf, want) {
		i := 0
		for i < len(buf) && i < len(want) && buf[i] == want[i] {
			i++
		}
		t.Fatalf("after truncate+extend, content differs at byte %d (size %d, want %d)", i, len(buf), len(want))
	}
}

func TestNamespaceErrors(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	if _, err := cl.Open(ctx, "/missing"); !sdk.IsNotExist(err) {
		t.Fatalf("open missing: %v", err)
	}
	long := string(bytes.Repeat([]byte{'a'}, 256))
	if err := cl.Mkdir(ctx, "/"+long, 0o755); !metaapi.IsCode(err, metaapi.ENAMETOOLONG) {
		t.Fatalf("long name: %v", err)
	}
	if err := cl.SetPolicy(ctx, "/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
		t.Fatal(err)
	}
	// A policy needing more nodes than are up fails at placement with a
	// clear message.
	_, err := cl.Put(ctx, "/x", bytes.NewReader([]byte("data")), 0o644)
	if !metaapi.IsCode(err, metaapi.ENOSPC) {
		t.Fatalf("placing 3 replicas on 1 node: %v", err)
	}
}

// TestPutFromFile covers the mapped-source path: the put sends straight
// from the file's pages, from its current offset.
func TestPutFromFile(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{WriteMsg: 700 << 10})
	ctx := context.Background()
	data := randBytes(rand.New(rand.NewPCG(5, 5)), 3*testChunk+4321)
	src := filepath.Join(tmpDir(t), "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, skip := range []int64{0, 5000} {
		fh, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fh.Seek(skip, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		p := fmt.Sprintf("/from-file-%d", skip)
		if n, err := cl.Put(ctx, p, fh, 0o600); err != nil || n != int64(len(data))-skip {
			t.Fatalf("put: %d, %v", n, err)
		}
		if pos, _ := fh.Seek(0, io.SeekCurrent); pos != int64(len(data)) {
			t.Fatalf("source offset %d after put, want the end", pos)
		}
		fh.Close()
		var out bytes.Buffer
		if _, err := cl.Get(ctx, p, &out); err != nil || !bytes.Equal(out.Bytes(), data[skip:]) {
			t.Fatalf("get %s: %v", p, err)
		}
	}
}

// Reads of whole 1 MiB blocks land in the caller's buffer itself; they
// must be as careful as pooled ones: a corrupt replica's bytes are
// replaced by the next replica's, holes and short chunks read as zeros.
func TestReadAtIntoCallersBuffer(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	rng := rand.New(rand.NewPCG(9, 9))
	data := randBytes(rng, 3*testChunk+5)
	if _, err := cl.Put(ctx, "/r3/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	// Corrupt every chunk on two of the three nodes.
	for i := range 2 {
		files, _ := filepath.Glob(filepath.Join(nodeDir(c, i), "store", "chunks", "*", "*.chunk"))
		if len(files) == 0 {
			t.Fatalf("node %d holds no chunk files", i)
		}
		for _, f := range files {
			fh, err := os.OpenFile(f, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := fh.WriteAt([]byte("garbage"), 4096); err != nil {
				t.Fatal(err)
			}
			fh.Close()
		}
	}
	f, err := cl.Open(ctx, "/r3/f")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct{ off, n int64 }{{0, 2 * testChunk}, {testChunk, 2 * testChunk}, {2 * testChunk, testChunk}} {
		buf := bytes.Repeat([]byte{0xee}, int(r.n))
		if n, err := f.ReadAtContext(ctx, buf, r.off); err != nil || int64(n) != r.n {
			t.Fatalf("ReadAt(%d, %d): %d, %v", r.off, r.n, n, err)
		}
		if !bytes.Equal(buf, data[r.off:r.off+r.n]) {
			t.Fatalf("ReadAt(%d, %d): wrong bytes", r.off, r.n)
		}
	}
	// A sparse file: a hole chunk, then a chunk written only in part.
	g, err := cl.Create(ctx, "/r3/sparse", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAtContext(ctx, []byte("tail"), testChunk+10); err != nil {
		t.Fatal(err)
	}
	if err := g.Truncate(ctx, 3*testChunk); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 3*testChunk)
	copy(want[testChunk+10:], "tail")
	buf := bytes.Repeat([]byte{0xee}, len(want))
	if n, err := g.ReadAtContext(ctx, buf, 0); err != nil || n != len(want) {
		t.Fatalf("sparse ReadAt: %d, %v", n, err)
	}
	if !bytes.Equal(buf, want) {
		t.Fatal("sparse ReadAt: holes or the short chunk's tail are not zeros")
	}
}

// TestConcurrentWriteAtOneFile: WriteAt from several goroutines on one
// File (as the DAFS session's ops run) is safe: under -race, reading the
// file's inode number raced with another write's attribute update.
func TestConcurrentWriteAtOneFile(t *testing.T) {
	c := startClusterWith(t, cluster.Options{Nodes: 1})
	ctx := context.Background()
	cl := newClient(t, c, sdk.Options{})
	f, err := cl.Create(ctx, "/w", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bytes.Repeat([]byte{byte(g + 1)}, 4096)
			for i := range 8 {
				if _, err := f.WriteAt(b, int64(i*4+g)*4096); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got := make([]byte, 32*4096)
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for k := range 32 {
		if got[k*4096] != byte(k%4+1) {
			t.Fatalf("block %d holds %d, want %d", k, got[k*4096], k%4+1)
		}
	}
}
