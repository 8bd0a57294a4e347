package meta

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/inventory"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/repairplan"
)

// adoptFixture has a file f whose one chunk is on members on nodes, one
// of them (gone) down past the repair grace; other holds a copy its
// record does not name, at version held, and lists it in an inventory.
// restored: meta was restored from a backup after the chunk was made.
func adoptFixture(t *testing.T, pol metaapi.Policy, nodes int, held uint64, restored bool) (f *fixture, l metaapi.ChunkLayout, gone, other ids.NodeID) {
	f = newFixture(t)
	all := f.addNodes(nodes)
	f.tree("/d/")
	f.setPolicy("/d", pol)
	f.tree("/d/f")
	ino := f.ino("/d/f")
	l = f.layout("/d/f", 0, 1, true).Chunks[0]
	if _, err := f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 1, Chunks: []metaapi.ChunkVersion{{Chunk: l.Chunk, Version: 1, End: 1}}, Who: root}); err != nil {
		t.Fatal(err)
	}
	if restored {
		if err := os.WriteFile(filepath.Join(f.s.opts.Dir, RestoredFile), []byte("{}"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := f.s.afterRestore(); err != nil {
			t.Fatal(err)
		}
	}
	gone = l.Replicas[0].Node
	for _, n := range all {
		if !slices.ContainsFunc(l.Replicas, func(r metaapi.Replica) bool { return r.Node == n }) {
			other = n
		}
	}
	if other == 0 {
		t.Fatal("every node is a member")
	}
	for range 3 {
		f.clk.Advance(f.s.opts.NodeTimeout/2 + f.s.opts.RepairGrace/2)
		for _, n := range all {
			if n != gone {
				f.heartbeat(n)
			}
		}
		f.s.Sweep()
	}
	req := metaapi.InventoryReq{Node: other, Done: true, Chunks: []metaapi.HeldChunk{{Chunk: l.Chunk, Version: held, Length: 1}}}
	if _, err := f.s.Inventory(req); err != nil {
		t.Fatal(err)
	}
	return f, l, gone, other
}

// TestAdoptDisplacedCopy: a copy of a replicated chunk found on a node
// its record does not name, while a member is down past the grace (a
// meta restored from a backup older than a move), is kept and becomes
// the member in the down one's place, holding the chunk (not placed
// fresh: it is the source, perhaps the only one).
func TestAdoptDisplacedCopy(t *testing.T) {
	f, l, gone, other := adoptFixture(t, metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}, 3, 1, true)
	if d := f.s.inv.displaced(l.Chunk); len(d) != 1 || d[0].Node != other {
		t.Fatalf("displaced copies %+v, want one on %v", d, other)
	}
	ref := chunkRef{f.ino("/d/f"), 0}
	j := f.s.repairs.next(f.clk.Now())
	if j == nil || j.ref != ref {
		t.Fatalf("the inventory did not queue the chunk: %+v", j)
	}
	p, skip, err := f.s.beginReconcile(j)
	if err != nil || skip {
		t.Fatalf("begin: skip %v, %v", skip, err)
	}
	if len(p.layout.Replicas) != 1 || p.layout.Replicas[0].Node != other || p.fresh[0] {
		t.Fatalf("after the reconciliation began: members %+v fresh %v, want %v adopted holding it", p.layout.Replicas, p.fresh, other)
	}
	var rec chunkRec
	if _, err := getJSON(f.s.db, chunkKey(ref.ino, 0), &rec); err != nil || !slices.Equal(rec.Replaced, []ids.NodeID{gone}) {
		t.Fatalf("record %+v (%v), want %v replaced", rec, err, gone)
	}
	// Now a member there: kept.
	r, err := copyRecord(f.s.db, other, l.Chunk)
	if err != nil || inventory.Judge(l.Chunk, f.s.ctr.NextChunk, r) != inventory.Keep {
		t.Fatalf("the adopted copy judged %+v %v", r, err)
	}
}

