package store

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestOnChange: the store tells of every committed write and every delete
// of a chunk (a copy of its bytes elsewhere goes stale), and not of a
// write that is aborted.
func TestOnChange(t *testing.T) {
	var mu sync.Mutex
	var seen []ids.ChunkID
	s := openStore(t, Options{OnChange: func(id ids.ChunkID) {
		mu.Lock()
		seen = append(seen, id)
		mu.Unlock()
	}})
	rng := rand.New(rand.NewPCG(3, 3))
	got := func() []ids.ChunkID {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
	if _, err := write(s, rng, 7, 0, randBytes(rng, 50000), 1); err != nil {
		t.Fatal(err)
	}
	if _, err := write(s, rng, 7, 100, randBytes(rng, 10), 2); err != nil { // an overwrite
		t.Fatal(err)
	}
	w, err := s.BeginWrite(8, 0, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if err := s.Delete(7); err != nil {
		t.Fatal(err)
	}
	if g := got(); !slices.Equal(g, []ids.ChunkID{7, 7, 7}) {
		t.Fatalf("told of %v, want chunk 7 three times (two commits, a delete)", g)
	}
}
