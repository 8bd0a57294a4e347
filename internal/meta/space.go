package meta

import (
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Space: meta places new chunks only on nodes with more than a margin
// free (Options.MinFreeBytes, MinFreePercent; see placement). Nodes report
// their free space with every heartbeat, and at once when a write finds
// their file system full. Between two reports meta counts what it placed
// on a node since the last one (member.pending) against the reported
// free space, so a burst of creates within one heartbeat does not all
// land on a node that had room for only a few. A placed chunk counts as
// the bytes of the write that allocated it (its share of them, for a
// stripe unit): later appends are what the margin is for.

// Defaults of the margin.
const (
	DefaultMinFreeBytes   = 1 << 30
	DefaultMinFreePercent = 5
)

// placementInfosLocked is the cluster as placement sees it: each node's
// free space less what was placed on it since its report. Needs s.mu.
func (s *Service) placementInfosLocked() []metaapi.NodeInfo {
	infos := s.nodeInfosLocked()
	for i := range infos {
		if m := s.nodes[infos[i].ID]; m != nil {
			infos[i].Free -= m.pending
		}
	}
	return infos
}

// fullLocked reports whether a node has no more than the margin free, as
// placement would judge it now. Needs s.mu.
func (s *Service) fullLocked(m *member) bool {
	in := m.info()
	in.Free -= m.pending
	return s.minFree.Full(&in)
}

// charges collects what one mutation placed on each node, to add to
// their pending bytes once it is committed.
type charges map[ids.NodeID]int64

// add charges bytes to every node in nodes, in infos too (so the next
// placement in the same mutation sees it).
func (c charges) add(infos []metaapi.NodeInfo, nodes []ids.NodeID, bytes int64) {
	if bytes <= 0 {
		return
	}
	for _, id := range nodes {
		c[id] += bytes
		for i := range infos {
			if infos[i].ID == id {
				infos[i].Free -= bytes
			}
		}
	}
}

// commit adds the charges to the nodes' pending bytes. It runs after the
// mutation commits, under s.mu.
func (s *Service) commitCharges(c charges) {
	for id, b := range c {
		if m := s.nodes[id]; m != nil {
			m.pending += b
		}
	}
}

// placedBytes is what a chunk's first write puts on each of its nodes:
// the part of [off, off+n) in chunk idx of chunkSize bytes, or a stripe
// unit's share of it (rounded up) when the file is erasure-coded.
func placedBytes(pol metaapi.Policy, chunkSize, idx, off, n int64) int64 {
	lo, hi := max(off, idx*chunkSize), min(off+n, (idx+1)*chunkSize)
	if hi <= lo {
		return 0
	}
	b := hi - lo
	if pol.EC != nil && pol.EC.Data > 0 {
		b = (b + int64(pol.EC.Data) - 1) / int64(pol.EC.Data)
	}
	return b
}
