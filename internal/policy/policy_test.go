package policy_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// env is a real cluster (meta + 3 nodes on loopback) and a raw fabric
// client that crafts requests by hand.
type env struct {
	c    *cluster.Cluster
	keys *capability.Keyring
	pool *fabric.Pool
}

func newEnv(t *testing.T, eopts engine.Options) *env {
	t.Helper()
	dir := t.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, _ = os.MkdirTemp("/dev/shm", "sluice-policy-")
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: dir, Nodes: 3, MetaListen: "127.0.0.1:0", Engine: eopts})
	if err != nil {
		t.Fatal(err)
	}
	ep, _ := fabric.NewEndpoint(fabric.Options{})
	t.Cleanup(func() { ep.Close(); c.Close() })
	return &env{c: c, keys: c.Meta.Keyring(), pool: fabric.NewPool(ep, 4)}
}

// mint makes a capability for chunk over all three nodes (rank order n1,
// n2, n3), as meta would.
func (e *env) mint(chunk ids.ChunkID, rights capability.Rights, expiry time.Time, nodes ...*node.Node) []byte {
	return e.mintFanout(plan.FanoutNodes, chunk, rights, expiry, nodes...)
}

// mintFanout mints for a file whose client writes every replica (flat)
// or only the first.
func (e *env) mintFanout(f plan.Fanout, chunk ids.ChunkID, rights capability.Rights, expiry time.Time, nodes ...*node.Node) []byte {
	c := capability.Capability{Rights: rights, Fanout: f, Client: 1, Ino: 99, Chunk: chunk, Off: 0, Len: 64 << 20, Expiry: expiry.UnixNano()}
	var list []ids.NodeID
	for _, n := range nodes {
		list = append(list, n.ID())
	}
	c.SetReplicas(list)
	return e.keys.Mint(&c)
}

func addrs(nodes ...*node.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Addr())
	}
	return out
}

