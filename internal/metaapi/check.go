package metaapi

import "github.com/sluicefs/sluice/internal/ids"

// `sluice check`: an fsck of the whole cluster. Meta walks its namespace
// and layouts, has every node list what it holds (and, with Verify, read
// every block of it against its checksums), and reports each kind of
// problem with a count and examples. With Repair it fixes what is safe to
// fix and says what it did.

// CheckKind is a kind of problem check reports.
type CheckKind string

const (
	// CheckDanglingEntry: a directory entry naming no inode, or an inode
	// of another type than the entry says. Repair removes the entry.
	CheckDanglingEntry CheckKind = "dangling-entry"
	// CheckOrphanInode: an inode no directory names and no open file
	// keeps. Repair links it into /lost+found.
	CheckOrphanInode CheckKind = "orphan-inode"
	// CheckLinkCount: an inode whose link count disagrees with the names
	// it has. Repair sets it to the names counted.
	CheckLinkCount CheckKind = "link-count"
	// CheckMetadata: any other broken invariant of meta's own records
	// (counters, indexes, lock tables). Reported only.
	CheckMetadata CheckKind = "metadata"
	// CheckBelowPolicy: a chunk (or stripe group) some byte of which has
	// fewer intact copies (units) than its policy asks, counted block by
	// block from what the nodes hold. Repair has meta reconcile it.
	CheckBelowPolicy CheckKind = "below-policy"
	// CheckUnitVersions: a stripe group whose units disagree on their
	// version. Repair has meta reconcile it.
	CheckUnitVersions CheckKind = "unit-versions"
	// CheckUnknownCopy: a copy a node holds that no file needs there.
	// Collected by the inventories once found stray for the grace period.
	CheckUnknownCopy CheckKind = "unknown-copy"
	// CheckPastEOF: a chunk wholly past its file's size. Reported only
	// (a write extending the file may be under way).
	CheckPastEOF CheckKind = "past-eof"
	// CheckUnreached: members on nodes that are down or did not list
	// their chunks: not judged.
	CheckUnreached CheckKind = "unreached"
)

// MaxCheckExamples bounds the examples one problem lists.
const MaxCheckExamples = 10

// CheckProblem is one kind of problem: how many, some examples, and with
// Repair how many were fixed and how (or why they were left).
type CheckProblem struct {
	Kind     CheckKind `json:"kind"`
	Count    int64     `json:"count"`
	Examples []string  `json:"examples,omitempty"`
	Repaired int64     `json:"repaired,omitempty"`
	Action   string    `json:"action,omitempty"`
}

// CheckReq starts a check (Start) or asks how the current or last one
// went. Only root may start one.
type CheckReq struct {
	Start  bool `json:"start,omitempty"`
	Verify bool `json:"verify,omitempty"` // nodes read every block against its checksum
	Repair bool `json:"repair,omitempty"`
	Who    Who  `json:"who"`
}

// CheckResp is a check's state: running, or done with its problems
// (none: the cluster is consistent).
type CheckResp struct {
	Started  int64          `json:"started"` // unix ns; 0: no check since meta started
	Done     int64          `json:"done"`    // unix ns; 0: running
	Verify   bool           `json:"verify,omitempty"`
	Repair   bool           `json:"repair,omitempty"`
	Nodes    []CheckNode    `json:"nodes"`
	Files    int64          `json:"files"`
	Dirs     int64          `json:"dirs"`
	Chunks   int64          `json:"chunks"`
	Problems []CheckProblem `json:"problems,omitempty"`
}

// CheckNode is how far one node got listing its chunks for the check.
type CheckNode struct {
	Node   ids.NodeID `json:"node"`
	State  NodeState  `json:"state"`
	Listed int64      `json:"listed"`
	Done   bool       `json:"done"`
}
