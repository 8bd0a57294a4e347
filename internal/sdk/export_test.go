package sdk

import "github.com/sluicefs/sluice/internal/ids"

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
