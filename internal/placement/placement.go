// Package placement chooses the storage nodes that hold a new chunk's
// replicas. It is pure: it sees a snapshot of the cluster map and a random
// source, does no I/O, and keeps no state, so meta can call it under its
// lock and tests can drive it deterministically.
//
// The policy, in order of priority:
//
//  1. Only live nodes (State == up), never an excluded node, never a
//     full one: a node must have more than a margin free (MinFree: a
//     number of bytes or a share of its file system, whichever is more).
//     NodeInfo.Free is what meta expects the node to have — its last
//     report less what meta placed there since — and the margin absorbs
//     what that estimate misses (appends to existing chunks, a burst
//     between reports), so a node's file system never fills up under a
//     write it was given. A node that reports no capacity (no statfs
//     where it runs) is taken to have room.
//  2. Spread across failure domains: the first replicas go to distinct
//     domains (nodes sharing NodeInfo.Domain are one domain; a node with
//     an empty domain is a domain of its own); only when every domain
//     holds a replica are further replicas doubled up inside domains.
//  3. Within those bounds, prefer nodes with more room without herding:
//     each pick is a "power of two choices" — draw two candidates at
//     random and keep the one with the larger share of its capacity
//     free. A fully deterministic "emptiest first" would send every chunk
//     allocated between two heartbeats to the same nodes; two random
//     choices keep the load balanced with exponentially smaller imbalance
//     than one random choice, yet still spread a burst of allocations
//     over the whole cluster. Free space, not the bytes in chunks, is
//     what counts: the index, recycled chunk files and other tenants of
//     a disk take space too.
package placement

