package policy_test

import (
	"context"
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

// BenchmarkRead4K is seed 004's Table 7 on one machine: a 4 KiB read of
// a block the node holds, by a request answered inline (the data in the
// reply message), by a request whose data the node places in the
// client's region (direct), and optimistically — two one-sided reads of
// the node's exported cache (the slot, then its generation), checked,
// with no request for the node to serve.
func BenchmarkRead4K(b *testing.B) {
	for _, fm := range []fabric.Fabric{fabric.FabricTCP, fabric.FabricShm} {
		b.Run(string(fm), func(b *testing.B) { benchRead4K(b, fm) })
	}
}

func benchRead4K(b *testing.B, fm fabric.Fabric) {
	const eb = 4096
	e := newExportEnv(b, 1<<20, fm, 4)
	c := e.c
	ep := e.pool.Endpoint()
	n := c.Nodes[0]
	const chunk = ids.ChunkID(61)
	capRW := e.mint(chunk, capability.Write|capability.Read, time.Now().Add(time.Hour), n)
	data := make([]byte, 64<<10)
	if r := e.write(b, wire.WriteHeader{Strategy: plan.Ring, Chunk: chunk, Len: uint64(len(data)), Cap: capRW}, []*node.Node{n}, data); r.Status != wire.StatusOK {
		b.Fatal(r.Err())
	}
	buf := make([]byte, 64<<10)
	region := ep.Register(buf, fabric.RemoteWrite)
	pc, err := e.pool.Get(context.Background(), n.Addr())
	if err != nil {
		b.Fatal(err)
	}
	request := func(key uint64) wire.Reply {
		hdr, _ := wire.AppendRead(nil, &wire.ReadHeader{Chunk: chunk, Off: 16384, Len: eb, RegionKey: key, Cap: capRW})
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		if err := pc.Send(id, hdr); err != nil {
			b.Fatal(err)
		}
		var r wire.Reply
		first := true
		for p := range ch { // the reply, then (inline) the data; closed after the last
			if first {
				if err := wire.ParseReply(p.Data, &r); err != nil {
					b.Fatal(err)
				}
				r.Export.Detach()
				first = false
			}
			p.Release()
		}
		return r
	}
	b.Run("inline", func(b *testing.B) {
		for b.Loop() {
			request(0)
		}
	})
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			request(region.Key())
		}
	})
	r := request(region.Key())
	x := r.Export
	ref := expcache.Ref{Slot: x.List[0].Slot, Gen: x.List[0].Gen, Chunk: chunk, Block: x.First, Version: r.Version, Len: eb}
	slot := make([]byte, expcache.HeaderSize+eb)
	b.Run("optimistic", func(b *testing.B) {
		for b.Loop() {
			gen, err := readSlot(pc, x.Region, x.List[0].Key, ref, slot)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := expcache.Check(ref, slot, gen, eb); err != nil {
				b.Fatal(err)
			}
		}
	})
}
