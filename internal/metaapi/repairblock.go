package metaapi

import "fmt"

// Repairs that cannot make progress, and why (sluice status).

// The kinds of RepairBlock.
const (
	// BlockNoPlace: a lost member has no node to go to — the policy
	// needs Need distinct nodes and only Up are up (Usable of them can
	// take data: not full, not draining).
	BlockNoPlace = "no-place"
	// BlockNoSource: fewer than Need members are live and whole, the
	// least to rebuild from: nothing to do until nodes return.
	BlockNoSource = "no-source"
	// BlockFailing: attempts keep failing (Reason, the last error).
	BlockFailing = "failing"
)

// RepairBlock is one reason repairs are stuck, with how many chunks
// (stripe groups, for an erasure code) it holds back.
type RepairBlock struct {
	Kind   string `json:"kind"`
	Policy string `json:"policy"` // "RS(3,2)", "3 replicas"
	EC     bool   `json:"ec,omitempty"`
	Need   int    `json:"need"`
	Up     int    `json:"up,omitempty"`
	Usable int    `json:"usable,omitempty"`
	Reason string `json:"reason,omitempty"`
	Chunks int64  `json:"chunks"`
}

// MaxRepairBlocks bounds RepairStats.Blocked.
const MaxRepairBlocks = 8

// PolicyName is how a repair block names a policy.
func PolicyName(p *Policy) string {
	switch {
	case p == nil:
		return "the default policy"
	case p.EC != nil:
		return fmt.Sprintf("RS(%d,%d)", p.EC.Data, p.EC.Parity)
	default:
		return fmt.Sprintf("%d replicas", p.Replicas)
	}
}

func (b RepairBlock) String() string {
	what := "chunks"
	if b.EC {
		what = "stripe groups"
	}
	switch b.Kind {
	case BlockNoPlace:
		s := fmt.Sprintf("%d %s of %s need %d nodes, %d are up", b.Chunks, what, b.Policy, b.Need, b.Up)
		if b.Usable < b.Up {
			s += fmt.Sprintf(" and %d of them can take data (the others are full or draining)", b.Usable)
		}
		return s
	case BlockNoSource:
		return fmt.Sprintf("%d %s of %s have fewer than %d live whole members to rebuild from: waiting for nodes to return", b.Chunks, what, b.Policy, b.Need)
	default:
		return fmt.Sprintf("%d %s of %s fail to repair: %s", b.Chunks, what, b.Policy, b.Reason)
	}
}

// NodesReporting says meta has just started and not every node it knows
// has reported yet: Reported of Known have. Until all have, or the node
// timeout has passed, redundancy is not scanned and nothing is repaired
// on account of nodes not heard from.
type NodesReporting struct {
	Reported int `json:"reported"`
	Known    int `json:"known"`
}