import (
	"fmt"
	"math/rand/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// MinFree is the free space a node must keep to be given new chunks:
// Bytes, or Percent of its file system's size if that is more.
type MinFree struct {
	Bytes   int64
	Percent float64
}

// Of is the free space a node on a file system of size bytes must keep.
func (m MinFree) Of(size int64) int64 {
	return max(m.Bytes, int64(float64(max(size, 0))*m.Percent/100))
}

// Full reports whether n has no more than the margin free (a node that
// reports no capacity never is). The share is of the file system's size
// (FSSize), not of Capacity: on a disk other programs mostly fill,
// Capacity (free space plus what Sluice takes) is small, and a share of
// it would leave the file system to run at its last percent. A node that
// does not report the size (an older one) is judged by its Capacity.
func (m MinFree) Full(n *metaapi.NodeInfo) bool {
	size := n.FSSize
	if size <= 0 {
		size = n.Capacity
	}
	return size > 0 && n.Free <= m.Of(size)
}

// Choose returns k distinct node ids for a new chunk, chosen from nodes as
// described in the package comment. The first returned node is the head of
// the replication chain. If fewer than k nodes qualify it returns an
// ENOSPC *metaapi.Error naming both numbers.
func Choose(nodes []metaapi.NodeInfo, k int, exclude []ids.NodeID, minFree MinFree, rng *rand.Rand) ([]ids.NodeID, error) {
	if k < 1 {
		return nil, metaapi.Errorf(metaapi.EINVAL, "placement: need at least 1 replica, got %d", k)
	}
	out, up, full, ok := choose(nodes, k, exclude, nil, minFree, rng)
	if ok {
		return out, nil
	}
	switch {
	case full > 0:
		return nil, metaapi.Errorf(metaapi.ENOSPC,
			"policy needs %d replicas but only %d storage nodes are up with free space (%d up, %d full)",
			k, up-full, up, full)
	case len(exclude) > 0:
		return nil, metaapi.Errorf(metaapi.ENOSPC,
			"policy needs %d replicas but only %d storage nodes are up (not counting %d excluded)",
			k, up, len(exclude))
	default:
		return nil, metaapi.Errorf(metaapi.ENOSPC,
			"policy needs %d replicas but only %d storage nodes are up", k, up)
	}
}

// Replace returns k distinct nodes to take the place of members a chunk
// lost: never one of its members (members: the whole set, kept and
// replaced), and in failure domains the kept members do not already
// occupy before doubling up, as a new chunk's would be. If fewer than k
// nodes qualify it returns an ENOSPC *metaapi.Error.
func Replace(nodes []metaapi.NodeInfo, k int, members, kept []ids.NodeID, minFree MinFree, rng *rand.Rand) ([]ids.NodeID, error) {
	if k < 1 {
		return nil, metaapi.Errorf(metaapi.EINVAL, "placement: need at least 1 replacement, got %d", k)
	}
	occupied := map[string]bool{}
	for i := range nodes {
		if contains(kept, nodes[i].ID) {
			occupied[domainOf(&nodes[i])] = true
		}
	}
	out, up, full, ok := choose(nodes, k, members, occupied, minFree, rng)
	if ok {
		return out, nil
	}
	free := ""
	if full > 0 {
		free = fmt.Sprintf(" with free space (%d full)", full)
	}
	return nil, metaapi.Errorf(metaapi.ENOSPC, "needs %d live node(s) outside its %d members, but %d are up%s", k, len(members), up-full, free)
}

// choose picks k nodes from those that qualify, spreading over domains
// not in occupied first. up counts the live nodes outside exclude, full
// those of them that are full; ok is false if fewer than k qualify.
func choose(nodes []metaapi.NodeInfo, k int, exclude []ids.NodeID, occupied map[string]bool, minFree MinFree, rng *rand.Rand) (out []ids.NodeID, up, full int, ok bool) {
	cands := make([]cand, 0, len(nodes))
	seen := make(map[ids.NodeID]bool, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		if n.State != metaapi.NodeUp || n.Draining || n.ID == 0 || seen[n.ID] || contains(exclude, n.ID) {
			continue
		}
		seen[n.ID] = true // a duplicated id would break distinctness
		up++
		if minFree.Full(n) {
			full++
			continue
		}
		cands = append(cands, cand{id: n.ID, domain: domainOf(n), room: room(n)})
	}
	if len(cands) < k {
		return nil, up, full, false
	}
	out = make([]ids.NodeID, 0, k)
	used := make(map[string]bool, len(occupied)+k)
	for d := range occupied {
		used[d] = true
	}
	// Pass 1: one node per domain not yet holding a replica.
	for len(out) < k {
		i := pick(cands, rng, func(c *cand) bool { return !c.taken && !used[c.domain] })
		if i < 0 {
			break // every domain has a replica
		}
		cands[i].taken = true
		used[cands[i].domain] = true
		out = append(out, cands[i].id)
	}
	// Pass 2: fill from the remaining nodes.
	for len(out) < k {
		i := pick(cands, rng, func(c *cand) bool { return !c.taken })
		if i < 0 {
			break // cannot happen: len(cands) >= k
		}
		cands[i].taken = true
		out = append(out, cands[i].id)
	}
	return out, up, full, true
}

// domainOf is n's failure domain; a node with none is a domain of its own.
func domainOf(n *metaapi.NodeInfo) string {
	if n.Domain == "" {
		return "\x00node:" + n.ID.String() // cannot collide with a configured domain name
	}
	return n.Domain
}

type cand struct {
	id     ids.NodeID
	domain string
	room   float64
	taken  bool
}

// room is the share of a node's capacity that is free; a node that does
// not report its capacity counts as empty rather than being starved.
func room(n *metaapi.NodeInfo) float64 {
	if n.Capacity <= 0 {
		return 1
	}
	return float64(min(max(n.Free, 0), n.Capacity)) / float64(n.Capacity)
}

// pick draws two eligible candidates uniformly at random (with
// replacement; identical when only one is eligible) and returns the index
// of the one with more room, or -1 when none is eligible.
func pick(cands []cand, rng *rand.Rand, ok func(*cand) bool) int {
	n := 0
	for i := range cands {
		if ok(&cands[i]) {
			n++
		}
	}
	if n == 0 {
		return -1
	}
	a, b := nth(cands, ok, rng.IntN(n)), nth(cands, ok, rng.IntN(n))
	if cands[b].room > cands[a].room {
		return b
	}
	return a
}

// nth returns the index of the j-th eligible candidate.
func nth(cands []cand, ok func(*cand) bool, j int) int {
	for i := range cands {
		if ok(&cands[i]) {
			if j == 0 {
				return i
			}
			j--
		}
	}
	return -1
}

func contains(list []ids.NodeID, id ids.NodeID) bool {
	for _, x := range list {
		if x == id {
			return true
		}
	}
	return false
}