// write sends a whole write to the first node of nodes and returns the reply.
func (e *env) write(t testing.TB, h wire.WriteHeader, nodes []*node.Node, data []byte) wire.Reply {
	t.Helper()
	hdr, err := wire.AppendWrite(nil, &h, addrs(nodes...))
	if err != nil {
		t.Fatal(err)
	}
	pc, err := e.pool.Get(context.Background(), nodes[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	var parts [][]byte
	if len(data) > 0 {
		parts = [][]byte{data}
	}
	if err := pc.Send(id, hdr, parts...); err != nil {
		t.Fatal(err)
	}
	return e.reply(t, pc, ch)
}

func (e *env) reply(t testing.TB, pc *fabric.PeerConn, ch <-chan *fabric.Packet) wire.Reply {
	t.Helper()
	select {
	case p, ok := <-ch:
		if !ok {
			t.Fatalf("connection closed without a reply: %v", pc.Err())
		}
		defer p.Release()
		var r wire.Reply
		if err := wire.ParseReply(p.Data, &r); err != nil {
			t.Fatal(err)
		}
		r.Msg = append([]byte(nil), r.Msg...)
		r.CRCs = append([]byte(nil), r.CRCs...)
		r.Export.Detach() // the packet is released on return
		e.pool.Put(pc)
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reply")
	}
	return wire.Reply{}
}

func chunkState(t *testing.T, n *node.Node, id ids.ChunkID) (store.Info, []byte) {
	t.Helper()
	rd, err := n.Store().OpenRead(id)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	info := rd.Info()
	data := make([]byte, info.Length)
	rd.ReadAt(data, 0)
	return info, data
}

func TestRefusals(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1], n[2]}
	now := time.Now()
	good := e.mint(1, capability.Write|capability.Read, now.Add(time.Minute), ring...)
	data := bytes.Repeat([]byte("x"), 100000)

	// A committed baseline that refused writes must leave alone.
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 1, Len: uint64(len(data)), Cap: good}, ring, data); r.Status != wire.StatusOK || r.Version != 1 {
		t.Fatalf("baseline write: %v %s", r.Status, r.Msg)
	}
	forged := append([]byte(nil), good...)
	forged[len(forged)-1] ^= 1
	other := e.mint(2, capability.Write, now.Add(time.Minute), ring...)
	readOnly := e.mint(1, capability.Read, now.Add(time.Minute), ring...)
	expired := e.mint(1, capability.Write, now.Add(-time.Second), ring...)
	wrongOrder := e.mint(1, capability.Write, now.Add(time.Minute), n[1], n[0], n[2])

	cases := []struct {
		name   string
		h      wire.WriteHeader
		nodes  []*node.Node
		status wire.Status
		msg    string
	}{
		{"forged MAC", wire.WriteHeader{Chunk: 1, Len: 10, Cap: forged}, ring, wire.StatusAuth, "MAC"},
		{"expired", wire.WriteHeader{Chunk: 1, Len: 10, Cap: expired}, ring, wire.StatusAuth, "expired"},
		{"read-only capability", wire.WriteHeader{Chunk: 1, Len: 10, Cap: readOnly}, ring, wire.StatusAuth, "needs w"},
		{"other chunk's capability", wire.WriteHeader{Chunk: 1, Len: 10, Cap: other}, ring, wire.StatusAuth, "chunk"},
		{"range past the capability", wire.WriteHeader{Chunk: 1, Off: 64<<20 - 5, Len: 10, Cap: good}, ring, wire.StatusAuth, "range"},
		{"node not at the claimed rank", wire.WriteHeader{Chunk: 1, Len: 10, Cap: wrongOrder}, ring, wire.StatusAuth, "rank"},
		{"version from a client", wire.WriteHeader{Chunk: 1, Len: 10, Version: 5, Cap: good}, ring, wire.StatusBadRequest, "version"},
		{"unknown strategy", wire.WriteHeader{Strategy: 9, Chunk: 1, Len: 10, Cap: good}, ring, wire.StatusBadRequest, "strategy"},
		{"too few coordinates", wire.WriteHeader{Chunk: 1, Len: 10, Cap: good}, ring[:2], wire.StatusBadRequest, "addresses"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.h.Strategy == 0 {
				tc.h.Strategy = plan.Ring
			}
			r := e.write(t, tc.h, tc.nodes, make([]byte, tc.h.Len))
			if r.Status != tc.status || !strings.Contains(string(r.Msg), tc.msg) {
				t.Fatalf("got %v %q, want %v mentioning %q", r.Status, r.Msg, tc.status, tc.msg)
			}
		})
	}
	// Nothing of the refused writes reached any replica.
	for _, nd := range ring {
		info, got := chunkState(t, nd, 1)
		if info.Version != 1 || !bytes.Equal(got, data) {
			t.Fatalf("node %v: chunk changed by a refused write: %+v", nd.ID(), info)
		}
	}
}

// TestStaleReplicaRefusesAndHeadAborts: a replica that missed a write
// refuses the next one; the ring reports it and no replica commits, so
// none gets ahead of the others.
func TestStaleReplicaRefusesAndHeadAborts(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1], n[2]}
	cp := e.mint(7, capability.Write|capability.Read, time.Now().Add(time.Minute), ring...)
	// Give the tail a version the others do not have (as if a write had
	// reached only it).
	w, err := n[2].Store().BeginWrite(7, 0, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	w.Place(0, []byte("abc"))
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 7, Len: 200000, Cap: cp}, ring, make([]byte, 200000))
	if r.Status != wire.StatusReplica || !strings.Contains(string(r.Msg), "stale") {
		t.Fatalf("got %v %q, want a replica error naming the stale tail", r.Status, r.Msg)
	}
	for i, nd := range ring[:2] {
		if info, _ := chunkState(t, nd, 7); info.Version != 0 {
			t.Fatalf("replica %d committed a write its downstream refused: %+v", i, info)
		}
	}
}

