package meta

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

const gib = 1 << 30

// spaceNodes registers nodes of 100 GiB each with the given free bytes
// (the default margin is then 5 GiB).
func (f *fixture) spaceNodes(free ...int64) []ids.NodeID {
	f.t.Helper()
	var out []ids.NodeID
	for i, fr := range free {
		r, err := f.s.Register(metaapi.RegisterReq{Addr: fmt.Sprintf("127.0.0.1:%d", 9100+i), Capacity: 100 * gib, Free: fr, Used: gib})
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, r.ID)
	}
	return out
}

func (f *fixture) report(id ids.NodeID, free int64) {
	f.t.Helper()
	if _, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: id, Capacity: 100 * gib, Free: free, Used: gib}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) nodeInfo(id ids.NodeID) metaapi.NodeInfo {
	f.t.Helper()
	for _, n := range f.s.Status2().Nodes {
		if n.ID == id {
			return n
		}
	}
	f.t.Fatalf("node %v not in status", id)
	return metaapi.NodeInfo{}
}

// TestLayoutAvoidsFullNode: a node whose chunks hold 1 GiB of its 100 but
// that reports only 512 MiB free (below the 5 GiB margin) gets none of 30
// new files' replicas; status shows it full.
func TestLayoutAvoidsFullNode(t *testing.T) {
	f := newFixture(t)
	nodes := f.spaceNodes(50*gib, 50*gib, 50*gib, gib/2)
	for i := range 30 {
		name := fmt.Sprintf("/f%d", i)
		f.tree(name)
		for _, r := range f.layout(name, 0, 4096, true).Chunks[0].Replicas {
			if r.Node == nodes[3] {
				t.Fatalf("%s placed on the full node %v", name, r.Node)
			}
		}
	}
	if n := f.nodeInfo(nodes[3]); !n.Full || n.Free != gib/2 {
		t.Errorf("status of the full node: %+v", n)
	}
	if n := f.nodeInfo(nodes[0]); n.Full || n.Free != 50*gib {
		t.Errorf("status of a node with room: %+v", n)
	}
	// Four replicas cannot be placed: the error says why.
	f.tree("/four/")
	if _, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/four"), Policy: ring(4), Who: root}); err != nil {
		t.Fatal(err)
	}
	f.tree("/four/x")
	_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino("/four/x"), Len: 1, Write: true, Who: root})
	wantCode(t, err, metaapi.ENOSPC)
	if !strings.Contains(err.Error(), "(4 up, 1 full)") {
		t.Fatalf("message: %v", err)
	}
	// It reports room again: it takes chunks again.
	f.report(nodes[3], 50*gib)
	if _, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino("/four/x"), Len: 1, Write: true, Who: root}); err != nil {
		t.Fatal(err)
	}
}

// TestPlacedBetweenReports: meta counts what it places on a node until
// the node reports again, so a burst of creates within one heartbeat
// stops at the margin instead of filling the node.
func TestPlacedBetweenReports(t *testing.T) {
	f := newFixture(t)
	const room = 10 << 20 // above the 5 GiB margin
	nodes := f.spaceNodes(50*gib, 50*gib, 50*gib, 5*gib+room)
	f.tree("/four/")
	if _, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/four"), Policy: ring(4), Who: root}); err != nil {
		t.Fatal(err)
	}
	// Every chunk needs all four nodes; each write puts 1 MiB on each.
	files := 0
	burst := func() (placed int) {
		for ; placed <= 2*room>>20; files++ { // bounded: fail, not hang, if nothing stops it
			name := fmt.Sprintf("/four/f%d", files)
			f.tree(name)
			_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino(name), Len: 1 << 20, Write: true, Who: root})
			if metaapi.IsCode(err, metaapi.ENOSPC) {
				return placed
			}
			if err != nil {
				t.Fatal(err)
			}
			placed++
		}
		return placed
	}
	if n := burst(); n != room>>20 {
		t.Fatalf("%d chunks of 1 MiB placed on a node with 10 MiB above its margin, want 10", n)
	}
	if !f.nodeInfo(nodes[3]).Full {
		t.Error("status does not show the node full")
	}
	// Its next report counts what arrived; meta starts counting again.
	f.report(nodes[3], 5*gib+room)
	if n := burst(); n != room>>20 {
		t.Fatalf("after a report: %d chunks placed, want 10", n)
	}
	// Only the part of a write in a chunk counts: a 4 KiB file costs 4 KiB.
	f.report(nodes[3], 5*gib+room)
	for i := range 100 {
		name := fmt.Sprintf("/four/small%d", i)
		f.tree(name)
		if _, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino(name), Len: 4096, Write: true, Who: root}); err != nil {
			t.Fatalf("small file %d: %v", i, err)
		}
	}
}

