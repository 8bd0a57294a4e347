package policy_test

import (
	"bytes"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestReplicasBelowRankZeroTakeOnlyForwards: a client holding a write
// capability for a tree (or ring) file cannot write a replica other than
// rank 0 itself — with or without a made-up seal — so it cannot leave
// two replicas at one version with different bytes.
func TestReplicasBelowRankZeroTakeOnlyForwards(t *testing.T) {
	e := newDoubtEnv(t, 3, nil)
	const chunk = 90
	cp := e.capFor(chunk)
	x := bytes.Repeat([]byte("X"), 1000)
	for _, s := range []plan.Strategy{plan.Tree, plan.Ring} {
		for rank := 1; rank < 3; rank++ {
			h := wire.WriteHeader{Strategy: s, Rank: uint8(rank), Chunk: chunk, Len: 1000, Version: 1, Cap: cp, WriteID: 1}
			if st, msg, _ := e.send(t, rank, h, x); st != wire.StatusAuth {
				t.Fatalf("%v rank %d written by the client: %v %s", s, rank, st, msg)
			}
			// A forged seal: the client does not hold the key.
			hdr, err := wire.AppendWrite(nil, &h, e.addrs())
			if err != nil {
				t.Fatal(err)
			}
			var p wire.WriteHeader
			if err := wire.ParseWrite(hdr, &p); err != nil {
				t.Fatal(err)
			}
			forged := wire.SealForward(wire.AppendForward(nil, &p, uint8(rank), 1, 0), func([]byte) (s [wire.SealSize]byte) { return })
			if st, msg := e.sendRaw(t, rank, forged, x); st != wire.StatusAuth {
				t.Fatalf("%v rank %d with a forged seal: %v %s", s, rank, st, msg)
			}
		}
	}
	for i, n := range e.nodes {
		if info, _ := n.st.Stat(chunk); info.Version != 0 {
			t.Fatalf("rank %d took a client's write: %+v", i, info)
		}
	}
	// Forwarded by rank 0, the same write reaches every replica.
	if st, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: 1000, Cap: cp, WriteID: 2}, x); st != wire.StatusOK {
		t.Fatalf("tree write: %v %s", st, msg)
	}
	assertIdentical(t, e, chunk, 1, x)
}

// TestStrategyBoundByCapability: the file's policy decides who writes
// its replicas: a ring/tree file's capability does not allow a flat
// write (or reservation), and a flat file's does not allow a ring one.
func TestStrategyBoundByCapability(t *testing.T) {
	e := newDoubtEnv(t, 2, nil)
	const chunk ids.ChunkID = 91
	res := wire.WriteHeader{Strategy: plan.Flat, Flags: wire.FlagReserve, Chunk: chunk, Len: 1000, WriteID: 0xA}
	res.Cap = e.capFor(chunk)
	if st, msg, _ := e.send(t, 0, res, nil); st != wire.StatusAuth {
		t.Fatalf("flat reservation on a ring file: %v %s", st, msg)
	}
	ring := wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Len: 1000, Cap: e.flatCap(chunk), WriteID: 0xB}
	if st, msg, _ := e.send(t, 0, ring, make([]byte, 1000)); st != wire.StatusAuth {
		t.Fatalf("ring write on a flat file: %v %s", st, msg)
	}
	if _, ok := e.nodes[0].st.Doubt(chunk); ok {
		t.Fatal("refused writes left a doubt")
	}
}