// TestClientVanishesMidWrite: the client sends half a write and dies;
// every replica cleans up and nothing is committed; the chunk is then
// writable again.
func TestClientVanishesMidWrite(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1], n[2]}
	cp := e.mint(3, capability.Write|capability.Read, time.Now().Add(time.Minute), ring...)
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: 3, Len: 4 << 20, Cap: cp}, addrs(ring...))
	pc, err := e.pool.Get(context.Background(), n[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pc.Begin(pc.NewID(), hdr, false)
	if err != nil {
		t.Fatal(err)
	}
	mw.Write(make([]byte, 1<<20), false)
	mw.Flush()
	time.Sleep(50 * time.Millisecond)
	mw.Abort(os.ErrClosed) // the client dies mid-message
	deadline := time.Now().Add(5 * time.Second)
	for _, nd := range ring {
		for nd.Engine().Stats().InFlight != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("node %v still holds the request: %+v", nd.ID(), nd.Engine().Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if info, _ := chunkState(t, nd, 3); info.Version != 0 || info.Length != 0 {
			t.Fatalf("node %v committed part of an abandoned write: %+v", nd.ID(), info)
		}
	}
	// The chunk is free again: a complete write succeeds everywhere. (A
	// head with forwards lets its store write go in the background once
	// they have ended, after its table entry: until then a write is
	// refused busy, which clients retry.)
	data := bytes.Repeat([]byte("y"), 300000)
	for {
		r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 3, Len: uint64(len(data)), Cap: cp}, ring, data)
		if r.Status == wire.StatusOK {
			break
		}
		if r.Status != wire.StatusBusy || time.Now().After(deadline) {
			t.Fatalf("write after cleanup: %v %s", r.Status, r.Msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, nd := range ring {
		if info, got := chunkState(t, nd, 3); info.Version != 1 || !bytes.Equal(got, data) {
			t.Fatalf("node %v: %+v", nd.ID(), info)
		}
	}
}

// TestReplicaDownFailsWholeWrite: with the tail gone the write fails with
// an error naming it, and no replica commits.
func TestReplicaDownFailsWholeWrite(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1], n[2]}
	cp := e.mint(4, capability.Write|capability.Read, time.Now().Add(time.Minute), ring...)
	n[2].Close()
	r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 4, Len: 500000, Cap: cp}, ring, make([]byte, 500000))
	if r.Status != wire.StatusReplica || !strings.Contains(string(r.Msg), "rank 2") {
		t.Fatalf("got %v %q", r.Status, r.Msg)
	}
	for _, nd := range ring[:2] {
		if info, _ := chunkState(t, nd, 4); info.Version != 0 {
			t.Fatalf("node %v committed although the ring was broken: %+v", nd.ID(), info)
		}
	}
}

