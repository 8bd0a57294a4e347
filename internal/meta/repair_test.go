package meta

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestRepairQueueOrder: a writer waiting comes first, then the chunks
// with the fewest copies to spare; a job backing off or running is not
// handed out; a job queued again keeps its most urgent margin.
func TestRepairQueueOrder(t *testing.T) {
	q := newRepairQueue()
	now := time.Unix(1000, 0)
	q.add(chunkRef{1, 0}, 2, false)
	q.add(chunkRef{2, 0}, 0, false)
	q.add(chunkRef{3, 0}, 1, false)
	q.add(chunkRef{3, 0}, 3, false) // requeued: keeps margin 1
	q.add(chunkRef{4, 0}, 5, true)  // a writer waits for it
	var got []chunkRef
	for j := q.next(now); j != nil; j = q.next(now) {
		got = append(got, j.ref)
	}
	want := []chunkRef{{4, 0}, {2, 0}, {3, 0}, {1, 0}}
	if len(got) != len(want) {
		t.Fatalf("handed out %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("handed out %v, want %v", got, want)
		}
	}
	// All running now: nothing more. One finishes with a failure and
	// backs off; it is due again only later.
	s := &Service{opts: Options{Now: func() time.Time { return now }}, repairs: q}
	s.log = testLogger()
	j := q.jobs[chunkRef{2, 0}]
	s.finishJob(j, false, 0, metaapi.Errorf(metaapi.EIO, "node unreachable"))
	if j := q.next(now); j != nil {
		t.Fatalf("a job backing off was handed out: %+v", j.ref)
	}
	if j := q.next(now.Add(time.Second)); j == nil || j.ref != (chunkRef{2, 0}) {
		t.Fatalf("the job was not due again after its backoff: %v", j)
	}
	if q.stuckErr(chunkRef{2, 0}) != nil {
		t.Fatal("one failed attempt marked the chunk stuck")
	}
	// Failing again and again for another reason (no intact copy, a
	// member that does not answer) marks it stuck too, with the reason,
	// so its writers get EIO instead of waiting; it is still retried.
	for i := range stuckAfter - 1 {
		if i > 0 {
			if j := q.next(now.Add(time.Hour)); j == nil || j.ref != (chunkRef{2, 0}) {
				t.Fatalf("the failing job was not retried: %v", j)
			}
		}
		s.finishJob(q.jobs[chunkRef{2, 0}], false, 0, metaapi.Errorf(metaapi.EIO, "no intact copy"))
	}
	if err := q.stuckErr(chunkRef{2, 0}); err == nil || !strings.Contains(err.Error(), "no intact copy") {
		t.Fatalf("after %d failed attempts the chunk is not stuck with the reason: %v", stuckAfter, err)
	}
	q.jobs[chunkRef{2, 0}].running = true
	// A job that cannot be placed marks its chunk stuck until it succeeds.
	s.finishJob(q.jobs[chunkRef{2, 0}], false, 0, metaapi.Errorf(metaapi.ENOSPC, "no spare node"))
	if q.stuckErr(chunkRef{2, 0}) == nil {
		t.Fatal("an unplaceable chunk is not reported stuck")
	}
	q.jobs[chunkRef{2, 0}].running = true
	s.finishJob(q.jobs[chunkRef{2, 0}], true, 100, nil)
	if q.stuckErr(chunkRef{2, 0}) != nil || q.jobs[chunkRef{2, 0}] != nil {
		t.Fatal("a repaired chunk is still stuck or queued")
	}
	if _, st := s.repairStatus(); st.Done != 1 || st.Bytes != 100 || st.Pending != 3 || st.Running != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRepairScanPages: the scan reads the chunk records a page at a time
// and still counts every one.
func TestRepairScanPages(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/a", "/b")
	f.layout("/a", 0, 7*testChunkSize, true)
	f.layout("/b", 0, 3*testChunkSize, true)
	f.s.scanPage = 3
	f.s.scanForRepair()
	tally, _ := f.s.repairStatus()
	if got := tally.Replicated.Full; got != 10 {
		t.Fatalf("scan in pages of 3 counted %d full chunks of 10: %+v", got, tally)
	}
}

// TestScrubReportDuringReconcileSurvives: a corrupt copy reported while a
// reconciliation that did not know of it runs is still recorded when it
// ends (and the scan queues the chunk again); the copies it did know of
// are cleared.
func TestScrubReportDuringReconcileSurvives(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/a")
	l := f.layout("/a", 0, 1, true).Chunks[0]
	ref := chunkRef{f.ino("/a"), 0}
	rec := func() chunkRec {
		var r chunkRec
		if err := f.s.read(func(v view) error {
			_, err := getJSON(v.r, chunkKey(ref.ino, ref.index), &r)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	p, skip, err := f.s.beginReconcile(&repairJob{ref: ref, failover: true})
	if err != nil || skip {
		t.Fatalf("begin: skip %v, %v", skip, err)
	}
	late := l.Replicas[1].Node
	if err := f.s.markCorrupt(ref, l.Chunk, map[ids.NodeID]extent.List{late: {{Off: 0, Len: 4096}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.endReconcile(ref, l.Chunk, p.epoch, 1, nil); err != nil {
		t.Fatal(err)
	}
	if r := rec(); r.Reconciling || !slices.Contains(r.Corrupt, late) {
		t.Fatalf("after a reconciliation that did not know of it, the report is gone: %+v", r)
	}
	f.s.scanForRepair()
	if f.s.repairs.jobs[ref] == nil {
		t.Fatal("the scan did not queue the chunk with a corrupt copy")
	}
	// The next one knows of it and clears it.
	p, _, err = f.s.beginReconcile(&repairJob{ref: ref})
	if err != nil || !p.corrupt[1] {
		t.Fatalf("begin: %+v %v", p, err)
	}
	if err := f.s.endReconcile(ref, l.Chunk, p.epoch, 1, []ids.NodeID{late}); err != nil {
		t.Fatal(err)
	}
	if r := rec(); len(r.Corrupt) != 0 || len(r.Bad) != 0 {
		t.Fatalf("a restored copy is still recorded corrupt: %+v", r)
	}
}

// TestReconcileAsksDuringAttempt: what a waiting Reconcile call asks
// (members to rebuild, gather mode) while an attempt runs is done by the
// next attempt, not dropped when the running one ends; a failed attempt
// gives back what it took.
func TestReconcileAsksDuringAttempt(t *testing.T) {
	q := newRepairQueue()
	now := time.Unix(1000, 0)
	s := &Service{opts: Options{Now: func() time.Time { return now }}, repairs: q}
	s.log = testLogger()
	ref := chunkRef{7, 0}
	first, _ := q.wait(ref, 0, false, []int{1})
	j := q.next(now)
	if j == nil || !slices.Equal(j.taken.rebuild, []int{1}) {
		t.Fatalf("the first attempt took %+v", j)
	}
	second, _ := q.wait(ref, 0, true, []int{2}) // while it runs
	s.finishJob(j, true, 10, nil)
	if o := <-first; o.err != nil {
		t.Fatalf("the first waiter: %v", o.err)
	}
	j = q.next(now)
	if j == nil || !j.taken.gather || !slices.Equal(j.taken.rebuild, []int{2}) {
		t.Fatalf("the second attempt took %+v, want gather and member 2", j)
	}
	s.finishJob(j, false, 0, metaapi.Errorf(metaapi.EIO, "node unreachable"))
	if o := <-second; o.err == nil {
		t.Fatal("the second waiter got no error from a failed attempt")
	}
	if !j.asked.gather || !slices.Equal(j.asked.rebuild, []int{2}) {
		t.Fatalf("a failed attempt did not give back what it took: %+v", j.asked)
	}
}

// TestRetiredCopiesCarryTheirEpoch: a member a reconciliation replaced is
// queued for deletion with the epoch it was retired at, so that its node
// drops the copy only if nothing placed the chunk there again since.
func TestRetiredCopiesCarryTheirEpoch(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(4)
	f.setPolicy("/", metaapi.Policy{Replicas: 3, Strategy: metaapi.StrategyRing})
	f.tree("/a")
	l := f.layout("/a", 0, 1, true).Chunks[0]
	ref := chunkRef{f.ino("/a"), 0}
	gone := l.Replicas[2].Node
	// Every node but one heartbeats past the node timeout and the grace.
	for range 3 {
		f.clk.Advance(f.s.opts.NodeTimeout/2 + f.s.opts.RepairGrace/2)
		for _, n := range nodes {
			if n != gone {
				f.heartbeat(n)
			}
		}
		f.s.Sweep()
	}
	p, skip, err := f.s.beginReconcile(&repairJob{ref: ref})
	if err != nil || skip || !p.fresh[2] {
		t.Fatalf("begin: %+v skip %v %v", p, skip, err)
	}
	if err := f.s.endReconcile(ref, l.Chunk, p.epoch, 1, nil); err != nil {
		t.Fatal(err)
	}
	r, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: gone, Capacity: 1 << 40, Free: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Delete) != 1 || r.Delete[0] != (metaapi.RetiredCopy{Chunk: l.Chunk, Epoch: p.epoch}) {
		t.Fatalf("the replaced node is told %+v, want its copy retired at epoch %d", r.Delete, p.epoch)
	}
}
