package metaapi

import (
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// Inventories. A storage node lists the chunks it holds to meta now and
// then, a page at a time in chunk id order (InventoryReq); meta judges
// every copy against its records and answers which ones to delete. A
// copy no file needs there — a stray — is deleted only once meta has
// found it stray for the grace period (sluice meta --orphan-grace): meta
// is the judge, the node never deletes on its own judgement. What the
// last rounds found is kept for `sluice check` (StraysReq).

// GoneChunk is a chunk meta deleted (HeartbeatResp.Gone). The node
// deletes its copy behind a tombstone it keeps until Until (unix ns): no
// capability naming the chunk is valid past it, and before it every
// write to the chunk is refused (wire.StatusGone), so none can re-create
// it.
type GoneChunk struct {
	Chunk ids.ChunkID `json:"chunk"`
	Until int64       `json:"until"`
}

// HeldChunk is one copy a node holds: its committed version and length,
// and the bytes of it known to fail their checksums (read in this round
// if it verifies, else as far as the node knows; at most MaxBadExtents
// extents, Bad nil and BadUnlisted when there are more).
type HeldChunk struct {
	Chunk       ids.ChunkID `json:"chunk"`
	Version     uint64      `json:"version"`
	Length      int64       `json:"length"`
	Bad         extent.List `json:"bad,omitempty"`
	BadUnlisted bool        `json:"bad_unlisted,omitempty"`
}

// MaxInventoryPage bounds the chunks one InventoryReq lists.
const MaxInventoryPage = 4096

// InventoryReq lists a node's copies with ids above After, in increasing
// order: those up to the last one listed, or, with Done, all the rest (a
// round's last page). A round starts with After 0.
type InventoryReq struct {
	Node   ids.NodeID  `json:"node"`
	After  ids.ChunkID `json:"after"`
	Chunks []HeldChunk `json:"chunks"`
	Done   bool        `json:"done,omitempty"`
	// Verified: this round read every block it lists against its
	// checksum (meta asked for it: HeartbeatResp.Verify).
	Verified bool `json:"verified,omitempty"`
}

// InventoryResp lists the copies the node deletes, each unless it was
// fenced above Epoch since (meta placed a member there after judging).
type InventoryResp struct {
	Epoch   uint64        `json:"epoch"`
	Collect []ids.ChunkID `json:"collect,omitempty"`
}

// StrayKind says why a copy is stray.
type StrayKind string

const (
	// StrayUnknown: no file's chunk has this id (its file was removed or
	// truncated, and the copy outlived the deletion). Collected.
	StrayUnknown StrayKind = "unknown"
	// StrayNotMember: a file's chunk, but not placed on this node (any
	// more), while every member holds it intact. Collected.
	StrayNotMember StrayKind = "not-member"
	// StrayDisplaced: a file's chunk, not placed on this node, while
	// some member is down, gone, or was not found holding it intact (meta
	// restored from a backup older than a move?). Kept; meta may adopt
	// it as a member (docs/backup.md).
	StrayDisplaced StrayKind = "displaced"
	// StrayQueued: queued for deletion on this node; the heartbeat's
	// garbage collection deletes it.
	StrayQueued StrayKind = "queued"
	// StrayAhead: an id meta never gave out — meta's state is older
	// than the node's (restored from an old copy?). Never collected.
	StrayAhead StrayKind = "ahead"
)

// StraysReq asks what the nodes' inventories found (every node, or
// only Node). Refresh (root only) asks every node for a new round at its
// next heartbeat; a round that ends after the request has RoundDone
// later than the answer's Now.
type StraysReq struct {
	Node    ids.NodeID `json:"node,omitempty"`
	Refresh bool       `json:"refresh,omitempty"`
	Who     Who        `json:"who"`
}

// StraysResp is what the last inventories found. Grace is how long a
// copy must be found stray before it is collected (ns).
type StraysResp struct {
	Now   int64            `json:"now"`
	Grace int64            `json:"grace"`
	Nodes []NodeStrayCount `json:"nodes"`
}

// NodeStrayCount is one node's last complete inventory round (since meta
// started: meta keeps this in memory): the copies it listed, the strays
// among them by kind, those beyond what meta tracks (counted only, and
// collected in later rounds), how many it was told to collect since meta
// started, and up to MaxStrayList of the strays.
type NodeStrayCount struct {
	Node      ids.NodeID          `json:"node"`
	Rounds    int64               `json:"rounds"`
	RoundDone int64               `json:"round_done"` // unix ns; 0: no round since meta started
	Held      int64               `json:"held"`
	Strays    map[StrayKind]int64 `json:"strays"`
	Untracked int64               `json:"untracked,omitempty"`
	Collected int64               `json:"collected"`
	List      []StrayCopy         `json:"list,omitempty"`
}

// StrayCopy is one stray copy: what the node holds, and since when meta
// has found it stray (unix ns).
type StrayCopy struct {
	Chunk   ids.ChunkID `json:"chunk"`
	Kind    StrayKind   `json:"kind"`
	Version uint64      `json:"version"`
	Length  int64       `json:"length"`
	Since   int64       `json:"since"`
}

// MaxStrayList bounds the strays listed per node.
const MaxStrayList = 1024
