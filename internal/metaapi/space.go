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

// Allocated is the bytes of a file's data that are stored, per copy:
// the file's bytes in chunks that exist (st_blocks, NFS "used"). A hole
// spanning whole chunks takes nothing; a chunk that exists counts whole
// up to the file's end, however little of it was written (meta does not
// know the nodes' allocation); replicas and parity are not counted.
// Other types, and files not Counted, report their size.
func (a *Attr) Allocated() int64 {
	if a.Type != TypeFile || !a.Counted || a.ChunkSize <= 0 {
		return max(a.Size, 0)
	}
	return max(min(a.Size, a.Chunks*a.ChunkSize), 0)
}
