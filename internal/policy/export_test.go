package policy_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestReadRepliesCarryExportRefs: with an exported cache, a small read's
// reply carries references to its blocks, and one-sided reads through
// them (the slot, then its generation) give the chunk's bytes with no
// request served; once the chunk is written again, the references fail
// (the store's change drops the chunk's blocks).
func TestReadRepliesCarryExportRefs(t *testing.T) {
	const eb = 4096
	e := newExportEnv(t, 1<<20, fabric.FabricTCP, 4)
	c := e.c
	ep := e.pool.Endpoint()
	n := c.Nodes[0]
	one := []*node.Node{n}
	const chunk = ids.ChunkID(51)
	capRW := e.mint(chunk, capability.Write|capability.Read, time.Now().Add(time.Minute), one...)
	data := make([]byte, 40000)
	for i := range data {
		data[i] = byte(i*13 + i/4096)
	}
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Len: uint64(len(data)), Cap: capRW}, one, data); r.Status != wire.StatusOK {
		t.Fatalf("write: %v", r.Err())
	}

	buf := make([]byte, 64<<10)
	region := ep.Register(buf, fabric.RemoteWrite)
	defer ep.Deregister(region)
	read := func(off, size uint64) wire.Reply {
		hdr, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: chunk, Off: off, Len: size, RegionKey: region.Key(), Cap: capRW})
		if err != nil {
			t.Fatal(err)
		}
		pc, err := e.pool.Get(context.Background(), n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		if err := pc.Send(id, hdr); err != nil {
			t.Fatal(err)
		}
		r := e.reply(t, pc, ch)
		if r.Status != wire.StatusOK {
			t.Fatalf("read: %v", r.Err())
		}
		return r
	}
	// The store's blocks are 16 KiB: a read of 100 bytes at 5000 serves
	// [0, 16384), four export blocks.
	rep := read(5000, 100)
	x := rep.Export
	if x.Block != eb || x.First != 0 || x.N() != 4 || x.Epoch == 0 || x.Region == 0 {
		t.Fatalf("export references %+v (%d)", x, x.N())
	}
	refs := make([]wire.ExportRef, x.N())
	for i := range refs {
		refs[i] = x.Ref(i)
	}
	optimistic := func(i int) ([]byte, error) {
		r := refs[i]
		ref := expcache.Ref{Slot: r.Slot, Gen: r.Gen, Chunk: chunk, Block: x.First + uint64(i), Version: rep.Version, Len: eb}
		pc, err := e.pool.Get(context.Background(), n.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer e.pool.Put(pc)
		slot := make([]byte, expcache.HeaderSize+eb)
		if err := pc.Read(context.Background(), x.Region, uint64(ref.Off(eb)), slot); err != nil {
			t.Fatal(err)
		}
		var g [8]byte
		if err := pc.Read(context.Background(), x.Region, uint64(ref.GenOff(eb)), g[:]); err != nil {
			t.Fatal(err)
		}
		return expcache.Check(ref, slot, binary.LittleEndian.Uint64(g[:]), eb)
	}
	for i := range refs {
		got, err := optimistic(i)
		if err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
		if want := data[i*eb : (i+1)*eb]; !bytes.Equal(got, want) {
			t.Fatalf("block %d: the exported bytes are not the chunk's", i)
		}
	}
	// A read at the chunk's end: its last export block is short.
	tail := read(39000, 100)
	if tail.Export.N() == 0 {
		t.Fatal("no references for the chunk's last blocks")
	}
	// Written again: the old references fail.
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Off: 0, Len: 10, Cap: capRW}, one, bytes.Repeat([]byte{1}, 10)); r.Status != wire.StatusOK {
		t.Fatalf("overwrite: %v", r.Err())
	}
	for i := range refs {
		if _, err := optimistic(i); !errors.Is(err, expcache.ErrStale) {
			t.Fatalf("block %d after an overwrite: %v, want ErrStale", i, err)
		}
	}
}

// newExportEnv starts one node with an exported cache of cacheBytes in
// blocks of 4 KiB (serving TCP and shared memory) and a client endpoint
// reaching it by fm, with a pool of poolSize connections.
func newExportEnv(tb testing.TB, cacheBytes int64, fm fabric.Fabric, poolSize int) *env {
	tb.Helper()
	dir := tb.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, _ = os.MkdirTemp("/dev/shm", "sluice-policy-")
		tb.Cleanup(func() { os.RemoveAll(dir) })
	}
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: dir, Nodes: 1, MetaListen: "127.0.0.1:0", ExportCache: cacheBytes, ExportBlock: 4096,
		Fabric: fabric.Options{Fabric: fabric.FabricAuto}})
	if err != nil {
		tb.Fatal(err)
	}
	ep, err := fabric.NewEndpoint(fabric.Options{Fabric: fm})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ep.Close(); c.Close() })
	return &env{c: c, keys: c.Meta.Keyring(), pool: fabric.NewPool(ep, poolSize)}
}
