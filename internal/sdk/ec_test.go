package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/sdk"
)

// ecDir makes dir erasure-coded RS(k, m) with the given cell.
func ecDir(t *testing.T, cl *sdk.Client, dir string, k, m int, cell int64) {
	t.Helper()
	ctx := context.Background()
	if err := cl.MkdirAll(ctx, dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cl.SetPolicy(ctx, dir, metaapi.Policy{EC: &metaapi.ErasureCode{Data: k, Parity: m, Cell: cell}}); err != nil {
		t.Fatal(err)
	}
}

// firstGroup returns the layout of the file's first stripe group (with a
// write capability if write).
func firstGroup(t *testing.T, cl *sdk.Client, p string, write bool) (metaapi.Attr, metaapi.ChunkLayout) {
	t.Helper()
	ctx := context.Background()
	a, err := cl.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var resp metaapi.LayoutResp
	if err := cl.Meta().Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: a.Ino, Len: max(a.Size, 1), Write: write}, &resp); err != nil || len(resp.Chunks) == 0 {
		t.Fatalf("layout of %s: %v (%d groups)", p, err, len(resp.Chunks))
	}
	return a, resp.Chunks[0]
}

// closeNode shuts down the node with id and returns the others.
func closeNode(c *cluster.Cluster, id ids.NodeID) []*node.Node {
	var live []*node.Node
	for _, n := range c.Nodes {
		if n.ID() == id {
			n.Close()
		} else {
			live = append(live, n)
		}
	}
	return live
}

// groupUnits returns, for every stripe group of the file, its K+M units
// as stored on the nodes (in unit order), padded with zeros to one length.
func groupUnits(t *testing.T, c *cluster.Cluster, cl *sdk.Client, p string) [][][]byte {
	t.Helper()
	ctx := context.Background()
	a, err := cl.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var resp metaapi.LayoutResp
	if err := cl.Meta().Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: a.Ino, Off: 0, Len: max(a.Size, 1)}, &resp); err != nil {
		t.Fatal(err)
	}
	var out [][][]byte
	for _, l := range resp.Chunks {
		units := make([][]byte, len(l.Replicas))
		versions := make([]uint64, len(l.Replicas))
		longest := 0
		for u, r := range l.Replicas {
			for _, n := range c.Nodes {
				if n.ID() != r.Node {
					continue
				}
				rd, err := n.Store().OpenRead(l.Chunk)
				if err != nil {
					t.Fatalf("unit %d of group %v on node %v: %v", u, l.Chunk, r.Node, err)
				}
				units[u] = make([]byte, rd.Info().Length)
				if _, err := rd.ReadAt(units[u], 0); err != nil && err != io.EOF {
					t.Fatal(err)
				}
				// All units at one version, at least the one meta knows (a
				// failed write may have left them all past it).
				if v := rd.Info().Version; v < l.Version || versions[0] != 0 && v != versions[0] {
					t.Errorf("unit %d of group %v at version %d (unit 0 at %d), meta has %d", u, l.Chunk, v, versions[0], l.Version)
				}
				versions[u] = rd.Info().Version
				rd.Close()
				longest = max(longest, len(units[u]))
			}
		}
		for u := range units {
			if units[u] == nil {
				t.Fatalf("unit %d of group %v is on no node", u, l.Chunk)
			}
			units[u] = append(units[u], make([]byte, longest-len(units[u]))...)
		}
		out = append(out, units)
	}
	return out
}

// assertParityIsLibrarys: every group's parity units are byte-identical
// to reedsolomon.Encode of its data units.
func assertParityIsLibrarys(t *testing.T, c *cluster.Cluster, cl *sdk.Client, p string, k, m int) {
	t.Helper()
	enc, err := reedsolomon.New(k, m)
	if err != nil {
		t.Fatal(err)
	}
	for gi, units := range groupUnits(t, c, cl, p) {
		want := make([][]byte, k+m)
		for u := range want {
			want[u] = append([]byte(nil), units[u]...)
			if u >= k {
				want[u] = make([]byte, len(units[u]))
			}
		}
		if err := enc.Encode(want); err != nil {
			t.Fatal(err)
		}
		for u := k; u < k+m; u++ {
			if !bytes.Equal(units[u], want[u]) {
				t.Fatalf("%s group %d: parity unit %d differs from reedsolomon.Encode", p, gi, u)
			}
		}
	}
}

func getAll(t *testing.T, cl *sdk.Client, p string) []byte {
	t.Helper()
	var out bytes.Buffer
	if _, err := cl.Get(context.Background(), p, &out); err != nil {
		t.Fatalf("get %s: %v", p, err)
	}
	return out.Bytes()
}

