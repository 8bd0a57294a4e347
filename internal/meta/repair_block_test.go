package meta

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestAggregateBlocks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	rs := func(up int, at int) datedBlock {
		return datedBlock{metaapi.RepairBlock{Kind: metaapi.BlockNoPlace, Policy: "RS(3,2)", EC: true, Need: 5, Up: up, Usable: up, Chunks: 1}, t0.Add(time.Duration(at) * time.Second)}
	}
	src := datedBlock{metaapi.RepairBlock{Kind: metaapi.BlockNoSource, Policy: "3 replicas", Need: 1, Chunks: 1}, t0}
	fail := func(reason string, at int) datedBlock {
		return datedBlock{metaapi.RepairBlock{Kind: metaapi.BlockFailing, Policy: "3 replicas", Reason: reason, Chunks: 1}, t0.Add(time.Duration(at) * time.Second)}
	}
	for _, tc := range []struct {
		name  string
		in    []datedBlock
		limit int
		want  []metaapi.RepairBlock
	}{
		{"none", nil, 8, []metaapi.RepairBlock{}},
		{"one kind adds up; the newest node counts win",
			[]datedBlock{rs(4, 1), rs(3, 3), rs(4, 2)}, 8,
			[]metaapi.RepairBlock{{Kind: metaapi.BlockNoPlace, Policy: "RS(3,2)", EC: true, Need: 5, Up: 3, Usable: 3, Chunks: 3}}},
		{"most common first; the newest failure's reason",
			[]datedBlock{src, rs(4, 1), fail("a", 5), rs(4, 1), fail("b", 9), fail("c", 2)}, 8,
			[]metaapi.RepairBlock{
				{Kind: metaapi.BlockFailing, Policy: "3 replicas", Reason: "b", Chunks: 3},
				{Kind: metaapi.BlockNoPlace, Policy: "RS(3,2)", EC: true, Need: 5, Up: 4, Usable: 4, Chunks: 2},
				{Kind: metaapi.BlockNoSource, Policy: "3 replicas", Need: 1, Chunks: 1},
			}},
		{"bounded",
			[]datedBlock{src, rs(4, 1), rs(4, 1), fail("a", 5)}, 1,
			[]metaapi.RepairBlock{{Kind: metaapi.BlockNoPlace, Policy: "RS(3,2)", EC: true, Need: 5, Up: 4, Usable: 4, Chunks: 2}}},
	} {
		if got := aggregateBlocks(tc.in, tc.limit); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\ngot  %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// TestStuckRepairSaysWhy: an RS(3,2) group with a member on a node down
// past the grace period, in a cluster of five nodes, cannot be made
// whole: status says so (5 nodes needed, 4 up) and gives no ETA; when the
// node returns, the reason is gone.
func TestStuckRepairSaysWhy(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(5)
	f.setPolicy("/", metaapi.Policy{EC: &metaapi.ErasureCode{Data: 3, Parity: 2, Cell: 4096}})
	f.tree("/a")
	l := f.layout("/a", 0, 1, true).Chunks[0]
	gone := l.Replicas[0].Node
	for range 3 {
		f.clk.Advance(f.s.opts.NodeTimeout/2 + f.s.opts.RepairGrace/2)
		for _, n := range nodes {
			if n != gone {
				f.heartbeat(n)
			}
		}
		f.s.Sweep()
	}
	f.s.repairs.add(chunkRef{f.ino("/a"), 0}, 0, false)
	j := f.s.repairs.next(f.clk.Now())
	_, _, err := f.s.beginReconcile(j)
	var be *blockedError
	if !errors.As(err, &be) || !metaapi.IsCode(err, metaapi.ENOSPC) {
		t.Fatalf("begin: %v, want a blocked ENOSPC", err)
	}
	f.s.finishJob(j, false, 0, err)
	_, st := f.s.repairStatus()
	want := metaapi.RepairBlock{Kind: metaapi.BlockNoPlace, Policy: "RS(3,2)", EC: true, Need: 5, Up: 4, Usable: 4, Chunks: 1}
	if len(st.Blocked) != 1 || st.Blocked[0] != want || st.Stuck != 1 || st.ETA != -1 {
		t.Fatalf("status %+v, want blocked by %+v with no ETA", st, want)
	}
	if s := st.Blocked[0].String(); s != "1 stripe groups of RS(3,2) need 5 nodes, 4 are up" {
		t.Errorf("reason reads %q", s)
	}
	f.heartbeat(gone) // back: the reason may no longer hold
	if _, st := f.s.repairStatus(); len(st.Blocked) != 0 || st.Stuck != 0 {
		t.Errorf("a node came back, status still says %+v", st.Blocked)
	}
}

// TestWaitingForNodesAfterRestart: after a restart, until every node it
// knows has reported (or the node timeout passed), meta says it is
// waiting for them, and the scan neither counts their chunks unavailable
// nor queues repairs.
func TestWaitingForNodesAfterRestart(t *testing.T) {
	f := newFixture(t, onDisk, func(o *Options) { o.RepairGrace = time.Millisecond })
	nodes := f.addNodes(3)
	f.tree("/a")
	f.layout("/a", 0, 1, true)
	if st, _ := f.s.Status(); st.Waiting != nil {
		t.Fatalf("nodes registered, yet waiting: %+v", st.Waiting)
	}
	f.reopen()
	f.clk.Advance(time.Second)
	st, err := f.s.Status()
	if err != nil || st.Waiting == nil || *st.Waiting != (metaapi.NodesReporting{Reported: 0, Known: 3}) {
		t.Fatalf("just restarted: waiting %+v (%v)", st.Waiting, err)
	}
	f.heartbeat(nodes[0])
	if st, _ := f.s.Status(); st.Waiting == nil || st.Waiting.Reported != 1 {
		t.Fatalf("one node reported: waiting %+v", st.Waiting)
	}
	if w := f.s.waitingForNodes(); w == nil {
		t.Fatal("the scan would not wait")
	}
	f.heartbeat(nodes[1])
	f.heartbeat(nodes[2])
	if st, _ := f.s.Status(); st.Waiting != nil {
		t.Fatalf("every node reported, still waiting: %+v", st.Waiting)
	}
	// A node that never reports: waited for until the node timeout.
	f.reopen()
	f.heartbeat(nodes[0])
	f.heartbeat(nodes[1])
	if f.s.waitingForNodes() == nil {
		t.Fatal("two of three reported: not waiting")
	}
	f.clk.Advance(f.s.opts.NodeTimeout)
	if w := f.s.waitingForNodes(); w != nil {
		t.Fatalf("past the node timeout, still waiting: %+v", w)
	}
}

// TestWriteLayoutWaitsForFailover: once a writer's failure has queued a
// chunk for reconciliation, write layouts of it answer EAGAIN until the
// job is done — before, they handed out the same members at once, and a
// writer retrying faster than meta's worker ran out of fail-overs. Read
// layouts are not held up, nor are other jobs' (the repair scan's).
func TestWriteLayoutWaitsForFailover(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/a")
	f.layout("/a", 0, 1, true)
	ref := chunkRef{f.ino("/a"), 0}
	f.s.repairs.add(ref, 0, false) // the scan's: writes go on
	f.layout("/a", 0, 1, true)
	f.s.repairs.add(ref, 0, true) // a writer's failure
	_, err := f.s.Layout(7, metaapi.LayoutReq{Ino: f.ino("/a"), Off: 0, Len: 1, Write: true, Who: root})
	if !metaapi.IsCode(err, metaapi.EAGAIN) {
		t.Fatalf("write layout with a fail-over queued: %v, want EAGAIN", err)
	}
	f.layout("/a", 0, 1, false)
	j := f.s.repairs.next(f.clk.Now())
	f.s.finishJob(j, true, 0, nil)
	f.layout("/a", 0, 1, true)
}
