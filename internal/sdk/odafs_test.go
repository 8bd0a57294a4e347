package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestOptimisticReads: against nodes with exported caches, a client with
// ODAFS on reads small blocks a second time with one-sided reads through
// the references the first reads' replies brought, and gets the file's
// bytes; after another client overwrites a block, the next read of it
// falls back to a request (its slot was dropped when the write
// committed) and returns the new bytes. With no client cache, nothing
// stale is ever returned. Over TCP the nodes check each optimistic read
// against the shared exported cache; over shared memory the client
// copies from a cache of its own.
func TestOptimisticReads(t *testing.T) {
	for _, fm := range []fabric.Fabric{fabric.FabricTCP, fabric.FabricShm} {
		t.Run(map[fabric.Fabric]string{fabric.FabricTCP: "tcp", fabric.FabricShm: "shm"}[fm], func(t *testing.T) { testOptimisticReads(t, fm) })
	}
}

func testOptimisticReads(t *testing.T, fm fabric.Fabric) {
	c := startClusterWith(t, cluster.Options{Nodes: 3, ExportCache: 4 << 20, ExportBlock: 4096, Fabric: fabric.Options{Fabric: fabric.FabricAuto}})
	ctx := context.Background()
	cl := newClient(t, c, sdk.Options{ODAFS: &odafs.Options{CacheBytes: -1}, Fabric: fm})
	other := newClient(t, c, sdk.Options{})
	for _, k := range []int{1, 3} {
		dir := "/r" + string(rune('0'+k))
		if err := other.Mkdir(ctx, dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := other.SetPolicy(ctx, dir, metaapi.Policy{Replicas: k, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 3<<20+123)
		rng := rand.New(rand.NewPCG(uint64(k), 9))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		if _, err := other.Put(ctx, dir+"/f", bytes.NewReader(data), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := cl.Open(ctx, dir+"/f")
		if err != nil {
			t.Fatal(err)
		}
		offs := make([]int64, 40)
		for i := range offs {
			offs[i] = rng.Int64N(int64(len(data)) - 4096)
		}
		offs[0] = int64(len(data)) - 100 // the file's last, short block
		read := func(off int64) []byte {
			buf := make([]byte, min(4096, int64(len(data))-off))
			if _, err := f.ReadAt(buf, off); err != nil {
				t.Fatalf("read at %d: %v", off, err)
			}
			return buf
		}
		for _, off := range offs { // by request: references learnt
			if got := read(off); !bytes.Equal(got, data[off:off+int64(len(got))]) {
				t.Fatalf("replicas %d: first read at %d: wrong bytes", k, off)
			}
		}
		before := cl.Stats()
		for _, off := range offs {
			if got := read(off); !bytes.Equal(got, data[off:off+int64(len(got))]) {
				t.Fatalf("replicas %d: second read at %d: wrong bytes", k, off)
			}
		}
		after := cl.Stats()
		t.Logf("replicas %d: %d optimistic, %d fell back", k, after.Optimistic-before.Optimistic, after.OptimisticFallbacks-before.OptimisticFallbacks)
		if n := after.Optimistic - before.Optimistic; n < uint64(len(offs))*3/4 {
			t.Fatalf("replicas %d: %d of %d second reads optimistic (%d fell back)", k, n, len(offs), after.OptimisticFallbacks-before.OptimisticFallbacks)
		}
		// Another client overwrites the first read's block.
		patch := bytes.Repeat([]byte{0xAB}, 4096)
		off := offs[1]
		g, err := other.Open(ctx, dir+"/f")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := g.WriteAt(patch, off); err != nil {
			t.Fatal(err)
		}
		copy(data[off:], patch)
		s0 := cl.Stats()
		got := read(off)
		t.Logf("after write: optimistic +%d, fallbacks +%d", cl.Stats().Optimistic-s0.Optimistic, cl.Stats().OptimisticFallbacks-s0.OptimisticFallbacks)
		if !bytes.Equal(got, data[off:off+int64(len(got))]) {
			t.Fatalf("replicas %d: read after another client's write returned the old bytes", k)
		}
	}
}

// BenchmarkRead4KODAFS: 4 KiB reads through File.ReadAt of blocks a node
// holds, by request and optimistically (replicas 1, in-process cluster).
func BenchmarkRead4KODAFS(b *testing.B) {
	c := startClusterWith(b, cluster.Options{Nodes: 1, ExportCache: 16 << 20, ExportBlock: 4096, Fabric: fabric.Options{Fabric: fabric.FabricAuto}})
	ctx := context.Background()
	for _, fm := range []fabric.Fabric{fabric.FabricTCP, fabric.FabricShm} {
		for _, mode := range []string{"request", "dafs-cache", "optimistic"} {
			b.Run(map[fabric.Fabric]string{fabric.FabricTCP: "tcp", fabric.FabricShm: "shm"}[fm]+"/"+mode, func(b *testing.B) {
				opts := sdk.Options{Fabric: fm}
				if mode == "optimistic" {
					opts.ODAFS = &odafs.Options{CacheBytes: -1}
				}
				cl := newClient(b, c, opts)
				name := fmt.Sprintf("/b-%v-%s", fm, mode)
				data := make([]byte, 1<<20)
				if _, err := cl.Put(ctx, name, bytes.NewReader(data), 0o644); err != nil {
					b.Fatal(err)
				}
				f, err := cl.Open(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, 4096)
				for off := int64(0); off < 1<<20; off += 4096 {
					f.ReadAt(buf, off)
				}
				i := 0
				for b.Loop() {
					if _, err := f.ReadAt(buf, int64(i%256)*4096); err != nil {
						b.Fatal(err)
					}
					i++
				}
				b.ReportMetric(float64(cl.Stats().Optimistic)/float64(b.N), "optimistic/op")
			})
		}
	}
}

// TestOptimisticReadsNodesDie: the nodes a client holds references to
// die; its reads still return the file's bytes, by request from the
// replica left, the optimistic reads that cannot reach their node
// falling back.
func TestOptimisticReadsNodesDie(t *testing.T) {
	c := startClusterWith(t, cluster.Options{Nodes: 3, ExportCache: 4 << 20, ExportBlock: 4096})
	ctx := context.Background()
	cl := newClient(t, c, sdk.Options{ODAFS: &odafs.Options{CacheBytes: -1}, BusyRetry: 2 * time.Second})
	if err := cl.SetPolicy(ctx, "/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
		t.Fatal(err)
	}
	readAll := blockReader(t, cl, "/f", 256<<10, 31)
	readAll("first")
	readAll("second")
	if s := cl.Stats(); s.Optimistic == 0 {
		t.Fatal("no read went optimistically")
	}
	// Two nodes die, one the client holds references to among them.
	refs := sdk.RefNodes(cl)
	var dead []int
	for i, n := range c.Nodes {
		if refs[n.ID()] > 0 {
			dead = append(dead, i)
			break
		}
	}
	if len(dead) == 0 {
		t.Fatalf("no references held: %v", refs)
	}
	dead = append(dead, (dead[0]+1)%len(c.Nodes))
	before := cl.Stats()
	for _, i := range dead {
		c.Nodes[i].Close()
	}
	readAll("with two of three nodes dead")
	after := cl.Stats()
	t.Logf("after the deaths: %d optimistic, %d fell back", after.Optimistic-before.Optimistic, after.OptimisticFallbacks-before.OptimisticFallbacks)
	if after.OptimisticFallbacks == before.OptimisticFallbacks {
		t.Fatal("no reference pointed at a dead node: the test did not exercise the fallback")
	}
}

// TestForgedReferences: references altered in the client (a region key
// no node has, a slot past the arena, a generation never given, another
// block's slot) are refused — by the node softly, or by the checks —
// and every read falls back to a request and returns the file's bytes;
// the connection to the node survives the refusals. (A fallback's reply
// brings fresh references for its whole store block, 16 KiB, four
// export blocks: one fallback per store block.)
func TestForgedReferences(t *testing.T) {
	c := startClusterWith(t, cluster.Options{Nodes: 1, ExportCache: 4 << 20, ExportBlock: 4096})
	cl := newClient(t, c, sdk.Options{ODAFS: &odafs.Options{CacheBytes: -1}})
	readAll := blockReader(t, cl, "/f", 128<<10, 17)
	readAll("first")
	n := sdk.ForgeRefs(cl, func(_ int, r *odafs.Ref) {
		switch (r.Block / 4) % 4 { // one kind per store block
		case 0:
			r.Region ^= 0x5555 // a key the node never gave
		case 1:
			r.Slot = 1 << 30 // past the arena
		case 2:
			r.Gen += 2 // a generation this fill never had
		case 3:
			r.Slot ^= 1 // another block's slot
		}
	})
	if n == 0 {
		t.Fatal("no references to forge")
	}
	before := cl.Stats()
	readAll("forged")
	after := cl.Stats()
	if fb := after.OptimisticFallbacks - before.OptimisticFallbacks; fb != uint64(n)/4 {
		t.Fatalf("%d fallbacks for %d forged references in %d store blocks", fb, n, n/4)
	}
	readAll("relearnt") // fresh references from the fallbacks' replies
	if s := cl.Stats(); s.Optimistic == after.Optimistic {
		t.Fatal("no optimistic read after the references were learnt again")
	}
}

// blockReader puts n bytes (seed's pattern) at path and returns a
// function that reads the file back in 4 KiB ReadAt calls, checking each.
func blockReader(t *testing.T, cl *sdk.Client, path string, n, seed int) func(what string) {
	t.Helper()
	ctx := context.Background()
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*seed + i/4096)
	}
	if _, err := cl.Put(ctx, path, bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	return func(what string) {
		t.Helper()
		for off := int64(0); off < int64(len(data)); off += 4096 {
			if _, err := f.ReadAt(buf, off); err != nil {
				t.Fatalf("%s: read at %d: %v", what, off, err)
			}
			if !bytes.Equal(buf, data[off:off+4096]) {
				t.Fatalf("%s: read at %d: wrong bytes", what, off)
			}
		}
	}
}

// TestODAFSReadsByRequestReturnBuffers: reads that a client with ODAFS
// settings sends by request (no reference, DAFS mode) give their pooled
// buffer back (each kept its 4 MiB buffer, registered, until the client
// closed — the slowdown of request reads in the PostMark run).
func TestODAFSReadsByRequestReturnBuffers(t *testing.T) {
	c := startClusterWith(t, cluster.Options{Nodes: 1, ExportCache: 4 << 20, ExportBlock: 4096})
	ctx := context.Background()
	cl := newClient(t, c, sdk.Options{ODAFS: &odafs.Options{Entries: -1, CacheBytes: -1}})
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(make([]byte, 1<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range 40 {
		if _, err := f.ReadAt(buf, int64(i)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if n := sdk.Regions(cl); n > 4 {
		t.Fatalf("after 40 reads by request the client has %d regions registered", n)
	}
}
