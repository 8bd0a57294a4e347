package odafs

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/cockroachdb/datadriven"
	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/ids"
)

// TestReadPath runs testdata/readpath. Commands, on one client made by
// the first "client entries=N cache=BYTES inline=BYTES":
//
//	learn chunk=C block=B node=N epoch=E version=V   a read reply's reference
//	keep chunk=C block=B version=V bytes=N             a block read, cached
//	plan chunk=C block=B n=BYTES version=V members=N,N how a read goes
//	forget chunk=C block=B / forget-node node=N
//	len                                                 references and blocks held
//	refs                                                the directory, most recent first
func TestReadPath(t *testing.T) {
	var c *Client
	datadriven.RunTest(t, "testdata/readpath", func(t *testing.T, d *datadriven.TestData) string {
		var chunk, block, node, epoch, version, n uint64
		d.MaybeScanArgs(t, "chunk", &chunk)
		d.MaybeScanArgs(t, "block", &block)
		d.MaybeScanArgs(t, "node", &node)
		d.MaybeScanArgs(t, "epoch", &epoch)
		d.MaybeScanArgs(t, "version", &version)
		id := BlockID{ids.ChunkID(chunk), block}
		switch d.Cmd {
		case "client":
			var o Options
			var cache int64
			d.MaybeScanArgs(t, "entries", &o.Entries)
			d.MaybeScanArgs(t, "cache", &cache)
			d.MaybeScanArgs(t, "inline", &o.Inline)
			o.CacheBytes = cache
			c = New(o)
			return fmt.Sprintf("%+v\n", c.Options())
		case "learn":
			c.Learn(id, Ref{Node: ids.NodeID(node), Epoch: epoch, Region: 1,
				Ref: expcache.Ref{Chunk: id.Chunk, Block: block, Version: version, Gen: 2}})
		case "keep":
			d.ScanArgs(t, "bytes", &n)
			c.Keep(id, version, make([]byte, n))
		case "plan":
			var members string
			d.ScanArgs(t, "n", &n)
			d.ScanArgs(t, "members", &members)
			var ms []ids.NodeID
			for _, m := range strings.Split(members, ",") {
				v, err := strconv.ParseUint(m, 10, 32)
				if err != nil {
					d.Fatalf(t, "members: %v", err)
				}
				ms = append(ms, ids.NodeID(v))
			}
			p, data, r := c.Plan(id, int(n), version, ms)
			switch p {
			case Hit:
				return fmt.Sprintf("%s %d bytes\n", p, len(data))
			case Optimistic:
				return fmt.Sprintf("%s via node %d version %d\n", p, r.Node, r.Version)
			}
			return p.String() + "\n"
		case "forget":
			c.Forget(id)
		case "forget-node":
			c.ForgetNode(ids.NodeID(node))
		case "refs": // the directory, most recently used first
			var b strings.Builder
			c.mu.Lock()
			for e := c.refLR.Front(); e != nil; e = e.Next() {
				fmt.Fprintf(&b, "%v/%d ", e.Value.(*refEntry).id.Chunk, e.Value.(*refEntry).id.Block)
			}
			c.mu.Unlock()
			return strings.TrimSpace(b.String()) + "\n"
		case "len":
		default:
			d.Fatalf(t, "unknown command %s", d.Cmd)
		}
		refs, blocks := c.Len()
		return fmt.Sprintf("refs=%d blocks=%d\n", refs, blocks)
	})
}

// TestAccept: an optimistic read's copy is used only if the reference is
// of the node's current epoch, at least the layout's version, on a node
// that still holds the chunk, for the block asked, and expcache.Check
// passes; a refusal drops the reference.
func TestAccept(t *testing.T) {
	const bs = 4096
	w := make([]uint64, 2*(expcache.HeaderSize+bs)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
	ec, err := expcache.New(mem, bs, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("odafs"), 500)
	er, _ := ec.Fill(5, 1, 7, want)
	id := BlockID{5, 1}
	ref := Ref{Node: 3, Epoch: 9, Region: 1, Ref: er}
	off := er.Off(bs)
	slot := bytes.Clone(mem[off : off+expcache.HeaderSize+bs])
	members := []ids.NodeID{2, 3}
	cases := []struct {
		name    string
		id      BlockID
		epoch   uint64
		version uint64
		members []ids.NodeID
		gen     uint64
		ok      bool
	}{
		{"good", id, 9, 7, members, er.Gen, true},
		{"older layout version is fine", id, 9, 6, members, er.Gen, true},
		{"node restarted", id, 10, 7, members, er.Gen, false},
		{"layout newer", id, 9, 8, members, er.Gen, false},
		{"node left the chunk", id, 9, 7, []ids.NodeID{2, 4}, er.Gen, false},
		{"another block", BlockID{5, 2}, 9, 7, members, er.Gen, false},
		{"slot changed", id, 9, 7, members, er.Gen + 2, false},
	}
	for _, tc := range cases {
		c := New(Options{BlockSize: bs})
		c.Learn(tc.id, ref)
		data, err := c.Accept(tc.id, ref, slot, tc.gen, tc.epoch, tc.version, tc.members)
		refs, _ := c.Len()
		switch {
		case tc.ok && (err != nil || !bytes.Equal(data, want)):
			t.Errorf("%s: refused: %v", tc.name, err)
		case !tc.ok && err == nil:
			t.Errorf("%s: accepted", tc.name)
		case !tc.ok && !errors.Is(err, expcache.ErrStale):
			t.Errorf("%s: %v, not ErrStale", tc.name, err)
		case !tc.ok && refs != 0:
			t.Errorf("%s: refused, but the reference kept", tc.name)
		}
	}
}
