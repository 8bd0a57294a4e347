package meta

import (
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
)

// TestCorruptCopiesCountedBlockByBlock: redundancy counts what each byte
// has intact. Three copies each with a different bad block are reduced
// (every byte still has two), not lost; the same block bad everywhere is
// unavailable; a corrupt copy whose bad blocks nobody said counts for
// nothing.
func TestCorruptCopiesCountedBlockByBlock(t *testing.T) {
	for _, c := range []struct {
		name string
		bad  [3]extent.List // per member; nil: intact
		said [3]bool        // whether the report lists the bad bytes
		want metaapi.RedundancyCounts
	}{
		{"intact", [3]extent.List{}, [3]bool{}, metaapi.RedundancyCounts{Full: 1}},
		{"one copy, one block", [3]extent.List{{{Off: 0, Len: 16384}}}, [3]bool{true}, metaapi.RedundancyCounts{Reduced: 1}},
		{"each copy a different block", [3]extent.List{{{Off: 0, Len: 16384}}, {{Off: 294912, Len: 16384}}, {{Off: 688128, Len: 16384}}},
			[3]bool{true, true, true}, metaapi.RedundancyCounts{Reduced: 1}},
		{"two copies the same block", [3]extent.List{{{Off: 0, Len: 16384}}, {{Off: 0, Len: 16384}}}, [3]bool{true, true},
			metaapi.RedundancyCounts{Critical: 1}},
		{"the same block everywhere", [3]extent.List{{{Off: 0, Len: 16384}}, {{Off: 0, Len: 16384}}, {{Off: 8192, Len: 16384}}},
			[3]bool{true, true, true}, metaapi.RedundancyCounts{Unavailable: 1}},
		{"unsaid blocks", [3]extent.List{{{Off: 0, Len: 16384}}, {{Off: 0, Len: 1}}}, [3]bool{false, true},
			metaapi.RedundancyCounts{Critical: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			nodes := f.addNodes(3)
			f.tree("/a")
			f.setPolicy("/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}})
			f.tree("/b")
			l := f.layout("/b", 0, 1, true).Chunks[0]
			var reps []metaapi.CorruptCopy
			for i, bad := range c.bad {
				if bad == nil {
					continue
				}
				r := metaapi.CorruptCopy{Chunk: l.Chunk, Version: 1}
				if c.said[i] {
					r.Bad = bad
				}
				reps = append(reps, r)
				// Each node reports its own copy with its heartbeat.
				if _, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: l.Replicas[i].Node, Capacity: 1 << 40, Free: 1 << 40, Corrupt: reps[len(reps)-1:]}); err != nil {
					t.Fatal(err)
				}
			}
			for _, n := range nodes {
				f.heartbeat(n)
			}
			// Counted at once (the reports), and the same once recorded.
			for range 2 {
				f.s.scanForRepair()
				tally, _ := f.s.repairStatus()
				if tally.Replicated != c.want {
					t.Fatalf("counted %+v, want %+v", tally.Replicated, c.want)
				}
			}
			if len(reps) > 0 && f.s.repairs.jobs[chunkRef{f.ino("/b"), 0}] == nil {
				t.Fatal("a chunk with corrupt copies was not queued for healing")
			}
		})
	}
}

// TestReportCorruptNeedsTheReadCapability: a client's report is taken
// only with a read capability minted for that client, for that chunk,
// naming the node; malformed reports are refused.
func TestReportCorruptNeedsTheReadCapability(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.setPolicy("/", metaapi.Policy{Replicas: 2, Strategy: plan.Plan{Strategy: plan.Ring}})
	f.tree("/a", "/b")
	la := f.layout("/a", 0, 1, true).Chunks[0]
	lb := f.layout("/b", 0, 1, true).Chunks[0]
	var other ids.NodeID
	for id := range f.s.nodes {
		if id != la.Replicas[0].Node && id != la.Replicas[1].Node {
			other = id
		}
	}
	good := metaapi.CorruptCopy{Chunk: la.Chunk, Node: la.Replicas[1].Node, Version: 1, Bad: extent.List{{Off: 16384, Len: 16384}}}
	forged := append([]byte(nil), la.Cap...)
	forged[len(forged)-1] ^= 1
	for _, c := range []struct {
		name   string
		client ids.ClientID
		req    metaapi.ReportCorruptReq
		code   metaapi.Code
	}{
		{"another client's capability", 8, metaapi.ReportCorruptReq{Cap: la.Cap, Copy: good}, metaapi.EACCES},
		{"a forged capability", 7, metaapi.ReportCorruptReq{Cap: forged, Copy: good}, metaapi.EACCES},
		{"another chunk's capability", 7, metaapi.ReportCorruptReq{Cap: lb.Cap, Copy: good}, metaapi.EINVAL},
		{"a node not a member", 7, metaapi.ReportCorruptReq{Cap: la.Cap, Copy: metaapi.CorruptCopy{Chunk: la.Chunk, Node: other}}, metaapi.EINVAL},
		{"overlapping extents", 7, metaapi.ReportCorruptReq{Cap: la.Cap, Copy: metaapi.CorruptCopy{Chunk: la.Chunk, Node: good.Node,
			Bad: extent.List{{Off: 0, Len: 10}, {Off: 5, Len: 10}}}}, metaapi.EINVAL},
	} {
		if err := f.s.ReportCorrupt(c.client, c.req); !metaapi.IsCode(err, c.code) {
			t.Errorf("%s: %v, want %s", c.name, err, c.code)
		}
	}
	if len(f.s.repairs.corrupt) != 0 {
		t.Fatalf("refused reports were kept: %v", f.s.repairs.corrupt)
	}
	if err := f.s.ReportCorrupt(7, metaapi.ReportCorruptReq{Cap: la.Cap, Copy: good}); err != nil {
		t.Fatal(err)
	}
	f.s.scanForRepair()
	var rec chunkRec
	if err := f.s.read(func(v view) error {
		_, err := getJSON(v.r, chunkKey(f.ino("/a"), 0), &rec)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(rec.Corrupt) != 1 || rec.Corrupt[0] != good.Node || len(rec.Bad[good.Node]) != 1 {
		t.Fatalf("the report was not recorded: %+v", rec)
	}
}

// TestClientReportsRateLimited: a client cannot have the nodes re-read
// copies on its say-so without bound: past a burst its reports are
// refused for a while (another client's are not).
func TestClientReportsRateLimited(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.setPolicy("/", metaapi.Policy{Replicas: 2, Strategy: plan.Plan{Strategy: plan.Ring}})
	f.tree("/a")
	l := f.layout("/a", 0, 1, true).Chunks[0]
	req := metaapi.ReportCorruptReq{Cap: l.Cap, Copy: metaapi.CorruptCopy{Chunk: l.Chunk, Node: l.Replicas[0].Node}}
	refused := 0
	for range clientReportBurst + 50 {
		if err := f.s.ReportCorrupt(7, req); metaapi.IsCode(err, metaapi.EAGAIN) {
			refused++
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if refused != 50 {
		t.Fatalf("%d of %d reports in one instant refused, want 50", refused, clientReportBurst+50)
	}
	f.clk.Advance(time.Second)
	if err := f.s.ReportCorrupt(7, req); err != nil {
		t.Fatalf("a report a second later: %v", err)
	}
}