// TestECModesMatchLibrary: streaming, per-chunk and central encoding all
// store parity byte-identical to reedsolomon.Encode, for random sizes and
// several codes, with overwrites and small writes (read-modify-write).
func TestECModesMatchLibrary(t *testing.T) {
	c := startCluster(t, 6)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	codes := [][2]int{{2, 1}, {3, 2}, {4, 2}, {3, 3}, {5, 1}}
	for _, mode := range []string{sdk.ECStream, sdk.ECPerChunk, sdk.ECCentral} {
		cl := newBenchClient(t, c, sdk.Options{WriteMsg: 200 << 10}, sdk.BenchOptions{ECMode: mode})
		for _, km := range codes {
			k, m := km[0], km[1]
			cell := int64(512 * (1 + rng.IntN(40)))
			dir := fmt.Sprintf("/%s-%d-%d", mode, k, m)
			ecDir(t, cl, dir, k, m, cell)
			data := randBytes(rng, 1+rng.IntN(600<<10))
			if _, err := cl.Put(ctx, dir+"/f", bytes.NewReader(data), 0o644); err != nil {
				t.Fatalf("%s RS(%d,%d) cell %d: put %d bytes: %v", mode, k, m, cell, len(data), err)
			}
			if got := getAll(t, cl, dir+"/f"); !bytes.Equal(got, data) {
				t.Fatalf("%s RS(%d,%d) cell %d: read back differs", mode, k, m, cell)
			}
			assertParityIsLibrarys(t, c, cl, dir+"/f", k, m)
			// Small writes, overwrites and appends.
			f, err := cl.Open(ctx, dir+"/f")
			if err != nil {
				t.Fatal(err)
			}
			for range 4 {
				off := rng.Int64N(int64(len(data)) + 5000)
				patch := randBytes(rng, 1+rng.IntN(3*int(cell)*k))
				if _, err := f.WriteAt(patch, off); err != nil {
					t.Fatalf("%s RS(%d,%d): write %d at %d: %v", mode, k, m, len(patch), off, err)
				}
				if end := off + int64(len(patch)); end > int64(len(data)) {
					data = append(data, make([]byte, end-int64(len(data)))...)
				}
				copy(data[off:], patch)
			}
			if got := getAll(t, cl, dir+"/f"); !bytes.Equal(got, data) {
				t.Fatalf("%s RS(%d,%d) cell %d: read after small writes differs", mode, k, m, cell)
			}
			assertParityIsLibrarys(t, c, cl, dir+"/f", k, m)
		}
	}
}

// TestECDegradedReads: with up to M units lost or corrupt, reads return
// the right bytes; with more, they fail rather than return wrong ones.
func TestECDegradedReads(t *testing.T) {
	c := startCluster(t, 5)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	ecDir(t, cl, "/ec", 3, 2, 4096)
	data := randBytes(rand.New(rand.NewPCG(5, 6)), 1<<20+12345)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	// Corrupt one byte of every unit file on node 0: its units fail their
	// checksums and count as lost.
	files, _ := filepath.Glob(filepath.Join(nodeDir(c, 0), "store", "chunks", "*", "*.chunk"))
	if len(files) == 0 {
		t.Fatal("no chunk files on node 0")
	}
	for _, f := range files {
		fh, err := os.OpenFile(f, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := []byte{0}
		fh.ReadAt(b, 5000)
		b[0] ^= 0x5a
		fh.WriteAt(b, 5000)
		fh.Close()
	}
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("read with one corrupt unit differs")
	}
	c.Nodes[1].Close() // a second unit lost: M = 2
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("read with one corrupt and one lost unit differs")
	}
	f, err := cl.Open(ctx, "/ec/f")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7000)
	if _, err := f.ReadAt(buf, 4000); err != nil || !bytes.Equal(buf, data[4000:11000]) {
		t.Fatalf("small degraded read: %v", err)
	}
	c.Nodes[2].Close() // three of five: beyond what RS(3,2) survives
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/ec/f", &out); err == nil {
		t.Fatal("read succeeded with three of five units gone")
	} else {
		t.Logf("read with three units gone: %v", err)
	}
}

// TestECPolicyErrors: codes the cluster cannot place are refused with a
// clear error, as are bad codes.
func TestECPolicyErrors(t *testing.T) {
	c := startCluster(t, 4)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	ecDir(t, cl, "/big", 4, 2, 4096)
	_, err := cl.Put(ctx, "/big/f", bytes.NewReader([]byte("hello")), 0o644)
	if err == nil || !bytesContain(err, "ENOSPC") {
		t.Fatalf("RS(4,2) on 4 nodes: %v", err)
	}
	for _, ec := range []metaapi.ErasureCode{{Data: 0, Parity: 2, Cell: 4096}, {Data: 4, Parity: 0, Cell: 4096}, {Data: 30, Parity: 3, Cell: 4096}, {Data: 2, Parity: 1, Cell: 1000}, {Data: 16, Parity: 2, Cell: 4 << 20}} {
		if err := cl.SetPolicy(ctx, "/big", metaapi.Policy{EC: &ec}); err == nil || !bytesContain(err, "EINVAL") {
			t.Errorf("policy %+v: %v", ec, err)
		}
	}
	cl2 := newBenchClient(t, c, sdk.Options{}, sdk.BenchOptions{ECMode: "bogus"})
	ecDir(t, cl, "/ok", 2, 1, 4096)
	if _, err := cl2.Put(ctx, "/ok/f", bytes.NewReader([]byte("x")), 0o644); err == nil || !bytesContain(err, "bogus") {
		t.Fatalf("unknown EC mode: %v", err)
	}
}

