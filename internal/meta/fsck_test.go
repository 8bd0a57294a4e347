package meta

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
)

func TestJudgeCopies(t *testing.T) {
	at := func(v uint64, bad ...extent.Extent) copySeen {
		return copySeen{reached: true, held: true, version: v, bad: bad}
	}
	missing := copySeen{reached: true}
	unreached := copySeen{}
	for _, c := range []struct {
		name      string
		seen      []copySeen
		ec        bool
		intact    int
		unreached int
		where     string
		differ    bool
	}{
		{"whole", []copySeen{at(3), at(3), at(3)}, false, 3, 0, "", false},
		{"a copy ahead (a write under way)", []copySeen{at(3), at(4), at(3)}, false, 3, 0, "", false},
		{"a copy behind", []copySeen{at(3), at(2), at(3)}, false, 2, 0, "", false},
		{"a copy missing", []copySeen{at(3), missing, at(3)}, false, 2, 0, "", false},
		{"bad blocks in different places", []copySeen{at(3, extent.Extent{Off: 0, Len: 10}), at(3, extent.Extent{Off: 20, Len: 10}), at(3)}, false, 2, 0, " at bytes [0, 10)", false},
		{"the same block bad twice", []copySeen{at(3, extent.Extent{Off: 0, Len: 10}), at(3, extent.Extent{Off: 5, Len: 10}), at(3)}, false, 1, 0, " at bytes [5, 10)", false},
		{"a node not reached", []copySeen{at(3), unreached, at(3)}, false, 2, 1, "", false},
		{"units agree", []copySeen{at(7), at(7), at(7), at(7), at(7)}, true, 5, 0, "", false},
		{"a unit behind", []copySeen{at(7), at(7), at(6), at(7), at(8)}, true, 4, 0, "", true},
		{"a unit ahead (a write under way)", []copySeen{at(7), at(7), at(7), at(7), at(8)}, true, 5, 0, "", false},
	} {
		j := judgeCopies(c.seen, 3+map[bool]uint64{true: 4}[c.ec], c.ec)
		if j.intact != c.intact || j.unreached != c.unreached || j.where != c.where || j.behind != c.differ {
			t.Errorf("%s: %+v, want intact %d unreached %d where %q differ %v", c.name, j, c.intact, c.unreached, c.where, c.differ)
		}
	}
}

