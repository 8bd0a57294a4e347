package meta

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Stuck repairs, and meta's first seconds. A repair that cannot make
// progress says why in sluice status (metaapi.RepairBlock): a lost
// member with no node to go to, too few live members to rebuild from, or
// attempts that keep failing. Reconciliations record the reason where
// they give up (blockedError); the status aggregates them by kind and
// policy. Just after meta starts, every node is down until it reports:
// until all have, or the node timeout has passed, the scan waits (its
// tallies would count every chunk unavailable, and it would queue
// repairs of nodes that are merely not heard from yet), and status says
// so (waitingForNodesLocked).

// blockedError is a reconciliation that cannot go on, with why.
type blockedError struct {
	block metaapi.RepairBlock
	err   error
}

func (e *blockedError) Error() string { return e.err.Error() }
func (e *blockedError) Unwrap() error { return e.err }

// maxBlockReason bounds the last error a failing block carries.
const maxBlockReason = 200

// failingBlock is the block of a job whose attempts keep failing.
func failingBlock(pol string, ec bool, err error) *metaapi.RepairBlock {
	reason := err.Error()
	if len(reason) > maxBlockReason {
		reason = reason[:maxBlockReason] + "..."
	}
	return &metaapi.RepairBlock{Kind: metaapi.BlockFailing, Policy: pol, EC: ec, Reason: reason, Chunks: 1}
}

// noPlaceBlock is why a chunk needing need distinct nodes finds no node
// for a lost member: infos are the nodes as placement saw them.
func (s *Service) noPlaceBlockLocked(infos []metaapi.NodeInfo, pol string, ec bool, need int) metaapi.RepairBlock {
	b := metaapi.RepairBlock{Kind: metaapi.BlockNoPlace, Policy: pol, EC: ec, Need: need, Chunks: 1}
	for i := range infos {
		if infos[i].State == metaapi.NodeUp {
			b.Up++
			if !infos[i].Draining && !s.minFree.Full(&infos[i]) {
				b.Usable++
			}
		}
	}
	return b
}

// datedBlock is a job's block and when it was found.
type datedBlock struct {
	metaapi.RepairBlock
	at time.Time
}

// aggregateBlocks adds up blocks of one kind, policy and need (the
// newest one's node counts and reason win) and keeps the limit most
// common.
func aggregateBlocks(blocks []datedBlock, limit int) []metaapi.RepairBlock {
	type key struct {
		kind, policy string
		ec           bool
		need         int
	}
	sum := map[key]*datedBlock{}
	for _, b := range blocks {
		k := key{b.Kind, b.Policy, b.EC, b.Need}
		a := sum[k]
		switch {
		case a == nil:
			c := b
			sum[k] = &c
		case b.at.After(a.at):
			n := a.Chunks + b.Chunks
			*a = b
			a.Chunks = n
		default:
			a.Chunks += b.Chunks
		}
	}
	out := make([]metaapi.RepairBlock, 0, len(sum))
	for _, a := range sum {
		out = append(out, a.RepairBlock)
	}
	slices.SortFunc(out, func(a, b metaapi.RepairBlock) int {
		return cmp.Or(cmp.Compare(b.Chunks, a.Chunks), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Policy, b.Policy),
			cmp.Compare(a.Need, b.Need), cmp.Compare(fmt.Sprint(a.EC), fmt.Sprint(b.EC)))
	})
	return out[:min(len(out), limit)]
}

// waitingForNodesLocked says whether meta still waits for the nodes it
// knows to report after it started: nil once all have, or the node
// timeout has passed. Needs s.mu.
func (s *Service) waitingForNodesLocked(now time.Time) *metaapi.NodesReporting {
	if now.Sub(s.openedAt) >= s.opts.NodeTimeout {
		return nil
	}
	w := metaapi.NodesReporting{Known: len(s.nodes)}
	for _, m := range s.nodes {
		if m.heard {
			w.Reported++
		}
	}
	if w.Reported == w.Known {
		return nil
	}
	return &w
}

// waitingForNodes is waitingForNodesLocked, taking s.mu.
func (s *Service) waitingForNodes() *metaapi.NodesReporting {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.waitingForNodesLocked(s.opts.Now())
}
