package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/store"
)

// waitRedundancy waits until a scan of meta's after since finds every
// chunk and stripe group at full redundancy with nothing left to repair.
func waitRedundancy(t *testing.T, cl *sdk.Client, since time.Time, timeout time.Duration) metaapi.StatusResp {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := cl.WaitRepaired(ctx, since)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// layoutOf returns the read layout of every chunk of p.
func layoutOf(t *testing.T, cl *sdk.Client, p string) metaapi.LayoutResp {
	t.Helper()
	ctx := context.Background()
	a, err := cl.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	var lay metaapi.LayoutResp
	if err := cl.Meta().Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: a.Ino, Len: a.Size}, &lay); err != nil {
		t.Fatal(err)
	}
	return lay
}

// copies lists, for every chunk the live nodes hold, the nodes holding
// it with its version and bytes.
func copies(t *testing.T, c *cluster.Cluster, live map[int]bool) map[ids.ChunkID]map[ids.NodeID]string {
	t.Helper()
	out := map[ids.ChunkID]map[ids.NodeID]string{}
	for i, n := range c.Nodes {
		if !live[i] {
			continue
		}
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
			if out[id] == nil {
				out[id] = map[ids.NodeID]string{}
			}
			out[id][n.ID()] = fmt.Sprintf("v%d:%x", info.Version, data)
		}
	}
	return out
}

