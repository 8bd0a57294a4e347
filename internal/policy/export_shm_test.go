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

// TestSharedMemoryClientsGetOwnCaches: a connection from the node's host
// (the shared-memory fabric) gets references into a cache of its own,
// which its peer reads by copying with no check by the node; another
// connection cannot reach that cache even with its key — not even one
// that shows a capability of the same client (a bearer token: it must
// not see what that client reads later); a capability about to expire
// makes no cache; and once the connection closes, its cache is revoked.
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

	pcA, rA := read(e.pool, 61, mint(1, 61, capability.Read, time.Minute))
	if !pcA.Shared() {
		t.Fatal("the client's connection is not over shared memory")
	}
	if err := optimistic(pcA, 61, rA); err != nil {
		t.Fatalf("client 1 reading its own cache: %v", err)
	}
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
	// A peer showing a capability of client 1 on its own connection gets
	// a cache of its own, not client 1's.
	_, rX := read(poolB, 61, mint(1, 61, capability.Read, time.Minute))
	if rX.Export.Region == rA.Export.Region {
		t.Fatal("a connection showing client 1's capability was given client 1's cache")
	}
	if err := optimistic(pcB, 61, rA); !errors.As(err, &re) {
		t.Fatalf("after showing client 1's capability, reading client 1's cache: %v, want a refusal", err)
	}
	if err := pcB.Read(context.Background(), rA.Export.Region, 0, slot); err == nil {
		t.Fatal("a plain READ of another connection's cache was served")
	}
	// A capability with seconds left makes no cache.
	epC, err := fabric.NewEndpoint(fabric.Options{Fabric: fabric.FabricShm})
	if err != nil {
		t.Fatal(err)
	}
	poolC := fabric.NewPool(epC, 4)
	t.Cleanup(func() { poolC.Close(); epC.Close() })
	hdr, _ := wire.AppendRead(nil, &wire.ReadHeader{Chunk: 61, Len: eb, Cap: mint(3, 61, capability.Read, 3*time.Second)})
	pcC, err := poolC.Get(context.Background(), n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	id := pcC.NewID()
	ch := pcC.Replies.Expect(id)
	if err := pcC.Send(id, hdr); err != nil {
		t.Fatal(err)
	}
	if p := <-ch; p == nil {
		t.Fatal("no reply")
	} else {
		var r wire.Reply
		if err := wire.ParseReply(p.Data, &r); err != nil || r.Status != wire.StatusOK || r.Export.Block != 0 {
			t.Fatalf("a read under a capability with 3 s left: %v, export %+v; want no references", err, r.Export)
		}
		p.Release()
	}
	// Client 1's connection closes: its cache is revoked, and its next
	// connection gets another.
	pcA.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pc, r := read(e.pool, 61, mint(1, 61, capability.Read, time.Minute))
		e.pool.Put(pc)
		if r.Export.Region != rA.Export.Region {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a closed connection's cache was handed to its client's next connection")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