// runCheckOn starts a check and feeds every node's round as given, then
// waits for the report.
func runCheckOn(t *testing.T, f *fixture, verify, repair bool, held map[ids.NodeID][]metaapi.HeldChunk) metaapi.CheckResp {
	t.Helper()
	st, err := f.s.CheckState(metaapi.CheckReq{Start: true, Verify: verify, Repair: repair, Who: root})
	if err != nil {
		t.Fatal(err)
	}
	for n, hs := range held {
		r, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: n, Capacity: 1 << 40, Free: 1 << 40})
		if err != nil || !r.Inventory || r.Verify != verify {
			t.Fatalf("node %v was not asked for a round (verify %v): %+v %v", n, verify, r, err)
		}
		if _, err := f.s.Inventory(metaapi.InventoryReq{Node: n, Chunks: hs, Done: true, Verified: verify}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err = f.s.CheckState(metaapi.CheckReq{Who: root})
		if err != nil {
			t.Fatal(err)
		}
		if st.Done != 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the check did not finish: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCheckSession: a check judges what the nodes list: a copy missing on
// one node and a bad block on another make the chunk below its policy; a
// copy no file needs is reported; an unverified round does not count for
// a verifying check; --repair reports the damaged copies for healing.
func TestCheckSession(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(3)
	f.setPolicy("/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}})
	f.tree("/a", "/b")
	la := f.layout("/a", 0, 1, true).Chunks[0]
	lb := f.layout("/b", 0, 1, true).Chunks[0]
	for _, c := range []struct {
		path string
		l    metaapi.ChunkLayout
	}{{"/a", la}, {"/b", lb}} {
		if _, err := f.s.Commit(metaapi.CommitReq{Ino: f.ino(c.path), Size: 100, Chunks: []metaapi.ChunkVersion{{Index: 0, Chunk: c.l.Chunk, Version: 1}}, Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	whole := func(l metaapi.ChunkLayout) metaapi.HeldChunk {
		return metaapi.HeldChunk{Chunk: l.Chunk, Version: 1, Length: 100}
	}
	held := map[ids.NodeID][]metaapi.HeldChunk{}
	for _, n := range nodes {
		held[n] = []metaapi.HeldChunk{whole(la), whole(lb)}
	}
	if st := runCheckOn(t, f, false, false, held); len(st.Problems) != 0 || st.Chunks != 2 {
		t.Fatalf("a consistent cluster: %+v", st)
	}
	// Chunk a: missing on its first member, a bad block on its second.
	first, second := la.Replicas[0].Node, la.Replicas[1].Node
	held[first] = []metaapi.HeldChunk{whole(lb), {Chunk: 999, Length: 5}}
	bad := whole(la)
	bad.Bad = extent.List{{Off: 0, Len: 16}}
	held[second] = []metaapi.HeldChunk{bad, whole(lb)}
	st := runCheckOn(t, f, false, true, held)
	below := problemOf(st, metaapi.CheckBelowPolicy)
	if below.Count != 1 || !strings.HasPrefix(below.Examples[0], "/a chunk 0 ") || !strings.Contains(below.Examples[0], "1 of 3 copies intact at bytes [0, 16)") ||
		!strings.Contains(below.Examples[0], first.String()+" holds no copy") || below.Repaired != 0 {
		// (no repair worker in this fixture: nothing is queued)
		t.Fatalf("below policy: %+v", st.Problems)
	}
	if u := problemOf(st, metaapi.CheckUnknownCopy); u.Count != 1 || !strings.Contains(u.Examples[0], ids.ChunkID(999).String()+" on "+first.String()) ||
		!strings.Contains(u.Examples[0], "ahead") {
		t.Fatalf("unknown copy: %+v", st.Problems)
	}
	// A chunk whose repair keeps failing (left reconciling) is reported
	// all the same.
	if _, skip, err := f.s.beginReconcile(&repairJob{ref: chunkRef{f.ino("/a"), 0}, failover: true}); err != nil || skip {
		t.Fatalf("begin: skip %v, %v", skip, err)
	}
	st = runCheckOn(t, f, false, false, held)
	if below := problemOf(st, metaapi.CheckBelowPolicy); below.Count != 1 || !strings.Contains(below.Examples[0], "meta is repairing it") {
		t.Fatalf("a chunk being repaired: %+v", st.Problems)
	}
	// A verifying check ignores an unverified round.
	if _, err := f.s.CheckState(metaapi.CheckReq{Start: true, Verify: true, Who: root}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Inventory(metaapi.InventoryReq{Node: nodes[0], Chunks: held[nodes[0]], Done: true}); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.s.CheckState(metaapi.CheckReq{Who: root}); st.Nodes[0].Done {
		t.Fatalf("an unverified round counted for a verifying check: %+v", st.Nodes)
	}
	if _, err := f.s.CheckState(metaapi.CheckReq{Start: true, Who: metaapi.Who{UID: 1000}}); !metaapi.IsCode(err, metaapi.EPERM) {
		t.Fatalf("a check started by uid 1000: %v", err)
	}
}

func problemOf(st metaapi.CheckResp, kind metaapi.CheckKind) metaapi.CheckProblem {
	for _, p := range st.Problems {
		if p.Kind == kind {
			return p
		}
	}
	return metaapi.CheckProblem{}
}

// commitAll places and commits every chunk of a file of n chunks at
// version 1, returning their layouts.
func commitAll(t *testing.T, f *fixture, path string, n int64) []metaapi.ChunkLayout {
	t.Helper()
	var ls []metaapi.ChunkLayout
	for off := int64(0); off < n; off += metaapi.MaxLayoutChunks {
		r := f.layout(path, off*testChunkSize, min(metaapi.MaxLayoutChunks, n-off)*testChunkSize, true)
		ls = append(ls, r.Chunks...)
	}
	for i := 0; i < len(ls); i += 256 {
		var cv []metaapi.ChunkVersion
		for _, l := range ls[i:min(i+256, len(ls))] {
			cv = append(cv, metaapi.ChunkVersion{Index: l.Index, Chunk: l.Chunk, Version: 1})
		}
		if _, err := f.s.Commit(metaapi.CommitReq{Ino: f.ino(path), Size: n * testChunkSize, Chunks: cv, Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	return ls
}

// TestCheckQuietAboutTraffic: a chunk never written (a write under way)
// and a file removed during the check raise nothing; a node that lost
// every copy of a big file has them all reported and, with --repair, all
// recorded for restoring (more than the scan's report buffer holds).
func TestCheckQuietAboutTraffic(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(3)
	f.setPolicy("/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}})
	f.tree("/big", "/unwritten", "/gone")
	big := commitAll(t, f, "/big", 1100)
	f.layout("/unwritten", 0, 1, true) // allocated, never committed
	gone := commitAll(t, f, "/gone", 1)[0]
	held := map[ids.NodeID][]metaapi.HeldChunk{}
	for _, n := range nodes[1:] {
		for _, l := range big {
			held[n] = append(held[n], metaapi.HeldChunk{Chunk: l.Chunk, Version: 1, Length: testChunkSize})
		}
	}
	for _, n := range nodes { // the removed file's copies, listed before its removal reached the nodes
		held[n] = append(held[n], metaapi.HeldChunk{Chunk: gone.Chunk, Version: 1, Length: testChunkSize})
	}
	f.s.repairs.started.Store(true) // record what --repair restores (no worker runs here)
	st, err := f.s.CheckState(metaapi.CheckReq{Start: true, Repair: true, Who: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.rm("/", "gone", false); err != nil {
		t.Fatal(err)
	}
	for n, hs := range held {
		f.heartbeat(n, gone.Chunk) // deleted and acknowledged: no longer queued
		if _, err := f.s.Inventory(metaapi.InventoryReq{Node: n, Chunks: hs, Done: true}); err != nil {
			t.Fatal(err)
		}
	}
	for st.Done == 0 {
		time.Sleep(20 * time.Millisecond)
		if st, err = f.s.CheckState(metaapi.CheckReq{Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	if len(st.Problems) != 1 || st.Problems[0].Kind != metaapi.CheckBelowPolicy || st.Problems[0].Count != 1100 || st.Problems[0].Repaired != 1100 {
		t.Fatalf("problems: %+v", st.Problems)
	}
	recorded := 0
	if err := f.s.read(func(v view) error {
		return scan(v.r, []byte{pChunk}, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
			var rec chunkRec
			if err := json.Unmarshal(val, &rec); err != nil {
				return false, err
			}
			if len(rec.Corrupt) == 1 && rec.Corrupt[0] == nodes[0] {
				recorded++
			}
			return true, nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if recorded != 1100 {
		t.Fatalf("%d of 1100 chunks recorded with the lost copy for restoring", recorded)
	}
}