// TestRepairAfterNodeLoss: a node dies for good; once its grace period
// is over meta moves its replicas and stripe units to the other nodes by
// itself, and every chunk is whole again — three identical replicas or
// a complete stripe group on live nodes — with the data intact.
func TestRepairAfterNodeLoss(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 5, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, NodeTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond, RepairGrace: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	ecDir(t, cl, "/ec", 2, 2, 4096)
	rng := rand.New(rand.NewPCG(6, 1))
	files := map[string][]byte{}
	for i := range 4 {
		files[fmt.Sprintf("/r3/f%d", i)] = randBytes(rng, 2*testChunk+rng.IntN(testChunk))
		files[fmt.Sprintf("/ec/f%d", i)] = randBytes(rng, 2*testChunk+rng.IntN(testChunk))
	}
	for p, data := range files {
		if _, err := cl.Put(ctx, p, bytes.NewReader(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := waitRedundancy(t, cl, time.Now(), 10*time.Second)
	t.Logf("before: %+v", before.Redundancy)
	if r := before.Redundancy; r.Replicated.Full < 8 || r.Striped.Full < 4 {
		t.Fatalf("tallies before the loss: %+v, want every chunk and group of the files", r)
	}

	victim := 1
	gone := c.Nodes[victim].ID()
	c.Nodes[victim].Close()
	start := time.Now()
	st := waitRedundancy(t, cl, start.Add(2*time.Second), 60*time.Second)
	t.Logf("redundancy restored %s after the node's death: %+v, repair %+v", time.Since(start).Round(100*time.Millisecond), st.Redundancy, st.Repair)
	if st.Repair.Done == 0 || st.Repair.Bytes == 0 {
		t.Fatalf("nothing was repaired: %+v", st.Repair)
	}

	live := map[int]bool{0: true, 2: true, 3: true, 4: true}
	held := copies(t, c, live)
	for p, data := range files {
		var out bytes.Buffer
		if _, err := cl.Get(ctx, p, &out); err != nil || !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("%s after repair: %v", p, err)
		}
	}
	// Every replicated chunk: exactly three identical copies on live
	// nodes, none meant for the dead one.
	for id, byNode := range held {
		if _, ok := byNode[gone]; ok {
			t.Fatalf("chunk %v on the dead node %v", id, gone)
		}
	}
	n3 := 0
	for p := range files {
		if p[:3] != "/r3" {
			continue
		}
		lay := layoutOf(t, cl, p)
		for _, ch := range lay.Chunks {
			reps := held[ch.Chunk]
			if len(reps) != 3 {
				t.Errorf("%s chunk %d (%v): %d copies on live nodes, want 3", p, ch.Index, ch.Chunk, len(reps))
			}
			var first string
			for _, r := range ch.Replicas {
				if r.Node == gone {
					t.Errorf("%s chunk %d still lists the dead node", p, ch.Index)
				}
				got, ok := reps[r.Node]
				switch {
				case !ok:
					t.Errorf("%s chunk %d: replica node %v holds no copy", p, ch.Index, r.Node)
				case first == "":
					first = got
				case got != first:
					t.Errorf("%s chunk %d: replicas differ", p, ch.Index)
				}
			}
			n3++
		}
	}
	if n3 == 0 {
		t.Fatal("no replicated chunks checked")
	}
}

// TestWriteFailsOver: a write to a chunk one of whose replicas is dead
// (and not yet marked down) succeeds: meta replaces the dead member, the
// write lands on the new set, and all three replicas agree.
func TestWriteFailsOver(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 4, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, NodeTimeout: 10 * time.Second, HeartbeatInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	for _, strategy := range []plan.Plan{{Strategy: plan.Ring}, {Strategy: plan.Tree}, {Strategy: plan.Flat}} {
		dir := "/" + strategy.String()
		if err := cl.MkdirAll(ctx, dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := cl.SetPolicy(ctx, dir, metaapi.Policy{Replicas: 3, Strategy: strategy}); err != nil {
			t.Fatal(err)
		}
	}
	// One file per strategy, every chunk on node 0's... any three nodes.
	rng := rand.New(rand.NewPCG(3, 3))
	data := map[string][]byte{}
	for _, strategy := range []plan.Plan{{Strategy: plan.Ring}, {Strategy: plan.Tree}, {Strategy: plan.Flat}} {
		p := "/" + strategy.String() + "/f"
		data[p] = randBytes(rng, 2*testChunk)
		if _, err := cl.Put(ctx, p, bytes.NewReader(data[p]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ecDir(t, cl, "/ec", 2, 1, 4096)
	data["/ec/f"] = randBytes(rng, 2*testChunk)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data["/ec/f"]), 0o644); err != nil {
		t.Fatal(err)
	}
	// Kill the head of the ring file's first chunk: meta still thinks it
	// is up (10 s timeout).
	_, first := firstGroup(t, cl, "/ring/f", false)
	gone := first.Replicas[0].Node
	victim, live := -1, map[int]bool{}
	for i, n := range c.Nodes {
		if n.ID() == gone {
			victim = i
		} else {
			live[i] = true
		}
	}
	c.Nodes[victim].Close()
	for p, want := range data {
		f, err := cl.Open(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		patch := randBytes(rng, testChunk+12345) // spans both chunks
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		start := time.Now()
		_, err = f.WriteAtContext(wctx, patch, 1000)
		cancel()
		if err != nil {
			t.Fatalf("%s: write with a dead replica: %v", p, err)
		}
		t.Logf("%s: write with a dead replica took %s", p, time.Since(start).Round(10*time.Millisecond))
		copy(want[1000:], patch)
		var out bytes.Buffer
		if _, err := cl.Get(ctx, p, &out); err != nil || !bytes.Equal(out.Bytes(), want) {
			t.Fatalf("%s: read after the fail-over: %v", p, err)
		}
		lay := layoutOf(t, cl, p)
		held := copies(t, c, live)
		for _, ch := range lay.Chunks {
			if p == "/ec/f" {
				for _, r := range ch.Replicas {
					if r.Node == gone {
						t.Errorf("%s group %d: a unit is still on the dead node after a write succeeded", p, ch.Index)
					}
				}
				continue
			}
			var first string
			for _, r := range ch.Replicas {
				if r.Node == gone {
					t.Errorf("%s chunk %d: the dead node is still a replica after a write succeeded", p, ch.Index)
					continue
				}
				got, ok := held[ch.Chunk][r.Node]
				switch {
				case !ok:
					t.Errorf("%s chunk %d: replica %v holds nothing", p, ch.Index, r.Node)
				case first == "":
					first = got
				case got != first:
					t.Errorf("%s chunk %d: replicas differ after the fail-over", p, ch.Index)
				}
			}
		}
	}
}

// TestRepairRateLimit: with a repair rate set, restoring redundancy
// after a node's loss takes at least as long as the rate allows (a lower
// bound only: a slow machine is never wrong).
func TestRepairRateLimit(t *testing.T) {
	const rate = 4 << 20
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 4, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, NodeTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond, RepairGrace: time.Second,
		RepairRate: rate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/r3", 3)
	data := randBytes(rand.New(rand.NewPCG(9, 9)), 36*testChunk)
	if _, err := cl.Put(ctx, "/r3/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	waitRedundancy(t, cl, time.Now(), 10*time.Second)
	c.Nodes[2].Close()
	start := time.Now()
	st := waitRedundancy(t, cl, start.Add(time.Second), 60*time.Second)
	took := time.Since(start)
	// The first 4 MiB are a burst; the rest wait for the rate.
	floor := time.Duration(float64(st.Repair.Bytes-4<<20) / rate * float64(time.Second))
	t.Logf("repaired %d bytes in %s at a limit of %d B/s (no faster than %s)", st.Repair.Bytes, took.Round(100*time.Millisecond), rate, floor.Round(100*time.Millisecond))
	if st.Repair.Bytes < 20*testChunk {
		t.Fatalf("only %d bytes repaired: the node held too little to measure", st.Repair.Bytes)
	}
	if took < floor {
		t.Fatalf("repaired %d bytes in %s, faster than the %d B/s limit allows (%s)", st.Repair.Bytes, took, rate, floor)
	}
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/r3/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("read after the repair: %v", err)
	}
}

// cancelOnWrite cancels a context when the first bytes arrive.
type cancelOnWrite struct {
	bytes.Buffer
	cancel func()
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.cancel()
	return w.Buffer.Write(p)
}

// TestGetCancelledIsAnError: a Get whose context ends before the file is
// read returns an error, never a short file as if it were whole (the
// chaos run found this: a reader stopped mid-Get saw an empty file).
func TestGetCancelledIsAnError(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{Parallel: 1, ReadReq: 256 << 10})
	data := randBytes(rand.New(rand.NewPCG(5, 5)), 8*testChunk)
	if _, err := cl.Put(context.Background(), "/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	short := 0
	for i := range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		out := &cancelOnWrite{cancel: cancel}
		n, err := cl.Get(ctx, "/f", out)
		cancel()
		if err == nil && (n != int64(len(data)) || !bytes.Equal(out.Bytes(), data)) {
			t.Fatalf("Get %d, cancelled as it wrote, returned %d of %d bytes and no error", i, n, len(data))
		}
		if err != nil {
			short++
		}
	}
	if short == 0 {
		t.Fatal("no Get was cut short: the test did not test anything")
	}
}
