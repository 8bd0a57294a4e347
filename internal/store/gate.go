package store

import (
	"sync"
	"sync/atomic"
)

// gate counts operations that use the index so Close can wait for them
// and later ones fail with ErrClosed. It is an atomic counter rather than
// an RWMutex on purpose: a waiting Close must not block new entries (they
// fail instead), or a Read that needs the index to finish would deadlock
// with a Commit waiting for that Read while holding the gate.
type gate struct {
	state   atomic.Int64 // operations in flight, plus gateClosed once closing
	once    sync.Once
	drained chan struct{}
}

const gateClosed = 1 << 62

func newGate() gate { return gate{drained: make(chan struct{})} }

// enter reports whether the store is open; if so the caller must exit.
func (g *gate) enter() bool {
	if g.state.Add(1)&gateClosed != 0 {
		g.exit()
		return false
	}
	return true
}

func (g *gate) exit() {
	if g.state.Add(-1) == gateClosed {
		g.once.Do(func() { close(g.drained) })
	}
}

// close stops new entries and waits for those in flight. It reports
// whether this call was the one that closed the gate.
func (g *gate) close() bool {
	if g.state.Or(gateClosed)&gateClosed != 0 {
		return false
	}
	if g.state.Load() == gateClosed {
		g.once.Do(func() { close(g.drained) })
	}
	<-g.drained
	return true
}