// TestECRepair: lost units are rebuilt where they belong — in place when
// their node is up, on another node when it is down — by distributed
// repair and by gathering, and the group is whole again: every unit at
// the group's version, parity equal to the library's.
func TestECRepair(t *testing.T) {
	// The repairs asked for are checked, so meta must not move the dead
	// node's unit by itself first, however slow the machine (issue 15,
	// defect 9): its grace period outlasts the test.
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 6, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, NodeTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond, RepairGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	ecDir(t, cl, "/ec", 3, 2, 4096)
	data := randBytes(rand.New(rand.NewPCG(8, 9)), 4<<20+333)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	_, l := firstGroup(t, cl, "/ec/f", false)
	nodeOf := func(id ids.NodeID) int {
		for i, n := range c.Nodes {
			if n.ID() == id {
				return i
			}
		}
		t.Fatalf("no node %v", id)
		return -1
	}
	// Healthy: nothing to do.
	if rep, err := cl.Repair(ctx, "/ec/f", sdk.RepairDistributed); err != nil || len(rep.Rebuilt) != 0 {
		t.Fatalf("repair of a healthy file: %+v %v", rep, err)
	}
	// Two units (a data and a parity unit) lost on live nodes: rebuilt in
	// place, distributed.
	for _, u := range []int{1, 4} {
		if err := c.Nodes[nodeOf(l.Replicas[u].Node)].Store().Delete(l.Chunk); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := cl.Repair(ctx, "/ec/f", sdk.RepairDistributed)
	if err != nil || len(rep.Rebuilt) != 2 {
		t.Fatalf("distributed repair: %+v %v", rep, err)
	}
	t.Logf("distributed: %+v", rep.Rebuilt)
	assertParityIsLibrarys(t, c, cl, "/ec/f", 3, 2)
	// A node down for good: its unit moves to the spare node, gathered.
	dead := nodeOf(l.Replicas[0].Node)
	c.Nodes[dead].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := cl.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		isDown := false
		for _, n := range st.Nodes {
			isDown = isDown || n.ID == l.Replicas[0].Node && n.State == metaapi.NodeDown
		}
		if isDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("meta never saw the node down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep, err = cl.Repair(ctx, "/ec/f", sdk.RepairGather)
	// Exactly the dead node's unit moves. (On a loaded machine another
	// node may look down for a moment; its unit is then rebuilt in place.)
	moved := 0
	for _, u := range rep.Rebuilt {
		if u.Moved {
			moved++
			if u.Unit != 0 || u.Node == l.Replicas[0].Node {
				t.Fatalf("moved unit %d to %v", u.Unit, u.Node)
			}
		}
	}
	if err != nil || moved != 1 {
		t.Fatalf("gather repair onto another node: %+v %v", rep, err)
	}
	live := c.Nodes[:dead:dead]
	live = append(live, c.Nodes[dead+1:]...)
	assertParityIsLibrarys(t, &cluster.Cluster{Nodes: live}, cl, "/ec/f", 3, 2)
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("read after repair differs")
	}
}

// TestECDegradedWriteIsRecordedAndRepaired: a parity unit's node is gone
// when a central-mode write runs: the data and the other parity units
// commit, the write fails naming the stripe group degraded, meta records
// it (status counts it), and repair --degraded rebuilds the missing unit
// on a live node, after which the group is whole and writable.
func TestECDegradedWriteIsRecordedAndRepaired(t *testing.T) {
	// Meta repairs nothing by itself here, so a write does not fail over:
	// this is the `sluice repair --degraded` path.
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 6, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, NodeTimeout: 2 * time.Second, HeartbeatInterval: 100 * time.Millisecond, RepairParallel: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newBenchClient(t, c, sdk.Options{BusyRetry: 2 * time.Second}, sdk.BenchOptions{ECMode: sdk.ECCentral})
	ctx := context.Background()
	ecDir(t, cl, "/ec", 3, 2, 4096)
	rng := rand.New(rand.NewPCG(4, 5))
	data := randBytes(rng, 300<<10)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	a, l := firstGroup(t, cl, "/ec/f", false)
	parity := l.Replicas[4].Node
	live := closeNode(c, parity)
	f, err := cl.Open(ctx, "/ec/f")
	if err != nil {
		t.Fatal(err)
	}
	patch := randBytes(rng, 50<<10)
	if _, err := f.WriteAt(patch, 1000); err == nil || !bytesContain(err, "degraded") {
		t.Fatalf("write with a parity node gone: %v", err)
	}
	if st, _ := cl.Status(ctx); st.Degraded != 1 {
		t.Fatalf("status counts %d degraded groups, want 1", st.Degraded)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, _ := cl.Status(ctx)
		if nodeStates(st)[parity] == metaapi.NodeDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("meta never saw the parity node down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// `sluice repair` has meta do the work (fenced, with a repair right
	// only meta mints): start its repair workers now. The repair grace
	// period keeps its own scan from getting there first.
	rc, err := cluster.StartRepair(c.Meta, c.MetaAddr, 2, false, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); rc.Close() })
	reps, err := cl.RepairDegraded(ctx, sdk.RepairDistributed)
	moved := 0
	for _, u := range reps[a.Ino].Rebuilt {
		if u.Moved {
			moved++
		}
	}
	if err != nil || moved != 1 || reps[a.Ino].Cleared != 1 {
		t.Fatalf("repair --degraded: %+v %v", reps, err)
	}
	if st, _ := cl.Status(ctx); st.Degraded != 0 {
		t.Fatalf("status still counts %d degraded groups", st.Degraded)
	}
	assertParityIsLibrarys(t, &cluster.Cluster{Nodes: live}, cl, "/ec/f", 3, 2)
	if _, err := f.WriteAt(patch, 1000); err != nil {
		t.Fatalf("write after repair: %v", err)
	}
	copy(data[1000:], patch)
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	assertParityIsLibrarys(t, &cluster.Cluster{Nodes: live}, cl, "/ec/f", 3, 2)
}

func nodeStates(st metaapi.StatusResp) map[ids.NodeID]metaapi.NodeState {
	out := map[ids.NodeID]metaapi.NodeState{}
	for _, n := range st.Nodes {
		out[n.ID] = n.State
	}
	return out
}

// TestECManyShapes: the streaming write path (data nodes' partial
// parities, parity nodes' aggregation) stores the library's parity for
// edge shapes and a random sample of the others up to 16 units, with
// random sizes. (internal/erasure checks the arithmetic for every shape
// up to 32 units.)
func TestECManyShapes(t *testing.T) {
	if testing.Short() {
		t.Skip("16 nodes")
	}
	c := startCluster(t, 16)
	cl := newClient(t, c, sdk.Options{WriteMsg: 256 << 10})
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	shapes := [][2]int{{1, 1}, {1, 15}, {15, 1}, {8, 8}, {10, 4}}
	for len(shapes) < 12 {
		k := 1 + rng.IntN(15)
		shapes = append(shapes, [2]int{k, 1 + rng.IntN(16-k)})
	}
	for i, km := range shapes {
		k, m := km[0], km[1]
		cell := int64(512 * (1 + rng.IntN(16)))
		dir := fmt.Sprintf("/shape-%d", i)
		ecDir(t, cl, dir, k, m, cell)
		data := randBytes(rng, 1+rng.IntN(300<<10))
		if _, err := cl.Put(ctx, dir+"/f", bytes.NewReader(data), 0o644); err != nil {
			t.Fatalf("RS(%d,%d) cell %d, %d bytes: %v", k, m, cell, len(data), err)
		}
		if got := getAll(t, cl, dir+"/f"); !bytes.Equal(got, data) {
			t.Fatalf("RS(%d,%d) cell %d: read back differs", k, m, cell)
		}
		assertParityIsLibrarys(t, c, cl, dir+"/f", k, m)
	}
}

// TestECWriteWithDataNodeDown: a streaming write while a data unit's node
// is down fails within seconds, naming the group degraded (the parity
// units give up waiting for its partial), rather than hanging; reads
// still decode.
func TestECWriteWithDataNodeDown(t *testing.T) {
	c := startCluster(t, 5)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	ecDir(t, cl, "/ec", 3, 2, 4096)
	data := randBytes(rand.New(rand.NewPCG(6, 7)), 200<<10)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	_, l := firstGroup(t, cl, "/ec/f", false)
	closeNode(c, l.Replicas[1].Node)
	f, err := cl.Open(ctx, "/ec/f")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = f.WriteAt(randBytes(rand.New(rand.NewPCG(1, 1)), 30<<10), 5000)
	if err == nil || !bytesContain(err, "degraded") || time.Since(start) > 15*time.Second {
		t.Fatalf("write with a data node down: %v after %s", err, time.Since(start))
	}
	t.Logf("failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("degraded read after the failed write differs")
	}
}
