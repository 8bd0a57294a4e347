package metaapi

import (
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// The cluster: storage nodes, their membership and heartbeats, status,
// redundancy and repair.

type NodeState string

const (
	NodeUp   NodeState = "up"
	NodeDown NodeState = "down"
)

type NodeInfo struct {
	ID            ids.NodeID `json:"id"`
	Addr          string     `json:"addr"`
	Domain        string     `json:"domain"`
	State         NodeState  `json:"state"`
	Capacity      int64      `json:"capacity"` // bytes: what its file system can still hold plus Used
	Used          int64      `json:"used"`     // bytes Sluice takes on its file system, Reclaimable included
	Free          int64      `json:"free"`     // bytes it can still take, as last reported (see HeartbeatReq)
	Chunks        int64      `json:"chunks"`
	LastHeartbeat int64      `json:"last_heartbeat"` // unix nanoseconds
	// Draining: `sluice node drain` asked for everything to move off it;
	// it gets no new data. Members is how many chunks and stripe units
	// meta places on it, as of the last scan (-1: not scanned yet).
	Draining bool  `json:"draining,omitempty"`
	Members  int64 `json:"members"`
	// Full: it has no more free space than meta's margin (sluice meta
	// --min-free), counting what meta placed there since its report; it
	// gets no new chunks.
	Full bool `json:"full,omitempty"`
	// Reclaimable: bytes of deleted chunk files kept for reuse (part of
	// Used and of Free). Disk names its file system: nodes sharing one
	// count once in Totals.
	Reclaimable int64  `json:"reclaimable"`
	Disk        string `json:"disk,omitempty"`
	// FSSize is the size of its file system (statfs): what meta's
	// free-space margin is a share of. 0: not reported (an older node).
	FSSize int64 `json:"fs_size,omitempty"`
	// Blocked, for a draining node: its members the last scan found
	// repair cannot move now, by reason.
	Blocked []Blocked `json:"blocked,omitempty"`
}

// Blocked is how many members cannot move, and why.
type Blocked struct {
	Count int64  `json:"count"`
	Why   string `json:"why"`
}

// RemoveNodeReq takes a node out of the cluster for good: one drained
// (or down, with its data repaired elsewhere). Admins only.
type RemoveNodeReq struct {
	Node ids.NodeID `json:"node"`
}

// DrainReq moves all data off a node (or, with Cancel, stops doing so).
// Only root may ask.
type DrainReq struct {
	Node   ids.NodeID `json:"node"`
	Cancel bool       `json:"cancel,omitempty"`
	Who    Who        `json:"who"`
}

// RevokeNodeReq retires a node's identity: meta refuses every
// certificate naming it until it joins again. Admins only.
type RevokeNodeReq struct {
	Node ids.NodeID `json:"node"`
}

type StatusResp struct {
	MetaAddr string     `json:"meta_addr"`
	Epoch    uint64     `json:"epoch"`
	Nodes    []NodeInfo `json:"nodes"`
	Files    int64      `json:"files"`
	Dirs     int64      `json:"dirs"`
	Chunks   int64      `json:"chunks"`
	// Degraded counts erasure-coded stripe groups recorded as degraded
	// (at most MaxDegradedList is counted).
	Degraded int64 `json:"degraded"`
	// Redundancy counts chunks and stripe groups by how many of their
	// members are on live nodes, as of the last scan.
	Redundancy RedundancyTally `json:"redundancy"`
	Repair     RepairStats     `json:"repair"`
	// Totals is the space of the nodes that are up (Totals of Nodes).
	Totals SpaceTotals `json:"space"`
	// Waiting: meta has just started and waits for nodes to report.
	Waiting *NodesReporting `json:"waiting_for_nodes,omitempty"`
	// TempFiles counts puts' temporary files not yet renamed into place
	// (a put under way, or one whose writer died: removed after meta's
	// --temp-grace); TempBytes is what they hold at most.
	TempFiles int64 `json:"temp_files"`
	TempBytes int64 `json:"temp_bytes"`
}

// RedundancyCounts sorts chunks (or stripe groups) by live members:
// Full, all of them; Reduced, fewer but more than the minimum to read
// them (1 replica, K units); Critical, exactly that minimum (one more
// loss loses data); Unavailable, fewer (unreadable until nodes return).
type RedundancyCounts struct {
	Full        int64 `json:"full"`
	Reduced     int64 `json:"reduced"`
	Critical    int64 `json:"critical"`
	Unavailable int64 `json:"unavailable"`
}

// Short counts the chunks below full redundancy.
func (c RedundancyCounts) Short() int64 { return c.Reduced + c.Critical + c.Unavailable }

// Repaired reports whether a scan after since found every chunk and
// stripe group at full redundancy, with nothing left to repair.
func (s StatusResp) Repaired(since time.Time) bool {
	r := s.Redundancy
	return r.ScannedAt > since.UnixNano() && r.Replicated.Short()+r.Striped.Short() == 0 && s.Repair.Pending == 0
}

// Space is the capacity and the free space of the nodes that are up,
// each file system counted once (Totals): what front ends report as the
// file system's size (statfs, FSSTAT).
func (s StatusResp) Space() (capacity, free int64) {
	t := Totals(s.Nodes)
	return t.Capacity, t.Free
}

type RedundancyTally struct {
	Replicated RedundancyCounts `json:"replicated"`
	Striped    RedundancyCounts `json:"striped"`
	ScannedAt  int64            `json:"scanned_at"` // unix ns; 0: no scan yet
}

// Count adds one chunk with live of total members, minimum needed.
func (t *RedundancyTally) Count(striped bool, live, total, minimum int) {
	c := &t.Replicated
	if striped {
		c = &t.Striped
	}
	switch {
	case live >= total:
		c.Full++
	case live > minimum:
		c.Reduced++
	case live == minimum:
		c.Critical++
	default:
		c.Unavailable++
	}
}

// RepairStats describe the repair queue: chunks waiting (Pending, of
// which Running are being reconciled), and since meta started the
// chunks Queued, reconciliations Done, attempts Failed (retried later)
// and Bytes copied or rebuilt. Rate is bytes per second over the last
// minute. The current wave of repairs (since the queue was last empty)
// has WaveDone of WaveDone+Pending chunks done; ETA estimates the rest
// in seconds (-1: unknown).
type RepairStats struct {
	Queued   int64   `json:"queued"`
	Pending  int64   `json:"pending"`
	Running  int64   `json:"running"`
	Done     int64   `json:"done"`
	Failed   int64   `json:"failed"`
	Bytes    int64   `json:"bytes"`
	Rate     float64 `json:"rate"`
	WaveDone int64   `json:"wave_done"`
	ETA      float64 `json:"eta"`
	// Blocked are why chunks cannot be repaired now (the most common
	// first, at most MaxRepairBlocks), and Stuck how many pending chunks
	// that holds back; ETA counts only the others.
	Blocked []RepairBlock `json:"blocked,omitempty"`
	Stuck   int64         `json:"stuck,omitempty"`
}

// ReconcileReq asks meta to reconcile one chunk now: a write to it
// failed on a node, or an operator asks (sluice repair); see
// docs/failures.md. Without Wait meta answers at once; write layouts of
// the chunk answer EAGAIN until it is done.
//
// With Wait meta reconciles the chunk even if it looks healthy (every
// member fenced and checked, stale or missing copies restored, members on
// nodes that are down replaced) and answers when an attempt that began
// after the request has ended, or after MaxReconcileWait with Pending and
// the attempt to wait past (ask again with After set to it).
type ReconcileReq struct {
	Ino   ids.Ino     `json:"ino"`
	Index int64       `json:"index"`
	Chunk ids.ChunkID `json:"chunk"`
	Who   Who         `json:"who"`
	Wait  bool        `json:"wait,omitempty"`
	After int         `json:"after,omitempty"`
	// Gather rebuilds stripe units by sending the survivors' units whole
	// to the rebuilding node (seed 003's baseline) instead of having each
	// survivor send its decoding product.
	Gather bool `json:"gather,omitempty"`
	// Rebuild lists members to restore even if whole (benchmarks of
	// repair): they are planned as if they held nothing.
	Rebuild []int `json:"rebuild,omitempty"`
}

// MaxReconcileWait bounds how long one waiting Reconcile call is held.
const MaxReconcileWait = 20 * time.Second

// ReconcileResp answers a waiting ReconcileReq.
type ReconcileResp struct {
	Pending bool `json:"pending,omitempty"` // not done yet: ask again
	After   int  `json:"after,omitempty"`   // with this After
	// Restored lists the members whose copies were copied or rebuilt.
	Restored []RestoredMember `json:"restored,omitempty"`
	Version  uint64           `json:"version,omitempty"` // the version they hold
	Bytes    int64            `json:"bytes,omitempty"`   // what was moved
	// Elapsed is how long the copy or rebuild step took (no fencing or
	// planning), in nanoseconds.
	Elapsed time.Duration `json:"elapsed,omitempty"`
}

// RestoredMember is a member of a chunk a reconciliation restored: Index
// is its place in the replica set (the unit, for a stripe group); Moved,
// that it replaced a member on a node that is down or draining.
type RestoredMember struct {
	Index int        `json:"index"`
	Node  ids.NodeID `json:"node"`
	Moved bool       `json:"moved,omitempty"`
}

// RegisterReq is sent by a storage node at start. ID is 0 on its first
// start; meta assigns one and the node stores it.
type RegisterReq struct {
	ID       ids.NodeID `json:"id"`
	Addr     string     `json:"addr"`
	Domain   string     `json:"domain"`
	Capacity int64      `json:"capacity"`
	Used     int64      `json:"used"`
	Free     int64      `json:"free"`
	Chunks   int64      `json:"chunks"`
	// As in HeartbeatReq.
	Reclaimable int64  `json:"reclaimable,omitempty"`
	Disk        string `json:"disk,omitempty"`
	FSSize      int64  `json:"fs_size,omitempty"`
}
type RegisterResp struct {
	ID                ids.NodeID `json:"id"`
	Epoch             uint64     `json:"epoch"`
	HeartbeatInterval int64      `json:"heartbeat_interval"` // nanoseconds
	// CapKeys: what the node accepts from now on (nil from a meta that
	// does not say: keep what it knows).
	CapKeys *CapKeys `json:"cap_keys,omitempty"`
}

// HeartbeatReq reports a node's liveness and usage, and acknowledges
// chunk deletions done since the last heartbeat. Free is what the node
// can still take: the file system's free bytes and the recycled chunk
// files it reuses or gives back (store.Space); meta places new chunks by
// it. Used is what the node's store takes on its file system (allocated
// bytes: chunks, index, recycled files), Reclaimable the recycled files
// among them, Capacity what the file system can still hold plus Used
// (other tenants of the disk are not counted), and Disk names the file
// system (at most MaxDiskID bytes): nodes sharing one report the same,
// and count once in Totals (docs/space.md). FSSize is the file system's
// size (0: not known), at least Free.
type HeartbeatReq struct {
	ID       ids.NodeID    `json:"id"`
	Addr     string        `json:"addr"`
	Capacity int64         `json:"capacity"`
	Used     int64         `json:"used"`
	Free     int64         `json:"free"`
	Chunks   int64         `json:"chunks"`
	Deleted  []ids.ChunkID `json:"deleted,omitempty"`
	// Corrupt are copies found holding blocks that fail their checksums:
	// the node's own (its scrub, a write, a repair reading it; Node 0 or
	// its own id) or another node's that a repair read from.
	Corrupt []CorruptCopy `json:"corrupt,omitempty"`
	// Reclaimable, Disk and FSSize: see above.
	Reclaimable int64  `json:"reclaimable,omitempty"`
	Disk        string `json:"disk,omitempty"`
	FSSize      int64  `json:"fs_size,omitempty"`
}

// RetiredCopy is a node's copy of Chunk that meta moved elsewhere, at
// cluster epoch Epoch (0: not known, from before meta recorded it). The
// node drops it only if no reconciliation has fenced it there since: a
// repair may have placed the chunk back on the node meanwhile, and the
// copy it made must not go with the old one.
type RetiredCopy struct {
	Chunk ids.ChunkID `json:"chunk"`
	Epoch uint64      `json:"epoch,omitempty"`
}

// CorruptCopy says Node's copy of Chunk, at Version, holds blocks that
// fail their checksums: the bytes Bad (at most MaxBadExtents extents;
// empty: not said which). Meta has them healed from the other copies.
type CorruptCopy struct {
	Chunk   ids.ChunkID `json:"chunk"`
	Node    ids.NodeID  `json:"node,omitempty"`
	Version uint64      `json:"version,omitempty"`
	Bad     extent.List `json:"bad,omitempty"`
}

// MaxBadExtents bounds the extents one CorruptCopy lists; MaxCorruptCopies
// the copies one heartbeat reports.
const (
	MaxBadExtents    = 256
	MaxCorruptCopies = 1024
)

// Validate checks a report from the network.
func (c CorruptCopy) Validate() error {
	if c.Chunk == 0 || len(c.Bad) > MaxBadExtents || !c.Bad.Valid(MaxFileSize) {
		return Errorf(EINVAL, "malformed corruption report for chunk %v: %d extents %v", c.Chunk, len(c.Bad), c.Bad)
	}
	return nil
}

// ReportCorruptReq is a client telling meta that a copy it read holds
// blocks failing their checksums. Cap is the read capability it used
// (the layout's), which proves it may read the chunk and names its
// members.
type ReportCorruptReq struct {
	Cap  []byte      `json:"cap"`
	Copy CorruptCopy `json:"copy"`
}

// HeartbeatResp carries the cluster map and garbage to collect: Delete
// are copies meta moved elsewhere (the node drops them and keeps their
// fences), Gone chunks meta deleted (their files removed or truncated).
// The node acknowledges both in HeartbeatReq.Deleted.
type HeartbeatResp struct {
	Epoch  uint64        `json:"epoch"`
	Nodes  []NodeInfo    `json:"nodes"`
	Delete []RetiredCopy `json:"delete,omitempty"`
	Gone   []GoneChunk   `json:"gone,omitempty"`
	// Inventory asks the node to list its chunks to meta now (see
	// InventoryReq) rather than at its next interval; with Verify, reading
	// every block against its checksum (sluice check --verify).
	Inventory bool `json:"inventory,omitempty"`
	Verify    bool `json:"verify,omitempty"`
	// CapKeys: as in RegisterResp.
	CapKeys *CapKeys `json:"cap_keys,omitempty"`
}
