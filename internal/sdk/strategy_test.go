package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestEveryStrategy: each of the five strategies stores byte-identical
// replicas for K = 2..4, across chunk boundaries, with overwrites.
func TestEveryStrategy(t *testing.T) {
	c := startCluster(t, 4)
	cl := newClient(t, c, sdk.Options{WriteMsg: 300 << 10})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 7))
	for _, s := range plan.Replicated() {
		for _, k := range []int{2, 3, 4} {
			dir := fmt.Sprintf("/%s-%d", s, k)
			if err := cl.Mkdir(ctx, dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := cl.SetPolicy(ctx, dir, metaapi.Policy{Replicas: k, Strategy: s}); err != nil {
				t.Fatal(err)
			}
			data := randBytes(rng, 2*testChunk+5000)
			if _, err := cl.Put(ctx, dir+"/f", bytes.NewReader(data), 0o644); err != nil {
				t.Fatalf("%s k=%d: put: %v", s, k, err)
			}
			f, err := cl.Open(ctx, dir+"/f")
			if err != nil {
				t.Fatal(err)
			}
			patch := randBytes(rng, 70000)
			if _, err := f.WriteAt(patch, testChunk-1000); err != nil { // overwrite across a chunk boundary
				t.Fatalf("%s k=%d: overwrite: %v", s, k, err)
			}
			copy(data[testChunk-1000:], patch)
			var out bytes.Buffer
			if _, err := cl.Get(ctx, dir+"/f", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("%s k=%d: read back differs: %v", s, k, err)
			}
		}
	}
	assertReplicasIdentical(t, c)
}

// TestStrategiesUnderConcurrentWriters: concurrent overlapping writers
// leave byte-identical replicas whatever the strategy.
func TestStrategiesUnderConcurrentWriters(t *testing.T) {
	c := startCluster(t, 4)
	ctx := context.Background()
	setup := newClient(t, c, sdk.Options{})
	for _, s := range []plan.Plan{{Strategy: plan.Tree}, {Strategy: plan.Flat}, {Strategy: plan.Ring, Mode: plan.Host}, {Strategy: plan.Tree, Mode: plan.Host}} {
		dir := "/cw-" + s.String()
		setup.Mkdir(ctx, dir, 0o755)
		if err := setup.SetPolicy(ctx, dir, metaapi.Policy{Replicas: 4, Strategy: s}); err != nil {
			t.Fatal(err)
		}
		f, err := setup.Create(ctx, dir+"/x", 0o644)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt(make([]byte, 100000), 0)
		var wg sync.WaitGroup
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				cl := newClient(t, c, sdk.Options{})
				g, err := cl.Open(ctx, dir+"/x")
				if err != nil {
					t.Error(err)
					return
				}
				for r := 0; r < 8; r++ {
					if _, err := g.WriteAt(bytes.Repeat([]byte{byte(1 + w)}, 60000), int64(r%3)*10000); err != nil {
						t.Errorf("%s writer %d: %v", s, w, err)
						return
					}
				}
			}(w)
		}
		wg.Wait()
	}
	assertReplicasIdentical(t, c)
}

// TestAuthProtocols: single-replica writes by each protocol store the same
// bytes; raw writes are refused unless the nodes allow them.
func TestAuthProtocols(t *testing.T) {
	c := startCluster(t, 1)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(8, 8))
	for _, p := range []string{sdk.ProtoStream, sdk.ProtoRPC, sdk.ProtoRPCPull} {
		cl := newBenchClient(t, c, sdk.Options{WriteMsg: 400 << 10}, sdk.BenchOptions{Protocol: p})
		for _, n := range []int{0, 1, 4096, 3*testChunk + 17} {
			data := randBytes(rng, n)
			path := fmt.Sprintf("/%s-%d", p, n)
			if _, err := cl.Put(ctx, path, bytes.NewReader(data), 0o644); err != nil {
				t.Fatalf("%s n=%d: %v", p, n, err)
			}
			var out bytes.Buffer
			if _, err := cl.Get(ctx, path, &out); err != nil || !bytes.Equal(out.Bytes(), data) {
				t.Fatalf("%s n=%d: read back differs: %v", p, n, err)
			}
		}
	}
	raw := newBenchClient(t, c, sdk.Options{}, sdk.BenchOptions{Protocol: sdk.ProtoRaw})
	_, err := raw.Put(ctx, "/raw", bytes.NewReader([]byte("unauthenticated")), 0o644)
	if s, ok := statusOfErr(err); !ok || s != wire.StatusAuth || !strings.Contains(err.Error(), "raw") {
		t.Fatalf("raw write on a normal node: %v", err)
	}
	// A protocol meant for one replica is refused for more.
	c3 := startCluster(t, 3)
	cl3 := newBenchClient(t, c3, sdk.Options{}, sdk.BenchOptions{Protocol: sdk.ProtoRPC})
	if _, err := cl3.Put(ctx, "/x", bytes.NewReader([]byte("x")), 0o644); err == nil || !strings.Contains(err.Error(), "single-replica") {
		t.Fatalf("rpc protocol with 3 replicas: %v", err)
	}
}

func TestRawWritesWhenAllowed(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 1, MetaListen: "127.0.0.1:0", AllowRaw: true, ChunkSize: testChunk})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := newBenchClient(t, c, sdk.Options{}, sdk.BenchOptions{Protocol: sdk.ProtoRaw})
	data := randBytes(rand.New(rand.NewPCG(9, 9)), 2*testChunk+3)
	if _, err := cl.Put(context.Background(), "/raw", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := cl.Get(context.Background(), "/raw", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("raw write read back: %v", err)
	}
}

func statusOfErr(err error) (wire.Status, bool) {
	var we *wire.Error
	if err == nil || !errorsAs(err, &we) {
		return 0, false
	}
	return we.Status, true
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// TestTreeRetryAfterBusySibling: in a tree, rank 0 sends to ranks 1 and 2
// independently. If rank 1 refuses busy while rank 2 commits, the client's
// retry must not be refused as stale by rank 2: it recognises the write
// (same version, same write id) and answers that it already has it.
func TestTreeRetryAfterBusySibling(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	if err := cl.SetPolicy(ctx, "/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Tree}}); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Create(ctx, "/t", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var lay metaapi.LayoutResp
	if err := cl.Meta().Call(ctx, metaapi.OpLayout, metaapi.LayoutReq{Ino: f.Attr().Ino, Off: 0, Len: 1, Write: true}, &lay); err != nil {
		t.Fatal(err)
	}
	chunk, rank1 := lay.Chunks[0].Chunk, lay.Chunks[0].Replicas[1].Node
	var held *store.Write
	for _, n := range c.Nodes {
		if n.ID() == rank1 {
			if held, err = n.Store().BeginWrite(chunk, 0, 1, 0); err != nil { // rank 1 is busy with this chunk
				t.Fatal(err)
			}
		}
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		held.Abort()
	}()
	data := bytes.Repeat([]byte("tree"), 1000)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatalf("write through a busy sibling: %v", err)
	}
	if cl.Stats().BusyRetries == 0 {
		t.Fatal("the write never met the busy sibling: the test does not test anything")
	}
	var out bytes.Buffer
	if _, err := cl.Get(ctx, "/t", &out); err != nil || !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("read back: %v", err)
	}
	assertReplicasIdentical(t, c)
	// And the chunk keeps taking writes.
	if _, err := f.WriteAt([]byte("more"), 4000); err != nil {
		t.Fatalf("next write: %v", err)
	}
	assertReplicasIdentical(t, c)
}
