package meta

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
	"github.com/sluicefs/sluice/internal/plan"
)

func TestRemovable(t *testing.T) {
	for _, c := range []struct {
		up, draining bool
		h            holdings
		want         string // "" for removable
	}{
		{true, false, holdings{}, "up and not draining"},
		{true, true, holdings{members: 40, sole: 17}, "only copy (or one of the last units) of 17 chunks"},
		{false, false, holdings{members: 3}, "still placed in 3 chunks"},
		{true, true, holdings{}, ""},
		{false, false, holdings{}, ""},
	} {
		err := removable(3, c.up, c.draining, c.h)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v, want removable", c, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want %q", c, err, c.want)
		}
	}
}

func TestRemoveNode(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.NodeTimeout = 5 * time.Second })
	ns := f.addNodes(4)
	f.tree("/one/")
	if _, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/one"), Policy: metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}, Who: root}); err != nil {
		t.Fatal(err)
	}
	f.tree("/one/f")
	l := f.layout("/one/f", 0, 4*testChunkSize, true)
	var holder ids.NodeID
	for _, c := range l.Chunks {
		holder = c.Replicas[0].Node
	}
	wantRefused := func(node ids.NodeID, want string) {
		t.Helper()
		err := f.s.RemoveNode(metaapi.RemoveNodeReq{Node: node})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("remove %v: %v, want a refusal saying %q", node, err, want)
		}
	}
	wantRefused(holder, "up and not draining")
	if err := f.s.Drain(metaapi.DrainReq{Node: holder, Who: root}); err != nil {
		t.Fatal(err)
	}
	wantRefused(holder, "holds the only copy")
	// A node that holds nothing, once draining, goes.
	var idle ids.NodeID
	for _, n := range ns {
		if n != holder {
			if h, _ := f.s.nodeHoldings(n); h.members == 0 {
				idle = n
			}
		}
	}
	if idle == 0 {
		t.Fatal("every node holds a chunk")
	}
	if err := f.s.Drain(metaapi.DrainReq{Node: idle, Who: root}); err != nil {
		t.Fatal(err)
	}
	epoch := f.s.ctr.Epoch
	if err := f.s.RemoveNode(metaapi.RemoveNodeReq{Node: idle}); err != nil {
		t.Fatalf("remove a drained node: %v", err)
	}
	st, _ := f.s.Status()
	for _, n := range st.Nodes {
		if n.ID == idle {
			t.Errorf("status still lists removed node %v", idle)
		}
	}
	if st.Epoch <= epoch {
		t.Errorf("epoch %d after the removal, was %d", st.Epoch, epoch)
	}
	if r := f.s.nodeCerts[idle]; !r.Revoked || !r.Removed {
		t.Errorf("removed node's certificate record %+v, want revoked", r)
	}
	if _, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: idle}); !metaapi.IsCode(err, metaapi.ENOENT) {
		t.Errorf("heartbeat of a removed node: %v, want ENOENT", err)
	}
	f.tree("/one/g")
	for _, c := range f.layout("/one/g", 0, 8*testChunkSize, true).Chunks {
		for _, r := range c.Replicas {
			if r.Node == idle {
				t.Fatalf("a removed node was placed in chunk %v", c.Chunk)
			}
		}
	}
	if err := f.s.RemoveNode(metaapi.RemoveNodeReq{Node: idle}); !metaapi.IsCode(err, metaapi.ENOENT) {
		t.Errorf("removing it again: %v, want ENOENT", err)
	}
}

func TestJoinChosenID(t *testing.T) {
	f := newFixture(t)
	join := func(want ids.NodeID) (metaapi.JoinResp, error) {
		t.Helper()
		_, csr, err := pki.NewNodeKey()
		if err != nil {
			t.Fatal(err)
		}
		return f.s.Join(metaapi.JoinReq{Token: joinToken(t, f, time.Hour), CSR: csr, Want: want})
	}
	r, err := join(40)
	if err != nil || r.ID != 40 {
		t.Fatalf("join asking for id 40: %+v %v", r, err)
	}
	if _, err := join(40); !metaapi.IsCode(err, metaapi.EEXIST) || !strings.Contains(err.Error(), "40") {
		t.Errorf("join asking for a taken id: %v, want EEXIST naming it", err)
	}
	if _, err := join(metaapi.MaxNodeID + 1); !metaapi.IsCode(err, metaapi.EINVAL) {
		t.Errorf("join asking for an id out of range: %v, want EINVAL", err)
	}
	// Ids meta picks never meet a chosen one.
	if r, err := join(0); err != nil || r.ID != 41 {
		t.Errorf("join asking for no id: %+v %v, want id 41", r, err)
	}
	if r, err := join(7); err != nil || r.ID != 7 {
		t.Errorf("join asking for a free id below the others: %+v %v", r, err)
	}
}

// TestRemoveSilentNodeRacingPlacement: a node silent past the timeout but
// not yet marked down is removable (it is not up). A chunk placed between
// the count of its holdings and the removal must not be left naming a
// node that is gone: allocation marks silent nodes down first, and so
// does the removal, and either moves the epoch, which has the count run
// again.
func TestRemoveSilentNodeRacingPlacement(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.NodeTimeout = 5 * time.Second })
	ns := f.addNodes(3)
	f.tree("/d/")
	if _, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/d"), Policy: metaapi.Policy{Replicas: 2, Strategy: plan.Plan{Strategy: plan.Ring}}, Who: root}); err != nil {
		t.Fatal(err)
	}
	f.tree("/d/f")
	silent := ns[2]
	// Heartbeats sweep silent nodes down, so the others report before
	// the third falls silent, and nothing reports after.
	f.clk.Advance(4 * time.Second)
	f.heartbeat(ns[0])
	f.heartbeat(ns[1])
	f.clk.Advance(2 * time.Second)
	placed := false
	err := f.s.removeNode(metaapi.RemoveNodeReq{Node: silent}, func() {
		if placed {
			return
		}
		placed = true
		for _, c := range f.layout("/d/f", 0, testChunkSize, true).Chunks {
			for _, r := range c.Replicas {
				if r.Node == silent {
					t.Logf("chunk %v placed on silent node %v after the count", c.Chunk, silent)
				}
			}
		}
	})
	h, herr := f.s.nodeHoldings(silent)
	if herr != nil {
		t.Fatal(herr)
	}
	if err == nil && h.members > 0 {
		t.Fatalf("node %v removed while %d chunk records still place members on it", silent, h.members)
	}
	if err != nil && !strings.Contains(err.Error(), "only copy") && !strings.Contains(err.Error(), "still placed") {
		t.Fatalf("remove: %v", err)
	}
}
