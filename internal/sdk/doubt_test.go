package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// busyRank1 creates /t in a tree directory and makes its first chunk's
// rank 1 busy (a write held open on its store), as a replica still
// aborting an earlier write is.
func busyRank1(t *testing.T, c *cluster.Cluster, cl *sdk.Client) (*sdk.File, ids.ChunkID, *store.Write) {
	t.Helper()
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
	for _, n := range c.Nodes {
		if n.ID() == rank1 {
			held, err := n.Store().BeginWrite(chunk, 0, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			return f, chunk, held
		}
	}
	t.Fatal("rank 1 is not in the cluster")
	return nil, 0, nil
}

func linkCluster(t *testing.T) (*cluster.Cluster, *fabric.Link) {
	l, _ := fabric.NewLink(125e6, 5*time.Microsecond)
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 3, MetaListen: "127.0.0.1:0", ChunkSize: testChunk,
		Fabric: fabric.Options{Link: l}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, l
}

// TestTreeRetryAfterBusySiblingOverLink: TestTreeRetryAfterBusySibling
// over an emulated 1 Gbit/s link and with writes of several packets. A
// retry reaches rank 2, which has the write and answers "already
// applied" before rank 0 has forwarded all the data: rank 0 must take
// that early answer as success.
func TestTreeRetryAfterBusySiblingOverLink(t *testing.T) {
	for _, size := range []int{4000, 64 << 10, 200 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			c, l := linkCluster(t)
			cl := newBenchClient(t, c, sdk.Options{}, sdk.BenchOptions{LinkRate: l.Rate(), LinkDelay: l.Delay()})
			f, _, held := busyRank1(t, c, cl)
			time.AfterFunc(200*time.Millisecond, held.Abort)
			data := bytes.Repeat([]byte("tree"), size/4)
			if _, err := f.WriteAt(data, 0); err != nil {
				t.Fatalf("write through a busy sibling (busy retries %d): %v", cl.Stats().BusyRetries, err)
			}
			if cl.Stats().BusyRetries == 0 {
				t.Fatal("the write never met the busy sibling")
			}
			assertReplicasIdentical(t, c)
		})
	}
}

// TestTreeFailedWriteLeavesNoDivergence: a tree write meets a busy rank 1
// until the client gives up, after rank 2 may have committed it. The
// client's error says the write may have reached some replicas; rank 0
// then refuses a write inside it (which it would otherwise give the same
// version rank 2 already has) and accepts a covering one, after which
// every replica is identical.
func TestTreeFailedWriteLeavesNoDivergence(t *testing.T) {
	c, l := linkCluster(t)
	cl := newBenchClient(t, c, sdk.Options{BusyRetry: time.Second}, sdk.BenchOptions{LinkRate: l.Rate(), LinkDelay: l.Delay()})
	f, chunk, held := busyRank1(t, c, cl)
	_, err := f.WriteAt(bytes.Repeat([]byte("A"), 4000), 0)
	held.Abort()
	if s, ok := statusOfErr(err); !ok || s != wire.StatusBusy {
		t.Fatalf("write through a rank 1 busy for longer than the retry budget: %v", err)
	}
	partial := wire.IsPartial(err)
	t.Logf("first write (partial %v): %v", partial, err)
	var doubt bool
	for _, n := range c.Nodes {
		if _, ok := n.Store().Doubt(chunk); ok {
			doubt = true
		}
	}
	if doubt && !partial {
		t.Fatal("rank 0 holds the write in doubt but the client was not told it may have reached some replicas")
	}
	_, err = f.WriteAt(bytes.Repeat([]byte("B"), 1000), 1000)
	t.Logf("write inside it: %v", err)
	// Rank 0 refuses a write inside the unresolved one; the client then
	// has meta reconcile the chunk (every replica at one version, the
	// doubt resolved) and the write succeeds.
	if doubt && err != nil && !strings.Contains(err.Error(), "unresolved write") {
		t.Fatalf("a write inside an unresolved one failed otherwise: %v", err)
	}
	if !doubt && err != nil {
		t.Fatalf("write after a failed write that reached no replica: %v", err)
	}
	assertNoSameVersionDivergence(t, c, chunk)
	want := bytes.Repeat([]byte("C"), 8000)
	if _, err := f.WriteAt(want, 0); err != nil {
		t.Fatalf("covering write: %v", err)
	}
	assertReplicasIdentical(t, c)
	var out bytes.Buffer
	if _, err := cl.Get(context.Background(), "/t", &out); err != nil || !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("read back: %v", err)
	}
}