func TestPlacedBytes(t *testing.T) {
	rep := ring(3)
	ec := metaapi.Policy{EC: &metaapi.ErasureCode{Data: 4, Parity: 2, Cell: 4096}}
	const cs = 1 << 20
	for _, tc := range []struct {
		pol            metaapi.Policy
		idx, off, n, w int64
	}{
		{rep, 0, 0, 4096, 4096},
		{rep, 0, 100, cs, cs - 100}, // the part in chunk 0
		{rep, 1, 100, cs, 100},      // and in chunk 1
		{rep, 2, 0, cs, 0},          // none in chunk 2
		{rep, 0, 0, 3 * cs, cs},     // at most a chunk
		{ec, 0, 0, cs, cs / 4},      // a unit's share
		{ec, 0, 0, 5, 2},            // rounded up
	} {
		if got := placedBytes(tc.pol, cs, tc.idx, tc.off, tc.n); got != tc.w {
			t.Errorf("placedBytes(%v, chunk %d, [%d,+%d)) = %d, want %d", tc.pol, tc.idx, tc.off, tc.n, got, tc.w)
		}
	}
}

// TestFailoverMovesOffFullNode: a writer's fail-over moves a chunk's
// member off a node that has since filled up (its write there failed
// for want of space), keeping it a source until the new copy is whole;
// repairs the scan starts leave it alone. An erasure-coded unit there is
// rebuilt elsewhere.
func TestFailoverMovesOffFullNode(t *testing.T) {
	f := newFixture(t)
	nodes := f.spaceNodes(50*gib, 50*gib, 50*gib, 50*gib)
	// A file with a member on the last node, replicated or striped.
	onLast := func(dir string) (string, metaapi.ChunkLayout) {
		for i := 0; ; i++ {
			name := fmt.Sprintf("%s/f%d", dir, i)
			f.tree(name)
			l := f.layout(name, 0, 4096, true).Chunks[0]
			if slices.ContainsFunc(l.Replicas, func(r metaapi.Replica) bool { return r.Node == nodes[3] }) {
				return name, l
			}
		}
	}
	f.tree("/r/", "/ec/")
	if _, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/ec"), Policy: metaapi.Policy{EC: &metaapi.ErasureCode{Data: 2, Parity: 1, Cell: 4096}}, Who: root}); err != nil {
		t.Fatal(err)
	}
	name, l := onLast("/r")
	ecName, ecl := onLast("/ec")
	ref := chunkRef{f.ino(name), 0}
	f.report(nodes[3], gib/2)
	// A scan's repair: nothing to move.
	if _, skip, err := f.s.beginReconcile(&repairJob{ref: ref}); err != nil || !skip {
		t.Fatalf("a scan's reconciliation: skip %v, %v", skip, err)
	}
	p, skip, err := f.s.beginReconcile(&repairJob{ref: ref, failover: true})
	if err != nil || skip {
		t.Fatalf("begin: skip %v, %v", skip, err)
	}
	var members []ids.NodeID
	for _, r := range p.layout.Replicas {
		members = append(members, r.Node)
	}
	if len(members) != 4 || !slices.Contains(members, nodes[3]) {
		t.Fatalf("members while reconciling %v: want the full node still a source and a fourth", members)
	}
	if added := members[3]; !p.fresh[3] || added == nodes[3] {
		t.Fatalf("new member %v (fresh %v)", added, p.fresh)
	}
	if err := f.s.endReconcile(ref, l.Chunk, p.epoch, 0, nil); err != nil {
		t.Fatal(err)
	}
	l2 := f.layout(name, 0, 4096, true).Chunks[0]
	if len(l2.Replicas) != 3 || slices.ContainsFunc(l2.Replicas, func(r metaapi.Replica) bool { return r.Node == nodes[3] }) {
		t.Fatalf("after the fail-over: %+v, want 3 replicas, none on the full node", l2.Replicas)
	}
	// The stripe group's unit there is replaced (rebuilt from the others).
	ecRef := chunkRef{f.ino(ecName), 0}
	p, _, err = f.s.beginReconcile(&repairJob{ref: ecRef, failover: true})
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(ecl.Replicas, func(r metaapi.Replica) bool { return r.Node == nodes[3] })
	if len(p.layout.Replicas) != 3 || p.layout.Replicas[i].Node == nodes[3] || !p.fresh[i] {
		t.Fatalf("stripe group while reconciling: %+v (fresh %v), want unit %d moved off the full node", p.layout.Replicas, p.fresh, i)
	}
	if err := f.s.endReconcile(ecRef, ecl.Chunk, p.epoch, 0, nil); err != nil {
		t.Fatal(err)
	}
	// The full node drops its copies.
	d := f.heartbeat(nodes[3]).Delete
	dropped := func(c ids.ChunkID) bool {
		return slices.ContainsFunc(d, func(r metaapi.RetiredCopy) bool { return r.Chunk == c })
	}
	if !dropped(l.Chunk) || !dropped(ecl.Chunk) {
		t.Fatalf("the full node is not told to drop %v and %v: %v", l.Chunk, ecl.Chunk, d)
	}
}

