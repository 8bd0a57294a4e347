package meta

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

func (f *fixture) states() map[ids.NodeID]metaapi.NodeState {
	out := map[ids.NodeID]metaapi.NodeState{}
	for _, n := range f.s.Status2().Nodes {
		out[n.ID] = n.State
	}
	return out
}

func TestRegisterAndHeartbeat(t *testing.T) {
	f := newFixture(t)
	e0 := f.s.Status2().Epoch
	r1, err := f.s.Register(metaapi.RegisterReq{Addr: "10.0.0.1:7000", Domain: "a", Capacity: 100})
	wantCode(t, err, "")
	r2, err := f.s.Register(metaapi.RegisterReq{Addr: "10.0.0.2:7000", Domain: "b", Capacity: 100})
	wantCode(t, err, "")
	if r1.ID != 1 || r2.ID != 2 {
		t.Fatalf("ids %v %v, want 1 2", r1.ID, r2.ID)
	}
	if r1.Epoch <= e0 || r2.Epoch <= r1.Epoch {
		t.Fatalf("epochs %d %d %d do not grow with new nodes", e0, r1.Epoch, r2.Epoch)
	}
	if r1.HeartbeatInterval != int64(time.Second) {
		t.Fatalf("heartbeat interval %d", r1.HeartbeatInterval)
	}
	st := f.s.Status2()
	if len(st.Nodes) != 2 || st.Nodes[0].ID != 1 || st.Nodes[1].ID != 2 || st.Nodes[0].State != metaapi.NodeUp || st.Nodes[0].Domain != "a" {
		t.Fatalf("status nodes %+v", st.Nodes)
	}

	// Re-registering with the same address changes nothing; a new
	// address is a new cluster map.
	e := f.s.Status2().Epoch
	r, _ := f.s.Register(metaapi.RegisterReq{ID: 1, Addr: "10.0.0.1:7000", Domain: "a", Capacity: 100})
	if r.ID != 1 || r.Epoch != e {
		t.Fatalf("idempotent re-register: %+v (epoch was %d)", r, e)
	}
	r, _ = f.s.Register(metaapi.RegisterReq{ID: 1, Addr: "10.0.0.9:7000", Domain: "a", Capacity: 100})
	if r.ID != 1 || r.Epoch != e+1 {
		t.Fatalf("re-register with new address: %+v", r)
	}
	if a := f.s.Status2().Nodes[0].Addr; a != "10.0.0.9:7000" {
		t.Fatalf("address %q not updated", a)
	}

	// Heartbeats carry usage.
	hb, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: 2, Capacity: 200, Used: 50, Chunks: 3})
	wantCode(t, err, "")
	if len(hb.Nodes) != 2 || hb.Epoch != f.s.Status2().Epoch {
		t.Fatalf("heartbeat reply %+v", hb)
	}
	if n := f.s.Status2().Nodes[1]; n.Used != 50 || n.Capacity != 200 || n.Chunks != 3 || n.LastHeartbeat != f.clk.Now().UnixNano() {
		t.Fatalf("usage not recorded: %+v", n)
	}

	// Silence: node 2 keeps beating, node 1 does not.
	e = f.s.Status2().Epoch
	f.clk.Advance(6 * time.Second)
	f.heartbeat(2)
	f.clk.Advance(5 * time.Second) // node 1 silent 11s > 10s, node 2 silent 5s
	if s := f.states(); s[1] != metaapi.NodeDown || s[2] != metaapi.NodeUp {
		t.Fatalf("states %v, want 1 down, 2 up", s)
	}
	if got := f.s.Status2().Epoch; got != e+1 {
		t.Fatalf("epoch %d after one node went down, want %d", got, e+1)
	}
	if got := f.s.Status2().Epoch; got != e+1 {
		t.Fatal("epoch bumped again without a change")
	}
	hb = f.heartbeat(1)
	if hb.Epoch != e+2 {
		t.Fatalf("epoch %d after node came back, want %d", hb.Epoch, e+2)
	}
	for _, n := range hb.Nodes {
		if n.State != metaapi.NodeUp {
			t.Fatalf("node %v %s in heartbeat reply", n.ID, n.State)
		}
	}

	// Errors.
	_, err = f.s.Heartbeat(metaapi.HeartbeatReq{ID: 99})
	wantCode(t, err, metaapi.ENOENT)
	for _, req := range []metaapi.RegisterReq{
		{Addr: ""}, {Addr: "no-port"}, {Addr: "h:1", Capacity: -1}, {Addr: "h:1", Domain: strings.Repeat("d", 300)},
		{Addr: strings.Repeat("h", 300) + ":1"},
	} {
		_, err := f.s.Register(req)
		wantCode(t, err, metaapi.EINVAL)
	}
	_, err = f.s.Heartbeat(metaapi.HeartbeatReq{ID: 1, Addr: "bad"})
	wantCode(t, err, metaapi.EINVAL)
	_, err = f.s.Heartbeat(metaapi.HeartbeatReq{ID: 1, Deleted: make([]ids.ChunkID, maxDeletedAcks+1)})
	wantCode(t, err, metaapi.EINVAL)

	// A node that kept an id meta does not know is taken in, and the id
	// is never handed out again.
	r, err = f.s.Register(metaapi.RegisterReq{ID: 10, Addr: "10.0.0.10:7000"})
	if err != nil || r.ID != 10 {
		t.Fatalf("register known-to-node id: %+v %v", r, err)
	}
	r, _ = f.s.Register(metaapi.RegisterReq{Addr: "10.0.0.11:7000"})
	if r.ID != 11 {
		t.Fatalf("next id %v, want 11", r.ID)
	}
}

func TestPlacementSkipsDownNodes(t *testing.T) {
	f := newFixture(t)
	nodes := f.addNodes(4)
	f.tree("/f")
	f.clk.Advance(6 * time.Second)
	for _, n := range nodes[1:] {
		f.heartbeat(n)
	}
	f.clk.Advance(5 * time.Second) // nodes[0] is now silent for 11s
	r := f.layout("/f", 0, 1, true)
	for _, rep := range r.Chunks[0].Replicas {
		if rep.Node == nodes[0] {
			t.Fatalf("placed on down node %v", rep.Node)
		}
	}
	if r.Epoch != f.s.Status2().Epoch {
		t.Fatal("layout carries a stale epoch")
	}
	f.clk.Advance(5 * time.Second)
	f.heartbeat(nodes[1])
	f.clk.Advance(6 * time.Second) // only nodes[1] alive
	f.tree("/g")
	_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino("/g"), Len: 1, Write: true, Who: root})
	wantCode(t, err, metaapi.ENOSPC)
	if !strings.Contains(err.Error(), "needs 3 replicas but only 1 storage nodes are up") {
		t.Fatalf("message: %v", err)
	}
}

func TestBackgroundSweep(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.SweepInterval = 2 * time.Millisecond })
	id := f.addNodes(1)[0]
	f.clk.Advance(11 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		f.s.mu.RLock()
		st := f.s.nodes[id].state
		f.s.mu.RUnlock()
		if st == metaapi.NodeDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("background sweeper never marked the silent node down")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
