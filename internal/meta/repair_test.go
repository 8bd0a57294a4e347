package meta

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/repairplan"
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
	f.setPolicy("/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}})
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

// fakeRepairer answers fences with what the test says the members hold
// and records the drops it is asked for.
type fakeRepairer struct {
	members []repairplan.Member
	dropped []int
	at      []uint64
}

func (r *fakeRepairer) FenceMembers(_ context.Context, l *metaapi.ChunkLayout, _ uint64) ([]repairplan.Member, []error) {
	return slices.Clone(r.members), make([]error, len(l.Replicas))
}

func (r *fakeRepairer) CopyReplica(context.Context, *metaapi.ChunkLayout, int, []int, uint64, int64, bool) error {
	return errors.New("fakeRepairer copies nothing")
}

func (r *fakeRepairer) RebuildUnits(context.Context, *metaapi.ChunkLayout, []int, []int, uint64, int64, bool, bool) error {
	return errors.New("fakeRepairer rebuilds nothing")
}

func (r *fakeRepairer) DropMembers(_ context.Context, _ *metaapi.ChunkLayout, members []int, versions []uint64) error {
	r.dropped, r.at = append(r.dropped, members...), append(r.at, versions...)
	return nil
}

// TestReconcileFirstWriteFailed: an RS(2,2) group whose first write
// failed midway (issue 15, defect 4): the writer marked it degraded;
// unit 0 holds the doubt of version 1 and parity unit 3 committed it
// alone. Until it is reconciled the scan does not count it at full
// redundancy and queues it; the reconciliation drops what units 0 and
// 3 hold (version 0 is the group's: three units hold nothing) and
// clears the mark. Had meta recorded version 1, nothing would be
// dropped and the group would stay short and listed.
func TestReconcileFirstWriteFailed(t *testing.T) {
	for _, recorded := range []uint64{0, 1} {
		f := newFixture(t)
		f.addNodes(5)
		f.tree("/ec/")
		f.setPolicy("/ec", metaapi.Policy{EC: &metaapi.ErasureCode{Data: 2, Parity: 2, Cell: 4096}})
		f.tree("/ec/f")
		ino := f.ino("/ec/f")
		l := f.layout("/ec/f", 0, 1, true).Chunks[0]
		if err := f.s.MarkDegraded(metaapi.MarkDegradedReq{Ino: ino, Index: 0, Chunk: l.Chunk, Degraded: true, Who: root}); err != nil {
			t.Fatal(err)
		}
		if recorded > 0 {
			if _, err := f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 1, Chunks: []metaapi.ChunkVersion{{Chunk: l.Chunk, Version: recorded, End: 1}}, Who: root}); err != nil {
				t.Fatal(err)
			}
		}
		short := func(when string) {
			t.Helper()
			f.s.scanForRepair()
			tally, _ := f.s.repairStatus()
			if tally.Striped.Full != 0 || tally.Striped.Short() != 1 {
				t.Fatalf("recorded %d, %s: tallies %+v, want the group short of full redundancy", recorded, when, tally.Striped)
			}
			if d, err := f.s.ListDegraded(); err != nil || len(d.Groups) != 1 {
				t.Fatalf("recorded %d, %s: degraded groups %+v %v, want the group", recorded, when, d, err)
			}
		}
		short("before the reconciliation")
		j := f.s.repairs.next(f.clk.Now())
		if j == nil || j.ref != (chunkRef{ino, 0}) {
			t.Fatalf("the scan did not queue the degraded group: %+v", j)
		}
		doubt := repairplan.Member{Answered: true, Doubt: true}
		r := &fakeRepairer{members: []repairplan.Member{doubt, {Answered: true}, {Answered: true}, {Answered: true, Version: 1, Length: 4096}}}
		done, _, err := f.s.reconcile(context.Background(), r, j)
		f.s.finishJob(j, done, 0, err)
		if recorded > 0 {
			if done || err == nil || len(r.dropped) > 0 {
				t.Fatalf("below the recorded version: done %v, err %v, dropped %v", done, err, r.dropped)
			}
			short("after a reconciliation that must wait")
			continue
		}
		if !done || err != nil || !slices.Equal(r.dropped, []int{0, 3}) || !slices.Equal(r.at, []uint64{0, 1}) {
			t.Fatalf("done %v, err %v, dropped %v at %v; want units 0 and 3 dropped at versions 0 and 1", done, err, r.dropped, r.at)
		}
		f.s.scanForRepair()
		if tally, _ := f.s.repairStatus(); tally.Striped.Full != 1 {
			t.Fatalf("after the reconciliation: %+v", tally.Striped)
		}
		if d, _ := f.s.ListDegraded(); len(d.Groups) != 0 {
			t.Fatalf("still listed degraded: %+v", d)
		}
		if l := f.layout("/ec/f", 0, 1, true).Chunks[0]; l.Version != 0 {
			t.Fatalf("recorded version %d", l.Version)
		}
	}
}

// TestNodeBackRetriesStuckRepairs: a chunk no live node could take a
// member of is stuck (its writers get EIO) only until a node starts or
// comes back: then it is due at once and its writers wait again. An
// attempt that began before the node came up and fails is not stuck
// either: it is retried at once (issue 15: the file must be writable
// once its nodes are back).
func TestNodeBackRetriesStuckRepairs(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(3)
	q := f.s.repairs
	ref := chunkRef{9, 0}
	q.add(ref, 0, true)
	now := f.clk.Now()
	noSpace := metaapi.Errorf(metaapi.ENOSPC, "no live node can take its place")
	j := q.next(now)
	f.s.finishJob(j, false, 0, noSpace)
	if q.stuckErr(ref) == nil || q.next(now) != nil {
		t.Fatal("an unplaceable chunk is not stuck and backing off")
	}
	f.addNodes(1) // a node starts
	if q.stuckErr(ref) != nil {
		t.Fatal("still stuck after a node started")
	}
	j = q.next(now)
	if j == nil {
		t.Fatal("not due at once after a node started")
	}
	// This attempt fails, but a node came back while it ran.
	f.addNodes(1)
	f.s.finishJob(j, false, 0, noSpace)
	if q.stuckErr(ref) != nil {
		t.Fatal("an attempt that began before a node came up marked the chunk stuck")
	}
	j = q.next(now)
	if j == nil {
		t.Fatal("an attempt that began before a node came up is not retried at once")
	}
	// Stuck again; then a node that was down heartbeats again.
	f.s.finishJob(j, false, 0, noSpace)
	f.clk.Advance(time.Minute)
	f.s.Sweep()
	if q.stuckErr(ref) == nil {
		t.Fatal("not stuck again")
	}
	f.heartbeat(nodes[0])
	if q.stuckErr(ref) != nil || q.next(f.clk.Now()) == nil {
		t.Fatal("still stuck, or not due, after a node came back up")
	}
}
