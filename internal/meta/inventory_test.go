package meta

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestGoneOutlivesCapabilities: a deleted chunk is handed to its nodes
// as gone, with a tombstone end past the expiry of every capability
// minted before the deletion; a copy moved elsewhere is a plain delete.
func TestGoneOutlivesCapabilities(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
	n := f.addNodes(1)[0]
	f.tree("/a")
	l := f.layout("/a", 0, 1, true).Chunks[0]
	var c capability.Capability
	if _, err := f.s.keys.Open(l.Cap, f.clk.Now().UnixNano(), &c); err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(3 * time.Minute)
	wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "a", Who: root}), "")
	hb := f.heartbeat(n)
	if len(hb.Gone) != 1 || hb.Gone[0].Chunk != l.Chunk || len(hb.Delete) != 0 {
		t.Fatalf("heartbeat after the remove: %+v", hb)
	}
	want := f.clk.Now().Add(10*time.Minute + tombstoneSlack).UnixNano()
	if until := hb.Gone[0].Until; until != want || until < c.Expiry {
		t.Fatalf("tombstone until %d, want %d (capability expiry %d)", until, want, c.Expiry)
	}
	// Acknowledged, it is not handed out again.
	if hb := f.heartbeat(n, l.Chunk); len(hb.Gone) != 0 {
		t.Fatalf("after the acknowledgement: %+v", hb.Gone)
	}
	if hb := f.heartbeat(n); len(hb.Gone) != 0 {
		t.Fatalf("after the acknowledgement: %+v", hb.Gone)
	}
}

func inventoryPage(after ids.ChunkID, done bool, chunks ...ids.ChunkID) metaapi.InventoryReq {
	req := metaapi.InventoryReq{After: after, Done: done}
	for _, c := range chunks {
		req.Chunks = append(req.Chunks, metaapi.HeldChunk{Chunk: c, Version: 1, Length: 100})
	}
	return req
}

