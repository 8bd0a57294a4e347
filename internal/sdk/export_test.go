package sdk

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