// TestReadReplyIsVerifiable: a read returns block-aligned data with the
// stored checksums, placed in the requester's registered region.
func TestReadReplyIsVerifiable(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	cp := e.mint(5, capability.Write|capability.Read, time.Now().Add(time.Minute), n[0])
	data := make([]byte, 100000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 5, Len: uint64(len(data)), Cap: cp}, n[:1], data); r.Status != wire.StatusOK {
		t.Fatalf("write: %v %s", r.Status, r.Msg)
	}
	pc, err := e.pool.Get(context.Background(), n[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	region := e.pool.Endpoint().Register(make([]byte, 200000), fabric.RemoteWrite)
	hdr, _ := wire.AppendRead(nil, &wire.ReadHeader{Chunk: 5, Off: 20000, Len: 50000, RegionKey: region.Key(), Cap: cp})
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	pc.Send(id, hdr)
	r := e.reply(t, pc, ch)
	if r.Status != wire.StatusOK || r.DataOff%uint64(r.BlockSize) != 0 || r.DataOff > 20000 || r.DataOff+r.DataLen < 70000 {
		t.Fatalf("reply %+v %s", r, r.Msg)
	}
	got := region.Bytes()[:r.DataLen]
	if !bytes.Equal(got, data[r.DataOff:r.DataOff+r.DataLen]) {
		t.Fatal("placed data differs")
	}
	// A read capability for another node is refused.
	other := e.mint(5, capability.Read, time.Now().Add(time.Minute), n[1])
	hdr, _ = wire.AppendRead(nil, &wire.ReadHeader{Chunk: 5, Len: 10, RegionKey: region.Key(), Cap: other})
	pc, _ = e.pool.Get(context.Background(), n[0].Addr())
	id = pc.NewID()
	ch = pc.Replies.Expect(id)
	pc.Send(id, hdr)
	if r := e.reply(t, pc, ch); r.Status != wire.StatusAuth {
		t.Fatalf("read with another node's capability: %v %s", r.Status, r.Msg)
	}
}

// TestForwardUsesClusterMapNotClientAddress: the replica addresses in a
// write header come from the client; a node forwards to the address its
// own cluster map gives for the next replica's id (covered by the
// capability's MAC), so a client cannot point it elsewhere.
func TestForwardUsesClusterMapNotClientAddress(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1]}
	// A decoy that counts connections.
	decoy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer decoy.Close()
	var dialed atomic.Int32
	go func() {
		for {
			c, err := decoy.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			c.Close()
		}
	}()
	// Wait until the head's map knows the second replica (first heartbeat).
	deadline := time.Now().Add(5 * time.Second)
	cp := e.mint(8, capability.Write|capability.Read, time.Now().Add(time.Minute), ring...)
	data := bytes.Repeat([]byte("z"), 100000)
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: 8, Len: uint64(len(data)), Cap: cp},
		[]string{n[0].Addr(), decoy.Addr().String()})
	for {
		pc, err := e.pool.Get(context.Background(), n[0].Addr())
		if err != nil {
			t.Fatal(err)
		}
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		pc.Send(id, hdr, data)
		r := e.reply(t, pc, ch)
		if r.Status == wire.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write never succeeded: %v %s", r.Status, r.Msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if dialed.Load() != 0 {
		t.Fatal("the node forwarded to the address the client supplied")
	}
	if info, got := chunkState(t, n[1], 8); info.Version != 1 || !bytes.Equal(got, data) {
		t.Fatalf("second replica: %+v", info)
	}
}

func TestHostModeValidatesAfterBuffering(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1], n[2]}
	good := e.mint(31, capability.Write|capability.Read, time.Now().Add(time.Minute), ring...)
	forged := append([]byte(nil), good...)
	forged[len(forged)-1] ^= 1
	data := bytes.Repeat([]byte("h"), 300000)
	for _, s := range []plan.Strategy{plan.Ring, plan.Tree} {
		r := e.write(t, wire.WriteHeader{Strategy: s, Mode: plan.Host, Chunk: 31, Len: uint64(len(data)), Cap: forged}, ring, data)
		if r.Status != wire.StatusAuth {
			t.Fatalf("%v host write with a forged capability: %v %s", s, r.Status, r.Msg)
		}
	}
	for _, nd := range ring {
		if info, _ := chunkState(t, nd, 31); info.Version != 0 {
			t.Fatalf("a refused host-mode write reached node %v", nd.ID())
		}
	}
	for i, s := range []plan.Strategy{plan.Ring, plan.Tree} {
		r := e.write(t, wire.WriteHeader{Strategy: s, Mode: plan.Host, Chunk: 31, Len: uint64(len(data)), Cap: good}, ring, data)
		if r.Status != wire.StatusOK || r.Version != uint64(i+1) {
			t.Fatalf("%v host write: %v %s v%d", s, r.Status, r.Msg, r.Version)
		}
	}
	for _, nd := range ring {
		if info, got := chunkState(t, nd, 31); info.Version != 2 || !bytes.Equal(got, data) {
			t.Fatalf("node %v after host writes: %+v", nd.ID(), info)
		}
	}
}