// TestInventory: meta judges a node's copies against its records — a
// member's copy is kept; a copy of a live chunk on a node not a member,
// or of a chunk no file has, is collected once found stray for the
// grace period; a copy queued for deletion is left to the heartbeat; an
// id meta never gave out is never collected.
func TestInventory(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1; o.OrphanGrace = time.Minute })
	nodes := f.addNodes(2)
	f.tree("/a", "/b", "/c")
	var on [2][]ids.ChunkID // chunks by node
	chunkOf := map[string]metaapi.ChunkLayout{}
	for _, p := range []string{"/a", "/b", "/c"} {
		l := f.layout(p, 0, 1, true).Chunks[0]
		chunkOf[p] = l
		i := slices.Index(nodes, l.Replicas[0].Node)
		on[i] = append(on[i], l.Chunk)
	}
	if len(on[0]) == 0 || len(on[1]) == 0 {
		t.Skipf("placement put every chunk on one node: %v", on)
	}
	member, other := on[0][0], on[1][0] // a chunk on node 0, one on node 1
	// /c removed: queued for deletion on its node, then acknowledged.
	cc := chunkOf["/c"]
	cnode := cc.Replicas[0].Node
	wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "c", Who: root}), "")
	ahead := ids.ChunkID(1000)

	ask := func(node ids.NodeID, chunks ...ids.ChunkID) metaapi.InventoryResp {
		t.Helper()
		slices.Sort(chunks)
		req := inventoryPage(0, true, chunks...)
		req.Node = node
		r, err := f.s.Inventory(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Node 0 holds its own chunk, node 1's (planted) and /c's, plus an
	// id from the future.
	held := []ids.ChunkID{member, other, cc.Chunk, ahead}
	// Node 1's chunk is kept on node 0 until node 1 has been seen
	// holding it: until then node 0's may be its only copy.
	if r := ask(nodes[0], held...); len(r.Collect) != 0 || r.Epoch == 0 {
		t.Fatalf("first round: %+v", r)
	}
	if rep, _ := f.s.Strays(metaapi.StraysReq{Node: nodes[0]}); rep.Nodes[0].Strays[metaapi.StrayDisplaced] != 1 {
		t.Fatalf("before node 1's round: %+v, want one displaced copy", rep.Nodes[0])
	}
	ask(nodes[1], on[1]...)
	if r := ask(nodes[0], held...); len(r.Collect) != 0 || r.Epoch == 0 {
		t.Fatalf("second round: %+v", r)
	}
	f.clk.Advance(time.Minute - time.Nanosecond)
	if r := ask(nodes[0], held...); len(r.Collect) != 0 {
		t.Fatalf("before the grace ends: %+v", r)
	}
	f.clk.Advance(time.Nanosecond)
	want := []ids.ChunkID{other}
	if cnode != nodes[0] {
		want = append(want, cc.Chunk) // not queued on node 0: unknown there
	}
	slices.Sort(want)
	if r := ask(nodes[0], held...); !slices.Equal(r.Collect, want) {
		t.Fatalf("after the grace: collect %v, want %v", r.Collect, want)
	}
	rep, err := f.s.Strays(metaapi.StraysReq{Node: nodes[0]})
	if err != nil || len(rep.Nodes) != 1 {
		t.Fatal(rep, err)
	}
	r0 := rep.Nodes[0]
	counts := map[metaapi.StrayKind]int64{metaapi.StrayAhead: 1, metaapi.StrayNotMember: 1, metaapi.StrayUnknown: 1}
	if cnode == nodes[0] {
		counts = map[metaapi.StrayKind]int64{metaapi.StrayAhead: 1, metaapi.StrayNotMember: 1, metaapi.StrayQueued: 1}
	}
	if r0.Held != 4 || r0.Rounds != 4 || r0.Collected != int64(len(want)) || !maps.Equal(r0.Strays, counts) ||
		len(r0.List) != 3 || rep.Grace != int64(time.Minute) {
		t.Fatalf("report: %+v, want strays %v", r0, counts)
	}
	// A round that no longer lists them forgets them.
	if r := ask(nodes[0], member); len(r.Collect) != 0 {
		t.Fatal(r)
	}
	if rep, _ := f.s.Strays(metaapi.StraysReq{Node: nodes[0]}); len(rep.Nodes[0].List) != 0 || rep.Nodes[0].Held != 1 {
		t.Fatalf("report after a round without strays: %+v", rep.Nodes[0])
	}

	// A node's pages are checked.
	bad := []metaapi.InventoryReq{
		{Node: nodes[0], After: 5, Chunks: []metaapi.HeldChunk{{Chunk: 5}}},
		{Node: nodes[0], Chunks: []metaapi.HeldChunk{{Chunk: 7}, {Chunk: 6}}},
		{Node: nodes[0], Chunks: []metaapi.HeldChunk{{Chunk: 7, Length: -1}}},
		{Node: nodes[0], Chunks: make([]metaapi.HeldChunk, metaapi.MaxInventoryPage+1)},
	}
	for _, req := range bad {
		_, err := f.s.Inventory(req)
		wantCode(t, err, metaapi.EINVAL)
	}
	_, err = f.s.Inventory(metaapi.InventoryReq{Node: 99})
	wantCode(t, err, metaapi.ENOENT)
}

// TestInventoryRefresh: root can ask every node for a round now; each
// is told once, with its next heartbeat.
func TestInventoryRefresh(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(2)
	_, err := f.s.Strays(metaapi.StraysReq{Refresh: true, Who: alice})
	wantCode(t, err, metaapi.EPERM)
	if f.heartbeat(nodes[0]).Inventory {
		t.Fatal("asked for a round unasked")
	}
	rep, err := f.s.Strays(metaapi.StraysReq{Refresh: true, Who: root})
	if err != nil || len(rep.Nodes) != 2 || rep.Nodes[0].RoundDone != 0 {
		t.Fatal(rep, err)
	}
	for _, n := range nodes {
		if !f.heartbeat(n).Inventory {
			t.Fatalf("node %v not asked", n)
		}
		if f.heartbeat(n).Inventory {
			t.Fatalf("node %v asked twice", n)
		}
	}
	_, err = f.s.Strays(metaapi.StraysReq{Node: 99})
	wantCode(t, err, metaapi.ENOENT)
}

// TestChunkIDIndexMigration: a database from before the chunk id index
// gets it at open.
func TestChunkIDIndexMigration(t *testing.T) {
	f := newFixture(t, onDisk, func(o *Options) { o.DefaultReplicas = 1 })
	f.addNodes(1)
	f.tree("/a", "/b")
	f.layout("/a", 0, 3*testChunkSize, true)
	f.layout("/b", 0, 1, true)
	// Make it a schema 1 database.
	b := f.s.db.NewBatch()
	if err := b.DeleteRange([]byte{pChunkID}, []byte{pChunkID + 1}, nil); err != nil {
		t.Fatal(err)
	}
	b.Set(keySchema, []byte("1"), nil)
	if err := b.Commit(pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Check(); err == nil {
		t.Fatal("Check finds nothing wrong with the index removed")
	}
	f.reopen()
	if err := f.s.Check(); err != nil {
		t.Fatalf("after the migration: %v", err)
	}
	raw, _, err := getRaw(f.s.db, keySchema)
	if err != nil || string(raw) != schemaVersion {
		t.Fatalf("schema %q %v", raw, err)
	}
}
