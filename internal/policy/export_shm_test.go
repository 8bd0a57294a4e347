package policy_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestSharedMemoryClientsGetOwnCaches: a client on the node's host (the
// shared-memory fabric) gets references into a cache of its own, which it
// reads by copying with no check by the node; another client cannot reach
// that cache even with its key; and once the capability the blocks were
// read under expires, the cache is revoked (its key refused for good) and
// a later read gets a new one.
func TestSharedMemoryClientsGetOwnCaches(t *testing.T) {
	const eb = 4096
	e := newExportEnv(t, 1<<20, fabric.FabricShm, 4)
	n := e.c.Nodes[0]
	one := []*node.Node{n}
	mint := func(client ids.ClientID, chunk ids.ChunkID, rights capability.Rights, ttl time.Duration) []byte {
		c := capability.Capability{Rights: rights, Fanout: plan.FanoutNodes, Client: client, Ino: 99, Chunk: chunk, Len: 64 << 20, Expiry: time.Now().Add(ttl).UnixNano()}
		c.SetReplicas([]ids.NodeID{n.ID()})
		return e.keys.Mint(&c)
	}
	data := bytes.Repeat([]byte("shared memory "), 3000)
	for _, chunk := range []ids.ChunkID{61, 62} {
		if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Len: uint64(len(data)), Cap: mint(1, chunk, capability.Write, time.Minute)}, one, data); r.Status != wire.StatusOK {
			t.Fatalf("write: %v", r.Err())
		}
	}
	epB, err := fabric.NewEndpoint(fabric.Options{Fabric: fabric.FabricShm})
	if err != nil {
		t.Fatal(err)
	}
	poolB := fabric.NewPool(epB, 4)
	t.Cleanup(func() { poolB.Close(); epB.Close() })

	read := func(pool *fabric.Pool, chunk ids.ChunkID, cp []byte) (*fabric.PeerConn, wire.Reply) {
		t.Helper()
		hdr, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: chunk, Off: 0, Len: eb, Cap: cp})
		if err != nil {
			t.Fatal(err)
		}
		pc, err := pool.Get(context.Background(), n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		if err := pc.Send(id, hdr); err != nil {
			t.Fatal(err)
		}
		var r wire.Reply
		select {
		case p := <-ch:
			if p == nil {
				t.Fatalf("connection closed: %v", pc.Err())
			}
			err := wire.ParseReply(p.Data, &r)
			r.Export.Detach()
			p.Release()
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no reply")
		}
		if r.Status != wire.StatusOK || r.Export.Block != eb || len(r.Export.List) == 0 {
			t.Fatalf("read of chunk %v: %v, export %+v", chunk, r.Err(), r.Export)
		}
		return pc, r
	}
	slot := make([]byte, expcache.HeaderSize+eb)
	optimistic := func(pc *fabric.PeerConn, chunk ids.ChunkID, r wire.Reply) error {
		x := r.Export.List[0]
		ref := expcache.Ref{Slot: x.Slot, Gen: x.Gen, Chunk: chunk, Block: 0, Version: r.Version, Len: eb}
		gen, err := pc.ReadOptimistic(context.Background(), r.Export.Region, uint64(ref.Off(eb)), slot, uint64(ref.GenOff(eb)), nil)
		if err != nil {
			return err
		}
		got, err := expcache.Check(ref, slot, gen, eb)
		if err == nil && !bytes.Equal(got, data[:eb]) {
			t.Fatalf("chunk %v: the cached bytes are not the chunk's", chunk)
		}
		return err
	}

	pcA, rA := read(e.pool, 61, mint(1, 61, capability.Read, 1500*time.Millisecond))
	if !pcA.Shared() {
		t.Fatal("the client's connection is not over shared memory")
	}
	if err := optimistic(pcA, 61, rA); err != nil {
		t.Fatalf("client 1 reading its own cache: %v", err)
	}
	e.pool.Put(pcA)
	pcB, rB := read(poolB, 62, mint(2, 62, capability.Read, time.Minute))
	if rB.Export.Region == rA.Export.Region {
		t.Fatal("two clients were given the same cache")
	}
	if err := optimistic(pcB, 62, rB); err != nil {
		t.Fatalf("client 2 reading its own cache: %v", err)
	}
	// Client 2 with client 1's references: refused, its connection up.
	var re *fabric.RemoteError
	if err := optimistic(pcB, 61, rA); !errors.As(err, &re) || pcB.Err() != nil {
		t.Fatalf("client 2 reading client 1's cache: %v (connection: %v), want a refusal", err, pcB.Err())
	}
	if err := pcB.Read(context.Background(), rA.Export.Region, 0, slot); err == nil {
		t.Fatal("a plain READ of another client's cache was served")
	}
	poolB.Put(pcB)

	// Client 1's capability expires: its cache is revoked.
	deadline := time.Now().Add(20 * time.Second)
	for {
		pc, err := e.pool.Get(context.Background(), n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		err = optimistic(pc, 61, rA)
		e.pool.Put(pc)
		if errors.As(err, &re) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("client 1's cache still served 20 s after its capability expired (last: %v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, rA2 := read(e.pool, 61, mint(1, 61, capability.Read, time.Minute))
	if rA2.Export.Region == rA.Export.Region {
		t.Fatal("a revoked cache was handed out again")
	}
}