// TestAdoptNotOlder: a copy older than the version meta recorded is not
// adopted (nor collected): with no other source the chunk waits.
func TestAdoptNotOlder(t *testing.T) {
	f, l, _, _ := adoptFixture(t, metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}, 3, 0, true)
	_, _, err := f.s.beginReconcile(&repairJob{ref: chunkRef{f.ino("/d/f"), 0}})
	if !metaapi.IsCode(err, metaapi.ENOSPC) {
		t.Fatalf("begin with only an older copy elsewhere: %v, want no source", err)
	}
	if d := f.s.inv.displaced(l.Chunk); len(d) != 1 {
		t.Fatalf("the older copy is no longer kept: %+v", d)
	}
}

// TestNoAdoptStripeUnit: a unit of an erasure-coded group found off its
// members is not adopted — the node does not know which unit it holds —
// but kept; the lost unit is rebuilt on a node placed fresh.
func TestNoAdoptStripeUnit(t *testing.T) {
	f, l, _, _ := adoptFixture(t, metaapi.Policy{EC: &metaapi.ErasureCode{Data: 2, Parity: 1, Cell: 4096}}, 4, 1, true)
	p, skip, err := f.s.beginReconcile(&repairJob{ref: chunkRef{f.ino("/d/f"), 0}})
	if err != nil || skip {
		t.Fatalf("begin: skip %v, %v", skip, err)
	}
	if !p.fresh[0] {
		t.Fatalf("unit 0 taken by %v not placed fresh: %v", p.layout.Replicas[0].Node, p.fresh)
	}
	if d := f.s.inv.displaced(l.Chunk); len(d) != 1 {
		t.Fatalf("the unit found elsewhere is no longer kept: %+v", d)
	}
}

// claimRepairer answers fencing with what each node claims to hold and
// records the copies made.
type claimRepairer struct {
	holds  map[ids.NodeID]uint64
	copied []ids.NodeID
	at     []uint64
}

func (r *claimRepairer) FenceMembers(_ context.Context, l *metaapi.ChunkLayout, _ uint64) ([]repairplan.Member, []error) {
	ms := make([]repairplan.Member, len(l.Replicas))
	for i, rp := range l.Replicas {
		ms[i] = repairplan.Member{Answered: true, Version: r.holds[rp.Node], Length: 1}
	}
	return ms, make([]error, len(ms))
}

func (r *claimRepairer) CopyReplica(_ context.Context, l *metaapi.ChunkLayout, target int, _ []int, version uint64, _ int64, _ bool) error {
	r.copied, r.at = append(r.copied, l.Replicas[target].Node), append(r.at, version)
	return nil
}

func (r *claimRepairer) RebuildUnits(context.Context, *metaapi.ChunkLayout, []int, []int, uint64, int64, bool, bool) error {
	return nil
}

func (r *claimRepairer) DropMembers(context.Context, *metaapi.ChunkLayout, []int, []uint64) error {
	return nil
}

// TestNoAdoptWithoutRestore: in a cluster never restored from a backup,
// a node listing a copy of a chunk its record does not name — here at a
// version far above the recorded one, as a node with a valid certificate
// may claim of any id — is not adopted when a member goes down: adopted,
// its claim was the chunk's version and the live member's copy, the
// chunk's data, was overwritten from it.
func TestNoAdoptWithoutRestore(t *testing.T) {
	f, l, gone, other := adoptFixture(t, metaapi.Policy{Replicas: 2, Strategy: plan.Plan{Strategy: plan.Ring}}, 4, 1000, false)
	live := l.Replicas[1].Node
	r := &claimRepairer{holds: map[ids.NodeID]uint64{live: 1, other: 1000}}
	done, _, err := f.s.reconcile(context.Background(), r, &repairJob{ref: chunkRef{f.ino("/d/f"), 0}})
	if err != nil || !done {
		t.Fatalf("reconcile: done %v, %v", done, err)
	}
	if slices.Contains(r.copied, live) || slices.Contains(r.at, 1000) {
		t.Fatalf("copies made to %v at versions %v: the live member %v was overwritten from %v's claim (in place of %v)", r.copied, r.at, live, other, gone)
	}
	var rec chunkRec
	if _, err := getJSON(f.s.db, chunkKey(f.ino("/d/f"), 0), &rec); err != nil || rec.Version != 1 {
		t.Fatalf("record %+v (%v): the version moved to %v's claim", rec, err, other)
	}
}
