package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestRepairNeedsRepairRight: fencing, copying and rebuilding change a
// replica set's contents, so a node takes them only under a capability
// carrying the repair right, which only meta's reconciliation mints; a
// client's read-write capability for the chunk is refused, in every mode.
func TestRepairNeedsRepairRight(t *testing.T) {
	e := newDoubtEnv(t, 3, nil)
	const chunk = ids.ChunkID(77)
	// A committed chunk to fence or copy.
	if st, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: 4096, Cap: e.capFor(chunk), WriteID: 1}, make([]byte, 4096)); st != wire.StatusOK {
		t.Fatalf("write: %v %s", st, msg)
	}
	mint := func(r capability.Rights) []byte {
		c := capability.Capability{Rights: r, Client: 1, Ino: 1, Chunk: chunk, Len: 64 << 20, Epoch: 5,
			Expiry: time.Now().Add(time.Minute).UnixNano()}
		c.SetReplicas([]ids.NodeID{1, 2, 3})
		return e.keys.Mint(&c)
	}
	repair := func(cp []byte, mode wire.RepairMode, unit uint8) (wire.Status, string) {
		h := wire.RepairHeader{Mode: mode, Unit: unit, Chunk: chunk, Version: 1, Len: 4096, Cap: cp}
		if mode == wire.RepairCopy {
			h.Survivors = []byte{0}
		}
		hdr, err := wire.AppendRepair(nil, &h, e.addrs())
		if err != nil {
			t.Fatal(err)
		}
		return e.sendRaw(t, int(unit), hdr, nil)
	}
	for _, r := range []capability.Rights{capability.Read, capability.Write, capability.Read | capability.Write} {
		for _, m := range []wire.RepairMode{wire.RepairFence, wire.RepairCopy, wire.RepairDrop} {
			if st, msg := repair(mint(r), m, 1); st != wire.StatusAuth || !strings.Contains(msg, "needs R") {
				t.Fatalf("mode %v with rights %v: %v %q, want an auth refusal", m, r, st, msg)
			}
		}
	}
	// Nothing happened: node 2's copy is still at version 1, unfenced.
	if st, msg := repair(mint(capability.Read|capability.Write|capability.Repair), wire.RepairFence, 1); st != wire.StatusOK {
		t.Fatalf("fence with the repair right: %v %s", st, msg)
	}
	// Now fenced at epoch 5: a write planned before is refused.
	if st, _, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: 4096, Cap: e.capFor(chunk), WriteID: 2}, make([]byte, 4096)); st == wire.StatusOK {
		t.Fatal("a write planned before the fence was accepted")
	}
}

// TestRepairDrop: a reconciliation that found no complete write drops a
// member's copy — data and doubt — only under its own fence and only at
// the version fencing found; the fence stays, so a writer holding a
// layout from before is still refused.
func TestRepairDrop(t *testing.T) {
	e := newDoubtEnv(t, 3, nil)
	const chunk = ids.ChunkID(78)
	if st, msg, _ := e.send(t, 0, wire.WriteHeader{Strategy: plan.Tree, Chunk: chunk, Len: 4096, Cap: e.capFor(chunk), WriteID: 1}, make([]byte, 4096)); st != wire.StatusOK {
		t.Fatalf("write: %v %s", st, msg)
	}
	mint := func(epoch uint64) []byte {
		c := capability.Capability{Rights: capability.Read | capability.Write | capability.Repair, Client: 1, Ino: 1, Chunk: chunk, Len: 64 << 20,
			Epoch: epoch, Expiry: time.Now().Add(time.Minute).UnixNano()}
		c.SetReplicas([]ids.NodeID{1, 2, 3})
		return e.keys.Mint(&c)
	}
	repair := func(mode wire.RepairMode, epoch, version uint64) (wire.Status, string) {
		hdr, err := wire.AppendRepair(nil, &wire.RepairHeader{Mode: mode, Unit: 1, Chunk: chunk, Version: version, Cap: mint(epoch)}, e.addrs())
		if err != nil {
			t.Fatal(err)
		}
		return e.sendRaw(t, 1, hdr, nil)
	}
	if st, msg := repair(wire.RepairFence, 5, 0); st != wire.StatusOK || e.lastVersion != 1 {
		t.Fatalf("fence: %v %s, version %d", st, msg, e.lastVersion)
	}
	if st, msg := repair(wire.RepairDrop, 5, 2); st != wire.StatusStale {
		t.Fatalf("drop planned at another version: %v %s, want stale", st, msg)
	}
	if st, msg := repair(wire.RepairDrop, 4, 1); st != wire.StatusFenced {
		t.Fatalf("drop planned before the fence: %v %s, want fenced", st, msg)
	}
	if info, err := e.nodes[1].st.Stat(chunk); err != nil || info.Version != 1 {
		t.Fatalf("refused drops touched the copy: %+v %v", info, err)
	}
	if st, msg := repair(wire.RepairDrop, 5, 1); st != wire.StatusOK {
		t.Fatalf("drop: %v %s", st, msg)
	}
	if info, err := e.nodes[1].st.Stat(chunk); err != nil || info.Version != 0 {
		t.Fatalf("after the drop: %+v %v, want nothing held", info, err)
	}
	if st, msg := repair(wire.RepairFence, 5, 0); st != wire.StatusOK || e.lastVersion != 0 {
		t.Fatalf("fence after the drop: %v %s, version %d", st, msg, e.lastVersion)
	}
	// The fence outlived the drop: writes planned before it are refused.
	if fs, err := e.nodes[1].st.Fence(chunk, 0); err != nil || fs.Fence != 5 {
		t.Fatalf("fence after the drop: %+v %v, want epoch 5", fs, err)
	}
}
