package policy_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// batchReply is one descriptor's answer, copied out of the packet.
type batchReply struct {
	wire.Reply
	msg string
}

// sendBatch sends a batched read to n and returns the per-descriptor
// answers, or the plain reply that refused the whole batch.
func sendBatch(t *testing.T, pool *fabric.Pool, n *node.Node, hdr []byte, count int) ([]batchReply, *wire.Reply) {
	t.Helper()
	pc, err := pool.Get(context.Background(), n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	if err := pc.Send(id, hdr); err != nil {
		t.Fatal(err)
	}
	var p *fabric.Packet
	select {
	case p = <-ch:
		if p == nil {
			t.Fatalf("connection closed without a reply: %v", pc.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply")
	}
	defer p.Release()
	defer pool.Put(pc)
	if wire.Op(p.Data[0]) == wire.OpReply {
		var r wire.Reply
		if err := wire.ParseReply(p.Data, &r); err != nil {
			t.Fatal(err)
		}
		return nil, &r
	}
	var out []batchReply
	if err := wire.ParseBatchReply(p.Data, count, func(i int, r *wire.Reply) error {
		c := batchReply{Reply: *r, msg: string(r.Msg)}
		c.CRCs = bytes.Clone(r.CRCs)
		out = append(out, c)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out, nil
}

// TestBatchRefusesForgedDescriptors: each descriptor of a batched read is
// authorised on its own, as a single read is. A descriptor naming a chunk
// its capability does not cover, and one under a capability whose MAC
// was altered, are refused (auth) in their slots and nothing is placed in
// their windows; the other descriptors of the batch are served. A header
// that does not parse is refused whole.
func TestBatchRefusesForgedDescriptors(t *testing.T) {
	e := newEnv(t, engine.Options{})
	one := []*node.Node{e.c.Nodes[0]}
	capA := e.mint(41, capability.Write|capability.Read, time.Now().Add(time.Minute), one...)
	capB := e.mint(42, capability.Write|capability.Read, time.Now().Add(time.Minute), one...)
	dataA := make([]byte, 64<<10)
	for i := range dataA {
		dataA[i] = byte(i * 7)
	}
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 41, Len: uint64(len(dataA)), Cap: capA}, one, dataA); r.Status != wire.StatusOK {
		t.Fatalf("write: %v %s", r.Status, r.Msg)
	}
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 42, Len: 6000, Cap: capB}, one, bytes.Repeat([]byte("secret"), 1000)); r.Status != wire.StatusOK {
		t.Fatalf("write: %v %s", r.Status, r.Msg)
	}
	ep, err := fabric.NewEndpoint(fabric.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pool := fabric.NewPool(ep, 2)
	t.Cleanup(func() { pool.Close(); ep.Close() })
	const win = 64 << 10
	mem := make([]byte, 5*win)
	region := ep.Register(mem, fabric.RemoteWrite)
	forged := bytes.Clone(capA)
	forged[len(forged)-1] ^= 1
	descs := []wire.BatchRead{
		{Chunk: 41, Off: 0, Len: 4096, Window: win, RegionKey: region.Key(), RegionOff: 0, Cap: 0},
		{Chunk: 42, Off: 0, Len: 4096, Window: win, RegionKey: region.Key(), RegionOff: win, Cap: 0}, // capA does not cover 42
		{Chunk: 41, Off: 20000, Len: 100, Window: win, RegionKey: region.Key(), RegionOff: 2 * win, Cap: 0},
		{Chunk: 41, Off: 0, Len: 4096, Window: win, RegionKey: region.Key(), RegionOff: 3 * win, Cap: 1},                // altered MAC
		{Chunk: 41, Off: 0, Len: 4096, Window: 4096, RegionKey: region.Key(), RegionOff: 4 * win, Cap: 0},               // window under a block
		{Chunk: 41, Off: 1<<64 - 1 - 4096, Len: 4096, Window: win, RegionKey: region.Key(), RegionOff: 4 * win, Cap: 0}, // at the end of the offset space
	}
	hdr, err := wire.AppendBatch(nil, descs, [][]byte{capA, forged})
	if err != nil {
		t.Fatal(err)
	}
	reps, whole := sendBatch(t, pool, one[0], hdr, len(descs))
	if whole != nil {
		t.Fatalf("batch refused whole: %v %s", whole.Status, whole.Msg)
	}
	want := []wire.Status{wire.StatusOK, wire.StatusAuth, wire.StatusOK, wire.StatusAuth, wire.StatusBadRequest, wire.StatusAuth}
	for i, r := range reps {
		if r.Status != want[i] {
			t.Errorf("descriptor %d: %v %s, want %v", i, r.Status, r.msg, want[i])
		}
	}
	bs := int64(reps[0].BlockSize)
	for i, at := range []int{0, 2} {
		d := descs[at]
		got, bad, err := reps[at].ReadData(mem[d.RegionOff:d.RegionOff+win], int64(d.Off), int64(d.Len))
		if err != nil || len(bad) > 0 {
			t.Fatalf("served descriptor %d: %v, bad %v", i, err, bad)
		}
		if !bytes.Equal(got, dataA[d.Off:d.Off+uint64(d.Len)]) {
			t.Fatalf("descriptor %d placed the wrong bytes", at)
		}
	}
	for _, at := range []int{1, 3, 4} {
		if w := mem[descs[at].RegionOff : descs[at].RegionOff+win]; !bytes.Equal(w, make([]byte, win)) {
			t.Errorf("refused descriptor %d had bytes placed in its window", at)
		}
	}
	if reps[4].BlockSize != uint32(bs) || bs < wire.MinBlockSize {
		t.Errorf("a window refusal says block size %d (served with %d)", reps[4].BlockSize, bs)
	}

	// A header cut short is refused whole, and the connection serves on.
	if _, whole := sendBatch(t, pool, one[0], hdr[:len(hdr)-1], len(descs)); whole == nil || whole.Status != wire.StatusBadRequest {
		t.Fatalf("truncated batch: %+v", whole)
	}
	if reps, whole := sendBatch(t, pool, one[0], hdr, len(descs)); whole != nil || reps[0].Status != wire.StatusOK {
		t.Fatalf("after a refusal: %+v %+v", whole, reps)
	}
}
