package metaapi

import (
	"fmt"
	"math"
)

// SpaceTotals is the cluster's space: each file system holding nodes
// that are up counted once. Capacity is what they can still hold plus
// what Sluice takes on them (Used); Free is what they can still hold
// plus Reclaimable, the deleted chunk files nodes keep for reuse and
// give back when space runs short (so counted as free). Disks is the
// number of file systems.
type SpaceTotals struct {
	Capacity    int64 `json:"capacity"`
	Used        int64 `json:"used"`
	Reclaimable int64 `json:"reclaimable"`
	Free        int64 `json:"free"`
	Disks       int   `json:"disks"`
}

// MaxDiskID bounds NodeInfo.Disk.
const MaxDiskID = 64

// ValidDiskID checks a file system name from the network.
func ValidDiskID(d string) error {
	if len(d) > MaxDiskID {
		return Errorf(EINVAL, "file system id of %d bytes, at most %d", len(d), MaxDiskID)
	}
	for _, c := range []byte(d) {
		if c <= ' ' || c >= 0x7f {
			return Errorf(EINVAL, "file system id %q: printable ASCII only", d)
		}
	}
	return nil
}

// Totals adds up the space of the nodes that are up. Nodes naming the
// same Disk share one file system: its room (free space less the
// nodes' reclaimable files) counts once, the largest any of them
// reports, and the space each node's store takes adds up. A node naming
// no Disk has a file system of its own. The largest rather than the
// freshest report: nodes learn each other's Disk from the cluster map,
// and one naming another's file system with no room must not take that
// room away (sharers' reports differ only by what was written between
// their heartbeats). Sums stop at the largest int64 rather than wrap:
// a node may report any number.
func Totals(nodes []NodeInfo) SpaceTotals {
	rooms := map[string]int64{}
	var t SpaceTotals
	for _, n := range nodes {
		if n.State != NodeUp {
			continue
		}
		used, recl := max(n.Used, 0), min(max(n.Reclaimable, 0), max(n.Used, 0))
		room := max(n.Free-recl, 0)
		t.Used = addCapped(t.Used, used)
		t.Reclaimable = addCapped(t.Reclaimable, recl)
		key := n.Disk
		if key == "" {
			key = fmt.Sprintf("node %d", n.ID) // not a valid Disk: has a space
		}
		if r, ok := rooms[key]; !ok || room > r {
			rooms[key] = room
		}
	}
	for _, r := range rooms {
		t.Capacity = addCapped(t.Capacity, r)
		t.Free = addCapped(t.Free, r)
	}
	t.Capacity = addCapped(t.Capacity, t.Used)
	t.Free = addCapped(t.Free, t.Reclaimable)
	t.Disks = len(rooms)
	return t
}

// addCapped adds b >= 0 to a >= 0, stopping at the largest int64.
func addCapped(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

// Allocated is the bytes of a file's data that are stored, per copy
// (st_blocks, NFS "used"): replicas and parity are not counted. Meta
// knows which chunks exist (Chunks, ChunkEnd), not what the nodes
// allocated inside them, so a hole spanning whole chunks takes nothing;
// the last chunk counts from its start to the file's end, so a write
// past a hole reports what it added from the chunk's start; every other
// chunk counts whole, however little of it was written. If the last
// chunk lies beyond the file's end (a write not committed yet) or is not
// known (ChunkEnd 0: chunks made before it was kept), each chunk counts
// whole up to the file's end. An erasure-coded file's chunk is a stripe
// group and its ChunkSize the group's data bytes, so the same counts
// data, not parity. Never more than the size nor negative. Other types,
// and files not Counted, report their size.
func (a *Attr) Allocated() int64 {
	size, cs := max(a.Size, 0), a.ChunkSize
	if a.Type != TypeFile || !a.Counted || cs <= 0 {
		return size
	}
	n := max(a.Chunks, 0)
	if n == 0 || size == 0 {
		return 0
	}
	whole := size // n chunks of cs bytes fill the size
	if n <= size/cs {
		whole = n * cs
	}
	last := a.ChunkEnd - 1
	if last < 0 || last > (size-1)/cs {
		return whole
	}
	// The other chunks lie below the last one: at most last of them.
	return min(whole, (min(n, last+1)-1)*cs+min(cs, size-last*cs))
}
