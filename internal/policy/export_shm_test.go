package policy_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
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

// TestSharedMemoryClientsGetOwnCaches: a process on the node's host (the
// shared-memory fabric) gets references into a cache of its own, shared
// by its connections (a client's pool has several), which it reads by
// copying with no check by the node; another process cannot reach that
// cache even with its key and a capability of the same client (a bearer
// token: it must not see what that client reads later) — it gets a cache
// of its own (a helper process, TestHelperOtherProcess); a connection
// over TCP is refused it.
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
	pcA, rA := shmRead(t, e.pool, n.Addr(), 61, mint(1, 61, capability.Read, time.Minute))
	if !pcA.Shared() || rA.Export.Block != eb {
		t.Fatalf("the client's connection is not over shared memory, or no references: %+v", rA.Export)
	}
	if err := optimisticSlot(pcA, 61, rA, data[:eb]); err != nil {
		t.Fatalf("reading its own cache: %v", err)
	}
	// Another connection of the same process: the same cache.
	epB, err := fabric.NewEndpoint(fabric.Options{Fabric: fabric.FabricShm})
	if err != nil {
		t.Fatal(err)
	}
	poolB := fabric.NewPool(epB, 4)
	t.Cleanup(func() { poolB.Close(); epB.Close() })
	pcB, rB := shmRead(t, poolB, n.Addr(), 62, mint(2, 62, capability.Read, time.Minute))
	if rB.Export.Region != rA.Export.Region {
		t.Fatal("two connections of one process were given different caches")
	}
	// Over TCP: refused.
	epT, err := fabric.NewEndpoint(fabric.Options{Fabric: fabric.FabricTCP})
	if err != nil {
		t.Fatal(err)
	}
	poolT := fabric.NewPool(epT, 4)
	t.Cleanup(func() { poolT.Close(); epT.Close() })
	pcT, err := poolT.Get(context.Background(), n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var re *fabric.RemoteError
	if err := optimisticSlot(pcT, 61, rA, data[:eb]); !errors.As(err, &re) {
		t.Fatalf("a TCP connection reading a process's cache: %v, want a refusal", err)
	}
	// Another process, with client 1's capability: a cache of its own,
	// and client 1's refused.
	capHex := hex.EncodeToString(mint(1, 61, capability.Read, time.Minute))
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperOtherProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "SLUICE_HELPER_NODE="+n.Addr(), "SLUICE_HELPER_CAP="+capHex,
		fmt.Sprintf("SLUICE_HELPER_REGION=%d", rA.Export.Region), fmt.Sprintf("SLUICE_HELPER_SLOT=%d", rA.Export.List[0].Slot),
		fmt.Sprintf("SLUICE_HELPER_GEN=%d", rA.Export.List[0].Gen), fmt.Sprintf("SLUICE_HELPER_VERSION=%d", rA.Version))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "HELPER OK") {
		t.Fatalf("the other process: %v\n%s", err, out)
	}
	poolB.Put(pcB)
	e.pool.Put(pcA)
}

// TestHelperOtherProcess is the other process of
// TestSharedMemoryClientsGetOwnCaches (run by it, skipped otherwise).
func TestHelperOtherProcess(t *testing.T) {
	addr := os.Getenv("SLUICE_HELPER_NODE")
	if addr == "" {
		t.Skip("run by TestSharedMemoryClientsGetOwnCaches")
	}
	num := func(k string) uint64 {
		v, err := strconv.ParseUint(os.Getenv(k), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	cp, err := hex.DecodeString(os.Getenv("SLUICE_HELPER_CAP"))
	if err != nil {
		t.Fatal(err)
	}
	ep, err := fabric.NewEndpoint(fabric.Options{Fabric: fabric.FabricShm})
	if err != nil {
		t.Fatal(err)
	}
	pool := fabric.NewPool(ep, 4)
	defer func() { pool.Close(); ep.Close() }()
	pc, r := shmRead(t, pool, addr, 61, cp)
	if r.Export.Region == num("SLUICE_HELPER_REGION") {
		t.Fatal("another process showing the client's capability was given its cache")
	}
	theirs := wire.Reply{Version: num("SLUICE_HELPER_VERSION"), Export: wire.Export{Region: num("SLUICE_HELPER_REGION"), Block: 4096,
		List: []wire.ExportRef{{Slot: uint32(num("SLUICE_HELPER_SLOT")), Gen: num("SLUICE_HELPER_GEN")}}}}
	var re *fabric.RemoteError
	if err := optimisticSlot(pc, 61, theirs, nil); !errors.As(err, &re) {
		t.Fatalf("reading the other process's cache: %v, want a refusal", err)
	}
	if err := pc.Read(context.Background(), theirs.Export.Region, 0, make([]byte, 64)); err == nil {
		t.Fatal("a plain READ of the other process's cache was served")
	}
	fmt.Println("HELPER OK")
}

// shmRead sends a 4 KiB read of chunk under cp to the node at addr and
// returns the connection and the reply, its references detached.
func shmRead(t *testing.T, pool *fabric.Pool, addr string, chunk ids.ChunkID, cp []byte) (*fabric.PeerConn, wire.Reply) {
	t.Helper()
	hdr, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: chunk, Off: 0, Len: 4096, Cap: cp})
	if err != nil {
		t.Fatal(err)
	}
	pc, err := pool.Get(context.Background(), addr)
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
		if err != nil || r.Status != wire.StatusOK {
			t.Fatalf("read of chunk %v: %v %v", chunk, err, r.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reply")
	}
	return pc, r
}

// optimisticSlot reads the first reference of r optimistically and checks
// the block against want (if given).
func optimisticSlot(pc *fabric.PeerConn, chunk ids.ChunkID, r wire.Reply, want []byte) error {
	const eb = 4096
	if len(r.Export.List) == 0 {
		return errors.New("no references")
	}
	x := r.Export.List[0]
	ref := expcache.Ref{Slot: x.Slot, Gen: x.Gen, Chunk: chunk, Block: 0, Version: r.Version, Len: eb}
	slot := make([]byte, expcache.HeaderSize+eb)
	gen, err := pc.ReadOptimistic(context.Background(), r.Export.Region, uint64(ref.Off(eb)), slot, uint64(ref.GenOff(eb)), nil)
	if err != nil {
		return err
	}
	got, err := expcache.Check(ref, slot, gen, eb)
	if err == nil && want != nil && !bytes.Equal(got, want) {
		return errors.New("the cached bytes are not the chunk's")
	}
	return err
}