// assertNoSameVersionDivergence fails if two replicas of chunk are at
// the same version with different bytes: no version check can see that.
func assertNoSameVersionDivergence(t *testing.T, c *cluster.Cluster, chunk ids.ChunkID) {
	t.Helper()
	seen := map[uint64][]byte{}
	for _, n := range c.Nodes {
		rd, err := n.Store().OpenRead(chunk)
		if err != nil {
			continue
		}
		info := rd.Info()
		data := make([]byte, info.Length)
		rd.ReadAt(data, 0)
		rd.Close()
		if prev, ok := seen[info.Version]; ok && info.Version != 0 && !bytes.Equal(prev, data) {
			t.Fatalf("two replicas at version %d with different bytes", info.Version)
		}
		seen[info.Version] = data
	}
}

// TestTreeUnderTableFull: nodes with a tiny request table refuse requests
// busy under load — forwarded ones at rank 1 or 2 included, while the
// sibling commits. Concurrent writers of overlapping ranges retry through
// it; writes that give up may leave replicas a version apart but never
// diverged at one version, and a covering write per file afterwards
// leaves every replica identical.
func TestTreeUnderTableFull(t *testing.T) {
	for _, s := range []plan.Plan{{Strategy: plan.Tree}, {Strategy: plan.Tree, Mode: plan.Host}} {
		t.Run(s.String(), func(t *testing.T) {
			c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 3, MetaListen: "127.0.0.1:0", ChunkSize: testChunk,
				Engine: engine.Options{TableSize: 2, Workers: 1}})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			setup := newClient(t, c, sdk.Options{})
			if err := setup.SetPolicy(ctx, "/", metaapi.Policy{Replicas: 3, Strategy: s}); err != nil {
				t.Fatal(err)
			}
			names := []string{"/x0", "/x1", "/x2", "/x3"}
			for _, name := range names {
				f, err := setup.Create(ctx, name, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(make([]byte, 8000), 0); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			fails, retries := 0, uint64(0)
			for w := range 12 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cl := newClient(t, c, sdk.Options{BusyRetry: 2 * time.Second})
					defer func() { mu.Lock(); retries += cl.Stats().BusyRetries; mu.Unlock() }()
					g, err := cl.Open(ctx, names[w%4])
					if err != nil {
						t.Error(err)
						return
					}
					for r := range 40 {
						if _, err := g.WriteAt(bytes.Repeat([]byte{byte(1 + w)}, 3000), int64(r%3)*1000); err != nil {
							mu.Lock()
							fails++
							mu.Unlock()
							return
						}
					}
				}()
			}
			wg.Wait()
			t.Logf("writers that gave up: %d; busy retries: %d", fails, retries)
			if retries == 0 {
				t.Fatal("no request was refused busy: the table never filled")
			}
			for _, name := range names {
				f, err := setup.Open(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(bytes.Repeat([]byte{0xEE}, 8000), 0); err != nil {
					t.Fatalf("covering write to %s: %v", name, err)
				}
			}
			assertReplicasIdentical(t, c)
		})
	}
}

// TestFlatFirstWriteInDoubt: the replica side of issue 15's defect 4. A
// flat writer reserves version 1 of a new chunk at rank 0 and dies
// before sending any data; the reservation expires into a doubt at rank
// 0, and no replica holds anything. A later write that does not cover
// the doubted range is refused "unresolved write" by rank 0, so the
// writer has meta reconcile the chunk: the chunk's version is 0, and
// rank 0 must drop the doubt (nothing to resolve it to) for the write to
// succeed.
func TestFlatFirstWriteInDoubt(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 3, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, ReserveTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Rank 0 answers a write the doubt does not admit busy (its writer may
	// be retrying it): ask meta sooner than the default 30 s.
	cl := newClient(t, c, sdk.Options{BusyRetry: time.Second})
	ctx := context.Background()
	if err := cl.MkdirAll(ctx, "/flat", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cl.SetPolicy(ctx, "/flat", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Flat}}); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Create(ctx, "/flat/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	_, l := firstGroup(t, cl, "/flat/f", true)
	send := rawUnitSender(t, l)
	res := wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: l.Chunk, Len: 4096, Cap: l.Cap, WriteID: 0xdead}
	if v := send(0, res, nil).Version; v != 1 {
		t.Fatalf("reserved version %d of a new chunk", v)
	}
	head := waitDoubt(t, c, &l)
	data := []byte("after the doubt")
	const at = 64 << 10 // outside the doubted [0, 4096)
	if _, err := f.WriteAt(data, at); err != nil {
		t.Fatalf("write to the chunk whose first write was left in doubt: %v", err)
	}
	if _, ok := head.Store().Doubt(l.Chunk); ok {
		t.Fatal("rank 0 still holds the doubt")
	}
	want := make([]byte, at+len(data))
	copy(want[at:], data)
	if got := getAll(t, cl, "/flat/f"); !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes, want %d", len(got), len(want))
	}
}