func TestHostModeMemoryIsBounded(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	cp := e.mint(32, capability.Write, time.Now().Add(time.Minute), n[0])
	// Larger than the whole host budget (256 MiB): refused outright.
	r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Mode: plan.Host, Chunk: 32, Len: 300 << 20, Cap: cp}, n[:1], nil)
	if r.Status != wire.StatusBadRequest {
		t.Fatalf("oversized host write: %v %s", r.Status, r.Msg)
	}
}

func TestFlatReservations(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	set := []*node.Node{n[0], n[1]}
	cp := e.mintFanout(plan.FanoutClient, 33, capability.Write|capability.Read, time.Now().Add(time.Minute), set...)
	data := bytes.Repeat([]byte("f"), 1000)
	// Data for rank 0 without a reservation: refused.
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Flat, Chunk: 33, Len: 1000, Version: 1, Cap: cp}, set, data); r.Status != wire.StatusStale {
		t.Fatalf("unreserved flat write: %v %s", r.Status, r.Msg)
	}
	// Reserve, then a second reservation is busy until the first is used.
	res := wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: 33, Len: 1000, Cap: cp}
	r := e.write(t, res, set, nil)
	if r.Status != wire.StatusOK || r.Version != 1 {
		t.Fatalf("reserve: %v %s v%d", r.Status, r.Msg, r.Version)
	}
	if r := e.write(t, res, set, nil); r.Status != wire.StatusBusy {
		t.Fatalf("second reservation: %v %s", r.Status, r.Msg)
	}
	// Rank 1 first, then rank 0 with the reserved version.
	rank1 := wire.WriteHeader{Strategy: plan.Flat, Rank: 1, Chunk: 33, Len: 1000, Version: 1, Cap: cp}
	if r := e.write(t, rank1, []*node.Node{n[1], n[1]}, data); r.Status != wire.StatusOK {
		t.Fatalf("rank 1: %v %s", r.Status, r.Msg)
	}
	// A write two versions ahead waits (busy) rather than diverging.
	ahead := rank1
	ahead.Version = 3
	if r := e.write(t, ahead, []*node.Node{n[1], n[1]}, data); r.Status != wire.StatusBusy {
		t.Fatalf("rank 1 two versions ahead: %v %s", r.Status, r.Msg)
	}
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Flat, Chunk: 33, Len: 1000, Version: 1, Cap: cp}, set, data); r.Status != wire.StatusOK {
		t.Fatalf("rank 0 data: %v %s", r.Status, r.Msg)
	}
	for _, nd := range set {
		if info, got := chunkState(t, nd, 33); info.Version != 1 || !bytes.Equal(got, data) {
			t.Fatalf("node %v: %+v", nd.ID(), info)
		}
	}
}

// TestTreeMemberDiesMidWrite: a tree whose leaf dies while data streams
// fails the write with an error; it is never acknowledged.
func TestTreeMemberDiesMidWrite(t *testing.T) {
	e := newEnv(t, engine.Options{IdleTimeout: time.Second})
	n := e.c.Nodes
	tree := []*node.Node{n[0], n[1], n[2]}
	cp := e.mint(34, capability.Write|capability.Read, time.Now().Add(time.Minute), tree...)
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Tree, Chunk: 34, Len: 8 << 20, Cap: cp}, addrs(tree...))
	pc, err := e.pool.Get(context.Background(), n[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	mw, err := pc.Begin(id, hdr, false)
	if err != nil {
		t.Fatal(err)
	}
	mw.Write(make([]byte, 2<<20), false)
	mw.Flush()
	n[2].Close() // a leaf of the tree dies mid-write
	if err := mw.Write(make([]byte, 6<<20), true); err == nil {
		mw.Close()
	}
	select {
	case p, ok := <-ch:
		if !ok {
			return // the head hung up: not acknowledged either
		}
		var r wire.Reply
		wire.ParseReply(p.Data, &r)
		p.Release()
		if r.Status == wire.StatusOK {
			t.Fatal("a write whose replica died was acknowledged")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no answer")
	}
}
