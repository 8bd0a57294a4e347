package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestRevocationReachesNodes: once meta revokes a client's capabilities,
// every node refuses one minted for it before — as expired, so a client
// fetches a fresh layout — within a couple of heartbeats (meta's default
// 1 s), and takes what is minted after, and other clients'.
func TestRevocationReachesNodes(t *testing.T) {
	e := newEnv(t, engine.Options{})
	mintFor := func(client ids.ClientID, issued time.Time, nd *node.Node) []byte {
		c := capability.Capability{Rights: capability.Write, Client: client, Ino: 99, Chunk: ids.ChunkID(900 + nd.ID()), Len: 1 << 20,
			Expiry: time.Now().Add(time.Minute).UnixNano(), Issued: issued.UnixNano()}
		c.SetReplicas([]ids.NodeID{nd.ID()})
		return e.keys.Mint(&c)
	}
	write := func(nd *node.Node, capb []byte) wire.Reply {
		return e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: ids.ChunkID(900 + nd.ID()), Len: 10, Cap: capb},
			[]*node.Node{nd}, make([]byte, 10))
	}
	issued := time.Now()
	old := map[*node.Node][]byte{}
	for _, nd := range e.c.Nodes {
		old[nd] = mintFor(1, issued, nd)
		if r := write(nd, old[nd]); r.Status != wire.StatusOK {
			t.Fatalf("node %v before the revocation: %v %s", nd.ID(), r.Status, r.Msg)
		}
	}
	start := time.Now()
	if err := e.c.Meta.RevokeCapabilities(1); err != nil {
		t.Fatal(err)
	}
	const bound = 15 * time.Second // heartbeats are 1 s apart; generous for a loaded machine
	var slowest time.Duration
	for _, nd := range e.c.Nodes {
		for {
			r := write(nd, old[nd])
			if r.Status == wire.StatusAuth {
				if !strings.Contains(string(r.Msg), "expired: revoked") {
					t.Fatalf("node %v refused a revoked capability with %q, want it as expired and revoked", nd.ID(), r.Msg)
				}
				break
			}
			if r.Status != wire.StatusOK {
				t.Fatalf("node %v: %v %s", nd.ID(), r.Status, r.Msg)
			}
			if time.Since(start) > bound {
				t.Fatalf("node %v still takes a revoked capability %s after the revocation", nd.ID(), bound)
			}
			time.Sleep(20 * time.Millisecond)
		}
		slowest = max(slowest, time.Since(start))
	}
	t.Logf("every node refused the revoked capability %s after the revocation", slowest.Round(time.Millisecond))
	for _, nd := range e.c.Nodes {
		if r := write(nd, mintFor(1, time.Now(), nd)); r.Status != wire.StatusOK {
			t.Fatalf("node %v, capability minted after the revocation: %v %s", nd.ID(), r.Status, r.Msg)
		}
		if r := write(nd, mintFor(2, issued, nd)); r.Status != wire.StatusOK {
			t.Fatalf("node %v, another client's capability: %v %s", nd.ID(), r.Status, r.Msg)
		}
	}
}
