package sdk_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestECWriteAfterDoubtedWrite: a central-mode writer reserves stripe 0,
// writes data unit 1 and the parity unit, and dies before unit 0: its
// reservation expires into a doubt at unit 0, two of three units hold the
// new version. A later small write to the stripe reads it at the version
// K units agree on (adopting the dead writer's bytes, which are
// decodable), and leaves all three units at one version with the
// library's parity.
func TestECWriteAfterDoubtedWrite(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 3, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, ReserveTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newBenchClient(t, c, sdk.Options{}, sdk.BenchOptions{ECMode: sdk.ECCentral})
	ctx := context.Background()
	const cell = 4096
	ecDir(t, cl, "/ec", 2, 1, cell)
	data := bytes.Repeat([]byte("abcdefgh"), 3*2*cell/8) // three stripes
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	_, l := firstGroup(t, cl, "/ec/f", true)
	send := rawUnitSender(t, l)
	// The dead writer: a new stripe 0, encoded by the library.
	d0, d1 := bytes.Repeat([]byte{0x11}, cell), bytes.Repeat([]byte{0x22}, cell)
	shards := [][]byte{d0, d1, make([]byte, cell)}
	enc, _ := reedsolomon.New(2, 1)
	if err := enc.Encode(shards); err != nil {
		t.Fatal(err)
	}
	h := wire.WriteHeader{Strategy: plan.EC, Chunk: l.Chunk, Len: cell, Cap: l.Cap, WriteID: 0xdead}
	res := h
	res.Flags = wire.FlagReserve
	v := send(0, res, nil).Version
	for _, u := range []int{1, 2} {
		hu := h
		hu.Rank, hu.Version = uint8(u), v
		send(u, hu, shards[u])
	}
	waitDoubt(t, c, &l) // the reservation expires: a doubt at unit 0
	// A small write into stripe 0 by a live client.
	f, err := cl.Open(ctx, "/ec/f")
	if err != nil {
		t.Fatal(err)
	}
	patch := []byte("PATCH")
	if _, err := f.WriteAt(patch, 10); err != nil {
		t.Fatalf("write into the doubted stripe: %v", err)
	}
	want := append([]byte(nil), data...)
	copy(want, d0)
	copy(want[cell:], d1)
	copy(want[10:], patch)
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, want) {
		t.Fatal("read back differs: the doubted write's decodable bytes should have been kept")
	}
	assertParityIsLibrarys(t, c, cl, "/ec/f", 2, 1)
}

// TestECFirstWriteInDoubt: a writer's first write to a new stripe group
// reserves version 1 at unit 0 and reaches only data unit 1 before it
// dies; the reservation expires into a doubt at unit 0 (issue 15,
// defect 4). Two of three units — K — hold nothing, so the group is
// still unwritten: a later small write reads its stripe as zeros (not
// "fewer than K units at version 1 or later") and succeeds at once,
// without meta having to repair anything.
func TestECFirstWriteInDoubt(t *testing.T) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(t), Nodes: 3, MetaListen: "127.0.0.1:0",
		ChunkSize: testChunk, ReserveTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cl := newBenchClient(t, c, sdk.Options{}, sdk.BenchOptions{ECMode: sdk.ECCentral})
	ctx := context.Background()
	const cell = 4096
	ecDir(t, cl, "/ec", 2, 1, cell)
	f, err := cl.Create(ctx, "/ec/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	_, l := firstGroup(t, cl, "/ec/f", true)
	send := rawUnitSender(t, l)
	// The dead writer: version 1 reserved, only data unit 1 written.
	h := wire.WriteHeader{Strategy: plan.EC, Chunk: l.Chunk, Len: cell, Cap: l.Cap, WriteID: 0xdead}
	res := h
	res.Flags = wire.FlagReserve
	v := send(0, res, nil).Version
	if v != 1 {
		t.Fatalf("reserved version %d of a new group", v)
	}
	h.Rank, h.Version = 1, v
	send(1, h, bytes.Repeat([]byte{0x22}, cell))
	waitDoubt(t, c, &l)
	patch := []byte("PATCH")
	if _, err := f.WriteAt(patch, 10); err != nil {
		t.Fatalf("write into the group whose first write failed: %v", err)
	}
	if st := cl.Stats(); st.Failovers != 0 {
		t.Errorf("the write needed %d fail-overs (meta's repair), want none", st.Failovers)
	}
	want := make([]byte, 10+len(patch))
	copy(want[10:], patch)
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, want) {
		t.Fatalf("read back %q, want %q", got, want)
	}
	assertParityIsLibrarys(t, c, cl, "/ec/f", 2, 1)
}

// rawUnitSender returns a function that sends one write message to a
// unit of group l as a client of its own would, bypassing the SDK (a
// writer that dies midway), and returns the unit's reply.
func rawUnitSender(t *testing.T, l metaapi.ChunkLayout) func(to int, h wire.WriteHeader, payload []byte) wire.Reply {
	ctx := context.Background()
	addrs := make([]string, len(l.Replicas))
	for i, r := range l.Replicas {
		addrs[i] = r.Addr
	}
	ep, err := fabric.NewEndpoint(fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	pool := fabric.NewPool(ep, 4)
	return func(to int, h wire.WriteHeader, payload []byte) wire.Reply {
		t.Helper()
		hdr, err := wire.AppendWrite(nil, &h, addrs)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := pool.Get(ctx, addrs[to])
		if err != nil {
			t.Fatal(err)
		}
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		var parts [][]byte
		if len(payload) > 0 {
			parts = [][]byte{payload}
		}
		if err := pc.Send(id, hdr, parts...); err != nil {
			t.Fatal(err)
		}
		p := <-ch
		var r wire.Reply
		if err := wire.ParseReply(p.Data, &r); err != nil {
			t.Fatal(err)
		}
		if err := r.Err(); err != nil {
			t.Fatalf("unit %d: %v", to, err)
		}
		p.Release()
		pool.Put(pc)
		return r
	}
}

// waitDoubt waits until the member of l that assigns versions (rank or
// unit 0) holds a doubt: a reservation whose data never came expired.
func waitDoubt(t *testing.T, c *cluster.Cluster, l *metaapi.ChunkLayout) *node.Node {
	t.Helper()
	var holder *node.Node
	for _, n := range c.Nodes {
		if n.Addr() == l.Replicas[0].Addr {
			holder = n
		}
	}
	if holder == nil {
		t.Fatalf("no node at %s", l.Replicas[0].Addr)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok := holder.Store().Doubt(l.Chunk); ok {
			return holder
		}
		if time.Now().After(deadline) {
			t.Fatalf("chunk %v: the reservation never became a doubt at %s", l.Chunk, l.Replicas[0].Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
