package inventory

import (
	"slices"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestJudge(t *testing.T) {
	const next = 100
	for _, c := range []struct {
		id   ids.ChunkID
		r    Record
		want Verdict
	}{
		{5, Record{Exists: true, Member: true}, Keep},
		{5, Record{Exists: true, Covered: true}, NotMember},
		// Not every member holds it: perhaps the only copy, kept.
		{5, Record{Exists: true}, Displaced},
		{5, Record{Exists: true, Member: true, Covered: true}, Keep},
		{5, Record{Exists: true, Queued: true, Covered: true}, Queued},
		{5, Record{}, Unknown},
		{5, Record{Queued: true}, Queued},
		{5, Record{Exists: true, Queued: true}, Queued},
		{99, Record{}, Unknown},
		// Ids meta never gave out are never judged stray to collect,
		// whatever else is said of them.
		{100, Record{}, Ahead},
		{100, Record{Exists: true, Member: true}, Ahead},
		{1 << 60, Record{Queued: true}, Ahead},
	} {
		if got := Judge(c.id, next, c.r); got != c.want {
			t.Errorf("Judge(%d, next %d, %+v) = %v, want %v", c.id, next, c.r, got, c.want)
		}
		if v := Judge(c.id, next, c.r); v.collectable() != (v == Unknown || v == NotMember) || v == Displaced && v.collectable() {
			t.Errorf("%v collectable: %v", v, v.collectable())
		}
	}
}

func held(idl ...ids.ChunkID) []metaapi.HeldChunk {
	out := make([]metaapi.HeldChunk, len(idl))
	for i, id := range idl {
		out[i] = metaapi.HeldChunk{Chunk: id, Version: uint64(id), Length: int64(id) * 10}
	}
	return out
}

const sec = int64(time.Second)

// TestTrackerGrace: a stray is collected only once found stray for the
// whole grace period, and only if it is unknown or not a member; queued
// copies and ids ahead of meta's counter never are.
func TestTrackerGrace(t *testing.T) {
	tr := Tracker{Grace: 10 * time.Second}
	copies := held(5, 6, 7, 8, 9)
	verdicts := []Verdict{Unknown, Keep, NotMember, Ahead, Queued}
	round := func(now int64) []ids.ChunkID { return tr.Page(1, 0, copies, verdicts, true, now) }
	if got := round(100 * sec); len(got) != 0 {
		t.Fatalf("first sighting collects %v", got)
	}
	if got := round(110*sec - 1); len(got) != 0 {
		t.Fatalf("a nanosecond before the grace ends: collects %v", got)
	}
	if got := round(110 * sec); !slices.Equal(got, []ids.ChunkID{5, 7}) {
		t.Fatalf("at the end of the grace: collects %v, want [5 7]", got)
	}
	if got := round(500 * sec); !slices.Equal(got, []ids.ChunkID{5, 7}) {
		t.Fatalf("later, still held: collects %v, want [5 7] again", got)
	}
	// Another node's strays have their own clock.
	if got := tr.Page(2, 0, copies, verdicts, true, 500*sec); len(got) != 0 {
		t.Fatalf("node 2's first sighting collects %v", got)
	}
}

// TestTrackerGraceFromCollectable: a copy found queued for deletion
// (never collected) that becomes collectable has its whole grace from
// then, not from when it was first seen queued.
func TestTrackerGraceFromCollectable(t *testing.T) {
	tr := Tracker{Grace: 10 * time.Second}
	copies := held(5)
	if got := tr.Page(1, 0, copies, []Verdict{Queued}, true, 100*sec); len(got) != 0 {
		t.Fatalf("a queued copy collected: %v", got)
	}
	if got := tr.Page(1, 0, copies, []Verdict{Unknown}, true, 200*sec); len(got) != 0 {
		t.Fatalf("collected as soon as it became unknown: %v", got)
	}
	if got := tr.Page(1, 0, copies, []Verdict{Unknown}, true, 210*sec); !slices.Equal(got, []ids.ChunkID{5}) {
		t.Fatalf("after its grace as unknown: %v", got)
	}
}

// TestTrackerForgets: a stray the node no longer lists, or that meta
// judges needed again, starts its grace over when found stray again.
func TestTrackerForgets(t *testing.T) {
	tr := Tracker{Grace: 10 * time.Second}
	tr.Page(1, 0, held(5, 7), []Verdict{Unknown, NotMember}, true, 0)
	// 5 is gone from the node; 7 a member again (a reconciliation placed
	// it back).
	tr.Page(1, 0, held(7), []Verdict{Keep}, true, 5*sec)
	got := tr.Page(1, 0, held(5, 7), []Verdict{Unknown, NotMember}, true, 12*sec)
	if len(got) != 0 {
		t.Fatalf("strays found again collected at once: %v", got)
	}
	if got := tr.Page(1, 0, held(5, 7), []Verdict{Unknown, NotMember}, true, 22*sec); !slices.Equal(got, []ids.ChunkID{5, 7}) {
		t.Fatalf("after a whole grace since found again: %v", got)
	}
	// A restarted meta (a new tracker) waits a whole grace again.
	tr2 := Tracker{Grace: 10 * time.Second}
	if got := tr2.Page(1, 0, held(5, 7), []Verdict{Unknown, NotMember}, true, 100*sec); len(got) != 0 {
		t.Fatalf("a new tracker collects at once: %v", got)
	}
}

// TestTrackerPages: a page forgets only strays in the range it covers.
func TestTrackerPages(t *testing.T) {
	tr := Tracker{Grace: 10 * time.Second}
	tr.Page(1, 0, held(3), []Verdict{Keep}, false, 0)
	tr.Page(1, 3, held(7, 9), []Verdict{Unknown, Unknown}, true, 0)
	// Next round, page one covers (0, 5]: 7 and 9 lie beyond it.
	if got := tr.Page(1, 0, held(3, 5), []Verdict{Keep, Keep}, false, 20*sec); len(got) != 0 {
		t.Fatalf("page (0,5]: %v", got)
	}
	// An empty page that is not the last covers nothing.
	tr.Page(1, 5, nil, nil, false, 20*sec)
	// Page two covers (5, 8]: 9 stays.
	if got := tr.Page(1, 5, held(7), []Verdict{Unknown}, false, 20*sec); !slices.Equal(got, []ids.ChunkID{7}) {
		t.Fatalf("page (5,8]: %v, want [7]", got)
	}
	// The last page covers everything above 8: 9 is not listed, so gone.
	tr.Page(1, 8, held(12), []Verdict{Unknown}, true, 20*sec)
	r := tr.Report(1, 10)
	var list []ids.ChunkID
	for _, s := range r.List {
		list = append(list, s.Chunk)
	}
	if !slices.Equal(list, []ids.ChunkID{7, 12}) || r.Held != 4 || r.Strays[metaapi.StrayUnknown] != 2 || r.Rounds != 2 {
		t.Fatalf("report: %+v", r)
	}
	if got := tr.Page(1, 0, held(9), []Verdict{Unknown}, true, 25*sec); len(got) != 0 {
		t.Fatalf("9, forgotten, found again: %v", got)
	}
}

// TestTrackerLimit: strays past the limit are counted, not remembered
// (nor collected) until there is room.
func TestTrackerLimit(t *testing.T) {
	tr := Tracker{Grace: time.Second, Limit: 2}
	v := []Verdict{Unknown, Unknown, Unknown}
	tr.Page(1, 0, held(1, 2, 3), v, true, 0)
	r := tr.Report(1, 1)
	if r.Untracked != 1 || r.Strays[metaapi.StrayUnknown] != 2 || len(r.List) != 1 || r.List[0].Chunk != 1 || r.List[0].Version != 1 || r.List[0].Length != 10 {
		t.Fatalf("report: %+v", r)
	}
	got := tr.Page(1, 0, held(1, 2, 3), v, true, 2*sec)
	if !slices.Equal(got, []ids.ChunkID{1, 2}) {
		t.Fatalf("collects %v, want [1 2]", got)
	}
	// 1 and 2 collected: 3 is remembered from now on.
	tr.Page(1, 0, held(3), v[:1], true, 3*sec)
	if got := tr.Page(1, 0, held(3), v[:1], true, 4*sec); !slices.Equal(got, []ids.ChunkID{3}) {
		t.Fatalf("collects %v, want [3]", got)
	}
	if r := tr.Report(1, 10); r.Collected != 3 || r.Untracked != 0 {
		t.Fatalf("report: %+v", r)
	}
	if r := tr.Report(9, 10); r.Rounds != 0 || r.RoundDone != 0 || len(r.List) != 0 {
		t.Fatalf("report of a node never heard: %+v", r)
	}
}

// TestCoveredDisplaced: a copy of a file's chunk on a node its record does
// not name is kept (Displaced, never collected) until every recorded
// member has listed an intact copy at least as new in a round seen since
// the copy was found; then it is NotMember and collected after the
// grace. A member that stops listing it, or lists it with bad blocks,
// uncovers it again.
func TestCoveredDisplaced(t *testing.T) {
	tr := Tracker{Grace: 10 * time.Second}
	members := []ids.NodeID{1, 2}
	copyOn3 := []metaapi.HeldChunk{{Chunk: 7, Version: 4, Length: 70}}
	// Node 3 holds chunk 7, which the record places on 1 and 2: judged
	// as meta does, from what the members listed.
	judge3 := func(now int64) ([]ids.ChunkID, Verdict) {
		v := Judge(7, 100, Record{Exists: true, Covered: tr.Covered(7, members, 4)})
		return tr.Page(3, 0, copyOn3, []Verdict{v}, true, now), v
	}
	member := func(n ids.NodeID, h []metaapi.HeldChunk, now int64) {
		vs := make([]Verdict, len(h))
		tr.Page(n, 0, h, vs, true, now)
	}
	if tr.Covered(7, members, 4) {
		t.Fatal("covered before any round")
	}
	// Before node 3's copy is found, the members' rounds are not watched.
	member(1, []metaapi.HeldChunk{{Chunk: 7, Version: 4}}, 0)
	if got, v := judge3(1 * sec); v != Displaced || len(got) != 0 {
		t.Fatalf("first sighting: %v, collects %v", v, got)
	}
	if f := tr.Displaced(7); !slices.Equal(f, []Found{{Node: 3, Version: 4, Length: 70}}) {
		t.Fatalf("Displaced(7) = %v", f)
	}
	// Only one member listed it since: still kept, however long.
	member(1, []metaapi.HeldChunk{{Chunk: 7, Version: 4}}, 2*sec)
	if got, v := judge3(100 * sec); v != Displaced || len(got) != 0 {
		t.Fatalf("one member of two seen: %v, collects %v", v, got)
	}
	// Member 2 lists an older version, then a copy with a bad block:
	// neither covers it.
	member(2, []metaapi.HeldChunk{{Chunk: 7, Version: 3}}, 101*sec)
	if _, v := judge3(102 * sec); v != Displaced {
		t.Fatalf("a member behind: %v", v)
	}
	member(2, []metaapi.HeldChunk{{Chunk: 7, Version: 4, BadUnlisted: true}}, 103*sec)
	if _, v := judge3(104 * sec); v != Displaced {
		t.Fatalf("a member's copy corrupt: %v", v)
	}
	// Both hold it whole: not a member, collected a grace later.
	member(2, []metaapi.HeldChunk{{Chunk: 6}, {Chunk: 7, Version: 5}}, 105*sec)
	if got, v := judge3(106 * sec); v != NotMember || len(got) != 0 {
		t.Fatalf("covered: %v, collects %v", v, got)
	}
	if f := tr.Displaced(7); len(f) != 0 {
		t.Fatalf("a covered copy listed as displaced: %v", f)
	}
	// Member 1's next round no longer lists it: uncovered, the grace
	// starts again once it is covered again.
	member(1, held(5), 110*sec)
	if got, v := judge3(120 * sec); v != Displaced || len(got) != 0 {
		t.Fatalf("a member lost its copy: %v, collects %v", v, got)
	}
	member(1, []metaapi.HeldChunk{{Chunk: 7, Version: 4}}, 121*sec)
	if got, _ := judge3(122 * sec); len(got) != 0 {
		t.Fatalf("covered again: collects %v at once", got)
	}
	if got, _ := judge3(132 * sec); !slices.Equal(got, []ids.ChunkID{7}) {
		t.Fatalf("covered for the grace: collects %v, want [7]", got)
	}
	// Once node 3 no longer lists it, nothing is watched.
	tr.Page(3, 0, nil, nil, true, 133*sec)
	if len(tr.watch) != 0 || tr.Covered(7, members, 4) {
		t.Fatalf("chunk 7 still watched after its copy went: %v", tr.watch)
	}
}
