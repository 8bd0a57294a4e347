package sdk

import (
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/odafs"
)

// SpareCaps returns the capacities of the write buffers g keeps for
// reuse (tests of package sdk_test).
func SpareCaps(g *Budget) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	caps := make([]int, len(g.spare))
	for i, s := range g.spare {
		caps[i] = cap(s)
	}
	return caps
}

// RefNodes counts the exported-cache references c holds per node.
func RefNodes(c *Client) map[ids.NodeID]int {
	if c.od == nil {
		return nil
	}
	return c.od.Nodes()
}

// ForgeRefs replaces every exported-cache reference c holds by what
// forge makes of it (tests of forged and altered references).
func ForgeRefs(c *Client, forge func(i int, r *odafs.Ref)) int {
	type kv struct {
		id  odafs.BlockID
		ref odafs.Ref
	}
	var all []kv
	c.od.Each(func(id odafs.BlockID, r odafs.Ref) { all = append(all, kv{id, r}) })
	for i, x := range all {
		forge(i, &x.ref)
		c.od.Learn(x.id, x.ref)
	}
	return len(all)
}

// Regions is how many regions c's endpoint has registered.
func Regions(c *Client) int { return c.bufs.ep.Regions() }
