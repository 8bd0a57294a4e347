package metaapi

import (
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

func TestTotals(t *testing.T) {
	const G = 1 << 30
	// node: free is what it reports it can take (its recycled files
	// included), used what its store takes (them included).
	node := func(id ids.NodeID, disk string, free, used, recl, heard int64) NodeInfo {
		return NodeInfo{ID: id, State: NodeUp, Disk: disk, Free: free, Used: used, Reclaimable: recl,
			Capacity: free - recl + used, LastHeartbeat: heard}
	}
	down := func(n NodeInfo) NodeInfo { n.State = NodeDown; return n }
	for _, tc := range []struct {
		name  string
		nodes []NodeInfo
		want  SpaceTotals
	}{
		{"none", nil, SpaceTotals{}},
		{"three nodes on one disk count it once",
			[]NodeInfo{node(1, "d", 10*G, 1*G, 0, 5), node(2, "d", 10*G, 2*G, 0, 5), node(3, "d", 10*G, 3*G, 0, 5)},
			SpaceTotals{Capacity: 16 * G, Used: 6 * G, Free: 10 * G, Disks: 1}},
		{"two disks",
			[]NodeInfo{node(1, "d", 10*G, 1*G, 0, 5), node(2, "d", 10*G, 2*G, 0, 5), node(3, "e", 4*G, 1*G, 0, 5)},
			SpaceTotals{Capacity: 18 * G, Used: 4 * G, Free: 14 * G, Disks: 2}},
		{"no disk named: each its own",
			[]NodeInfo{node(1, "", 10*G, 1*G, 0, 5), node(2, "", 10*G, 1*G, 0, 5)},
			SpaceTotals{Capacity: 22 * G, Used: 2 * G, Free: 20 * G, Disks: 2}},
		{"reclaimable is used and free; the shared room counts once",
			// Free of each node counts its own recycled files.
			[]NodeInfo{node(1, "d", 10*G+1*G, 3*G, 1*G, 5), node(2, "d", 10*G+2*G, 4*G, 2*G, 5)},
			SpaceTotals{Capacity: 17 * G, Used: 7 * G, Reclaimable: 3 * G, Free: 13 * G, Disks: 1}},
		{"the largest report of a shared disk's room counts (see TestTotalsDiskSpoofCannotHideAnotherNodesRoom)",
			[]NodeInfo{node(1, "d", 10*G, 1*G, 0, 5), node(2, "d", 8*G, 1*G, 0, 9), node(3, "d", 12*G, 1*G, 0, 7)},
			SpaceTotals{Capacity: 15 * G, Used: 3 * G, Free: 12 * G, Disks: 1}},
		{"nodes that are down do not count",
			[]NodeInfo{node(1, "d", 10*G, 1*G, 0, 5), down(node(2, "e", 10*G, 1*G, 0, 5))},
			SpaceTotals{Capacity: 11 * G, Used: 1 * G, Free: 10 * G, Disks: 1}},
		{"hostile numbers are clamped",
			[]NodeInfo{node(1, "d", -5, -7, 9, 5), node(2, "e", G, G, 2*G, 5)},
			SpaceTotals{Capacity: G, Used: G, Reclaimable: G, Free: G, Disks: 2}},
	} {
		if got := Totals(tc.nodes); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
		c, f := StatusResp{Nodes: tc.nodes}.Space()
		if c != tc.want.Capacity || f != tc.want.Free {
			t.Errorf("%s: Space() = %d, %d", tc.name, c, f)
		}
	}
}

func TestValidDiskID(t *testing.T) {
	for d, ok := range map[string]bool{"": true, "0a1b2c": true, "has space": false, "\x00": false, string(make([]byte, 65)): false} {
		if err := ValidDiskID(d); (err == nil) != ok {
			t.Errorf("ValidDiskID(%q) = %v", d, err)
		}
	}
}

// TestAllocated: what st_blocks reports, from a file's chunk count and
// the index of its last chunk.
func TestAllocated(t *testing.T) {
	const cs = 64 << 20
	const maxI = int64(^uint64(0) >> 1)
	file := func(size, chunks, end int64) Attr {
		return Attr{Type: TypeFile, Size: size, ChunkSize: cs, Chunks: chunks, ChunkEnd: end, Counted: true}
	}
	// Erasure-coded: a chunk is a stripe group of ChunkSize data bytes
	// (48 MiB for 3+2 with 64 KiB cells), what its 5 units hold besides
	// is parity.
	ec := ErasureCode{Data: 3, Parity: 2, Cell: DefaultECCell}
	ecs := ec.ChunkSize()
	ecFile := func(size, chunks, end int64) Attr {
		return Attr{Type: TypeFile, Size: size, ChunkSize: ecs, Chunks: chunks, ChunkEnd: end, Counted: true,
			Policy: &Policy{EC: &ec}}
	}
	for _, tc := range []struct {
		name string
		a    Attr
		want int64
	}{
		{"4 KiB written past a 1 GiB hole", file(1<<30+4096, 1, 17), 4096},
		{"4 KiB written at the end of a 1 GiB hole: the last chunk from its start", file(1<<30, 1, 16), cs},
		{"last chunk not known: whole chunks", file(1<<30+4096, 1, 0), cs},
		{"dense", file(3*cs-5, 3, 3), 3*cs - 5},
		{"dense, chunk-aligned", file(3*cs, 3, 3), 3 * cs},
		{"chunks 0 and 5: one whole, the last to the end", file(5*cs+10, 2, 6), cs + 10},
		{"last chunk past the end (not committed yet): whole chunks", file(cs+100, 2, 4), cs + 100},
		{"last chunk past the end, few chunks", file(10*cs, 2, 12), 2 * cs},
		{"a hole only", file(1<<30, 0, 0), 0},
		{"empty with a chunk (being written)", file(0, 1, 1), 0},
		{"more chunks than the last index allows: no more than below it", file(10*cs, 5, 2), 2 * cs},
		{"huge count", file(1<<50, maxI, 0), 1 << 50},
		{"huge count and index", file(1<<50, maxI, maxI), 1 << 50},
		{"negative size", file(-1, 1, 1), 0},
		{"negative count", file(cs, -3, 1), 0},
		{"not counted: its size", Attr{Type: TypeFile, Size: 1 << 30, ChunkSize: cs, Chunks: 2, ChunkEnd: 3}, 1 << 30},
		{"no chunk size: its size", Attr{Type: TypeFile, Size: 4096, Counted: true}, 4096},
		{"a directory: its size", Attr{Type: TypeDir, Size: 4096}, 4096},
		{"EC: 8 KiB past a hole of 10 stripe groups", ecFile(10*ecs+8192, 1, 11), 8192},
		{"EC: groups 0 and 2", ecFile(2*ecs+100<<10, 2, 3), ecs + 100<<10},
		{"EC: dense", ecFile(3*ecs-1, 3, 3), 3*ecs - 1},
	} {
		if got := tc.a.Allocated(); got != tc.want {
			t.Errorf("%s (%+v): Allocated %d, want %d", tc.name, tc.a, got, tc.want)
		}
	}
	if ecs != 48<<20 {
		t.Errorf("3+2 with %d-byte cells: stripe groups of %d data bytes, want 48 MiB", ec.Cell, ecs)
	}
}

// A node's heartbeat is hostile input: whatever numbers one node reports,
// the totals must not wrap around (df would show a negative or absurd
// size for the whole cluster).
func TestTotalsHugeReportsDoNotOverflow(t *testing.T) {
	const G = 1 << 30
	const maxI = int64(^uint64(0) >> 1)
	honest := NodeInfo{ID: 1, State: NodeUp, Disk: "d", Free: 10 * G, Used: G, Capacity: 11 * G, LastHeartbeat: 5}
	for _, tc := range []struct {
		name  string
		nodes []NodeInfo
	}{
		{"one node: huge free and used", []NodeInfo{honest,
			{ID: 2, State: NodeUp, Disk: "e", Free: maxI, Used: maxI, Capacity: maxI, LastHeartbeat: 5}}},
		{"two nodes: huge used", []NodeInfo{honest,
			{ID: 2, State: NodeUp, Disk: "e", Free: 0, Used: maxI/2 + 1, LastHeartbeat: 5},
			{ID: 3, State: NodeUp, Disk: "f", Free: 0, Used: maxI/2 + 1, LastHeartbeat: 5}}},
		{"two disks: huge free", []NodeInfo{honest,
			{ID: 2, State: NodeUp, Disk: "e", Free: maxI, LastHeartbeat: 5},
			{ID: 3, State: NodeUp, Disk: "f", Free: maxI, LastHeartbeat: 5}}},
		{"huge reclaimable", []NodeInfo{honest,
			{ID: 2, State: NodeUp, Disk: "e", Free: maxI, Used: maxI, Reclaimable: maxI, LastHeartbeat: 5},
			{ID: 3, State: NodeUp, Disk: "f", Free: maxI, Used: maxI, Reclaimable: maxI, LastHeartbeat: 5}}},
	} {
		got := Totals(tc.nodes)
		if got.Capacity < 11*G || got.Used < G || got.Free < 10*G || got.Reclaimable < 0 || got.Free > got.Capacity {
			t.Errorf("%s: totals wrapped around: %+v", tc.name, got)
		}
	}
}

// Nodes learn every node's Disk from their heartbeats' cluster map. One
// naming another's file system (with a fresher report of no room) must
// not take that file system's room out of the cluster's capacity: it may
// change only what its own record adds.
func TestTotalsDiskSpoofCannotHideAnotherNodesRoom(t *testing.T) {
	const G = 1 << 30
	victim := NodeInfo{ID: 1, State: NodeUp, Disk: "d", Free: 100 * G, Used: G, Capacity: 101 * G, LastHeartbeat: 5}
	alone := Totals([]NodeInfo{victim})
	spoof := NodeInfo{ID: 2, State: NodeUp, Disk: victim.Disk, Free: 0, Used: 0, Capacity: 0, LastHeartbeat: 6}
	got := Totals([]NodeInfo{victim, spoof})
	if got.Capacity < alone.Capacity || got.Free < alone.Free {
		t.Errorf("node 2 naming node 1's disk took its room away: alone %+v, with node 2 %+v", alone, got)
	}
}
