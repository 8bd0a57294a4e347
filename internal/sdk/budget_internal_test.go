package sdk

import (
	"math/rand/v2"
	"testing"
)

// TestBudgetSparesWithinBound: the write buffers a Budget keeps for reuse
// count against its bound: charged plus kept never exceeds it, under any
// sequence of charges, releases, kept and reused buffers. (They were kept
// beside it: up to four 16 MiB buffers over --buffer-mib.)
func TestBudgetSparesWithinBound(t *testing.T) {
	const mib = 1 << 20
	g := NewBudget(40 * mib)
	rng := rand.New(rand.NewPCG(3, 4))
	type held struct {
		buf     []byte
		charged int64
	}
	var hs []held
	check := func(step int) {
		t.Helper()
		g.mu.Lock()
		defer g.mu.Unlock()
		var kept int64
		for _, s := range g.spare {
			kept += int64(cap(s))
		}
		if kept != g.spareB {
			t.Fatalf("step %d: spareB %d, spares hold %d", step, g.spareB, kept)
		}
		if g.used+g.spareB > g.max {
			t.Fatalf("step %d: %d charged + %d kept, over the bound %d", step, g.used, kept, g.max)
		}
	}
	for step := range 3000 {
		if rng.IntN(2) == 0 || len(hs) == 0 {
			size := []int{mib, 16 * mib}[rng.IntN(2)]
			if g.take(int64(size)) {
				hs = append(hs, held{g.buffer(size), int64(size)})
			}
		} else {
			i := rng.IntN(len(hs))
			h := hs[i]
			hs = append(hs[:i], hs[i+1:]...)
			g.give(h.charged)
			g.keep(h.buf)
		}
		check(step)
	}
}
