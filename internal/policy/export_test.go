package policy_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/regionmac"
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
		gen, err := readSlot(pc, x.Region, r.Key, ref, slot)
		if err != nil {
			return nil, err
		}
		return expcache.Check(ref, slot, gen, eb)
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
	// An attacker's reads: another reference's key, a replay, a stale
	// timestamp, a read not of a whole slot, an authenticator of the
	// wrong size — each refused softly, the connection still serving;
	// a plain READ of the region is an access error.
	pc, err := e.pool.Get(context.Background(), n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	slot := make([]byte, expcache.HeaderSize+eb)
	slotOff := func(i int) uint64 { return uint64(refs[i].Slot) * uint64(expcache.HeaderSize+eb) }
	now := time.Now().UnixNano()
	replayed := regionmac.NewAuth(refs[0].Key[:], x.Region, slotOff(0), uint32(len(slot)), refs[0].Gen, now).Append(nil)
	attacks := []struct {
		name string
		off  uint64
		n    int
		auth []byte
	}{
		{"another block's key", slotOff(1), len(slot), regionmac.NewAuth(refs[0].Key[:], x.Region, slotOff(1), uint32(len(slot)), refs[1].Gen, now).Append(nil)},
		{"first use", slotOff(0), len(slot), replayed},
		{"replayed", slotOff(0), len(slot), replayed},
		{"an old timestamp", slotOff(0), len(slot), regionmac.NewAuth(refs[0].Key[:], x.Region, slotOff(0), uint32(len(slot)), refs[0].Gen, now-int64(time.Minute)).Append(nil)},
		{"half a slot", slotOff(0) + 64, eb, regionmac.NewAuth(refs[0].Key[:], x.Region, slotOff(0)+64, uint32(eb), refs[0].Gen, now).Append(nil)},
		{"no authenticator", slotOff(0), len(slot), nil},
	}
	for _, a := range attacks {
		word := a.off - a.off%uint64(expcache.HeaderSize+eb) // the slot's generation
		_, err := pc.ReadOptimistic(context.Background(), x.Region, a.off, slot[:a.n], word, a.auth)
		var re *fabric.RemoteError
		if a.name == "first use" {
			if err != nil {
				t.Fatalf("%s: %v", a.name, err)
			}
			continue
		}
		if !errors.As(err, &re) || pc.Err() != nil {
			t.Fatalf("%s: %v (connection: %v), want a soft refusal", a.name, err, pc.Err())
		}
	}
	if err := pc.Read(context.Background(), x.Region, slotOff(1), slot); err == nil {
		t.Fatal("a plain READ of the exported cache was served")
	}
	pc.Close()
	// A read at the chunk's end: its last export block is short.
	tail := read(39000, 100)
	if tail.Export.N() == 0 {
		t.Fatal("no references for the chunk's last blocks")
	}
	// Written again: the old references fail.
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Off: 0, Len: 10, Cap: capRW}, one, bytes.Repeat([]byte{1}, 10)); r.Status != wire.StatusOK {
		t.Fatalf("overwrite: %v", r.Err())
	}
	// The node refuses them (it serves only the fill a reference names).
	for i := range refs {
		var re *fabric.RemoteError
		if _, err := optimistic(i); !errors.As(err, &re) || !strings.Contains(re.Reason, "stale") {
			t.Fatalf("block %d after an overwrite: %v, want a stale refusal", i, err)
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

// readSlot reads ref's slot of region optimistically, signed with the
// reference's key as a client does, and returns the generation read
// after it.
func readSlot(pc *fabric.PeerConn, region uint64, key [16]byte, ref expcache.Ref, slot []byte) (uint64, error) {
	eb := len(slot) - expcache.HeaderSize
	off := uint64(ref.Off(eb))
	a := regionmac.NewAuth(key[:], region, off, uint32(len(slot)), ref.Gen, time.Now().UnixNano())
	return pc.ReadOptimistic(context.Background(), region, off, slot, uint64(ref.GenOff(eb)), a.Append(nil))
}