// TestMarginOfSharedDisk: the margin is a share of the node's file
// system (reported as FSSize), not of its Capacity. A node on a 1000 GiB
// disk that other programs fill to 940 GiB has a Capacity of 60 GiB; 40
// GiB free is below 5% of the disk, so it is full (a share of Capacity,
// 3 GiB, would have it take chunks down to the disk's last 0.3%). A node
// that does not report the size is judged by its Capacity; a size below
// the free space, or negative, is refused.
func TestMarginOfSharedDisk(t *testing.T) {
	f := newFixture(t)
	shared, err := f.s.Register(metaapi.RegisterReq{Addr: "127.0.0.1:9100", Capacity: 60 * gib, Free: 40 * gib, Used: 20 * gib, FSSize: 1000 * gib})
	if err != nil {
		t.Fatal(err)
	}
	old, err := f.s.Register(metaapi.RegisterReq{Addr: "127.0.0.1:9101", Capacity: 60 * gib, Free: 40 * gib, Used: 20 * gib})
	if err != nil {
		t.Fatal(err)
	}
	if n := f.nodeInfo(shared.ID); !n.Full || n.FSSize != 1000*gib {
		t.Errorf("node with 40 GiB free on a 1000 GiB disk: %+v, want full", n)
	}
	if n := f.nodeInfo(old.ID); n.Full || n.FSSize != 0 {
		t.Errorf("node not reporting its file system's size: %+v, want room (a share of its capacity)", n)
	}
	hb := metaapi.HeartbeatReq{ID: shared.ID, Capacity: 80 * gib, Free: 60 * gib, Used: 20 * gib, FSSize: 1000 * gib}
	if _, err := f.s.Heartbeat(hb); err != nil {
		t.Fatal(err)
	}
	if n := f.nodeInfo(shared.ID); n.Full {
		t.Errorf("node with 60 GiB free on a 1000 GiB disk: %+v, want room", n)
	}
	for _, size := range []int64{-1, 59 * gib} {
		bad := hb
		bad.FSSize = size
		_, err := f.s.Heartbeat(bad)
		wantCode(t, err, metaapi.EINVAL)
		_, err = f.s.Register(metaapi.RegisterReq{ID: shared.ID, Addr: "127.0.0.1:9100", Capacity: 80 * gib, Free: 60 * gib, Used: 20 * gib, FSSize: size})
		wantCode(t, err, metaapi.EINVAL)
	}
	if n := f.nodeInfo(shared.ID); n.FSSize != 1000*gib || n.Free != 60*gib {
		t.Errorf("after refused reports: %+v", n)
	}
}
