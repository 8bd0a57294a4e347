package store

import (
	"errors"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestAbortLeavesChunkUnchanged aborts writes at random points — appends,
// overwrites and writes straddling the end — and checks Stat, data and
// checksums are exactly as before, then that later writes with holes over
// the aborted range read zeros there.
func TestAbortLeavesChunkUnchanged(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096, MaxChunkSize: 1 << 20})
	rng := rand.New(rand.NewPCG(3, 5))
	m := newModel()
	const id = ids.ChunkID(42)
	m.mustWrite(t, s, rng, id, 0, randBytes(rng, 20000))
	for iter := range 200 {
		L := int64(len(m.data[id]))
		var off int64
		switch rng.IntN(3) {
		case 0: // overwrite
			off = rng.Int64N(L)
		case 1: // append, maybe leaving a hole
			off = L + rng.Int64N(10000)
		default: // straddle the end
			off = max(0, L-rng.Int64N(5000))
		}
		n := 1 + rng.Int64N(30000)
		n = min(n, s.maxChunk-off)
		if n <= 0 {
			continue
		}
		data := randBytes(rng, int(n))
		w, err := s.BeginWrite(id, off, n, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Place a random prefix (possibly everything), then abort.
		placed := rng.Int64N(n + 1)
		if err := placeAll(w, rng, off, data[:placed]); err != nil {
			t.Fatal(err)
		}
		if placed < n && rng.IntN(2) == 0 {
			if _, err := w.Commit(); err == nil {
				t.Fatal("commit of an incomplete write succeeded")
			}
			if err := w.Sync(); !errors.Is(err, ErrIncomplete) {
				t.Fatalf("sync of an incomplete write: %v", err)
			}
		}
		if placed == n && rng.IntN(2) == 0 {
			// Durable but unpublished data must vanish on abort too.
			if err := w.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		w.Abort()
		w.Abort() // twice is fine
		if err := checkChunk(s, id, m.info[id], m.data[id]); err != nil {
			t.Fatalf("iter %d: after abort of [%d, +%d) placed %d: %v", iter, off, n, placed, err)
		}
		// Commit something now and then, so aborted bytes beyond the end
		// become holes that must read as zeros.
		if rng.IntN(3) == 0 {
			L := int64(len(m.data[id]))
			off := L + rng.Int64N(40000)
			n := min(rng.Int64N(100), s.maxChunk-off)
			if n < 0 {
				continue
			}
			m.mustWrite(t, s, rng, id, off, randBytes(rng, int(n)))
			m.check(t, s, id)
		}
	}
	if _, err := s.Verify(id); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(s.dir + "/" + stagingDir); len(ents) != 0 {
		t.Fatalf("staging not empty after aborts: %v", ents)
	}
}

// TestAbortNewChunk: aborting the first write of a chunk leaves no chunk,
// no file and no usage behind.
func TestAbortNewChunk(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(1, 9))
	w, err := s.BeginWrite(5, 100, 50000, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := placeAll(w, rng, 100, randBytes(rng, 30000)); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if in, err := s.Stat(5); err != nil || in != (Info{}) {
		t.Fatalf("Stat after abort: %+v, %v", in, err)
	}
	if _, err := os.Stat(s.chunkPath(5)); !os.IsNotExist(err) {
		t.Fatalf("chunk file after abort of a new chunk: %v", err)
	}
	if b, n := s.Usage(); b != 0 || n != 0 {
		t.Fatalf("Usage after abort: %d, %d", b, n)
	}
	// The chunk is free again, at version 1.
	if _, err := write(s, rng, 5, 0, []byte("x"), 1); err != nil {
		t.Fatal(err)
	}
}

// TestGarbageBeyondLengthIsCut: bytes a crashed write left past the
// committed length must not show through a later hole.
func TestGarbageBeyondLengthNeverShows(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(4, 4))
	m := newModel()
	m.mustWrite(t, s, rng, 7, 0, randBytes(rng, 1000))
	// Simulate a crash mid-write: garbage in the append region.
	f, err := os.OpenFile(s.chunkPath(7), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 100000)
	for i := range garbage {
		garbage[i] = 0xee
	}
	if _, err := f.WriteAt(garbage, 1000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s = reopen(t, s)
	m.check(t, s, 7)
	m.mustWrite(t, s, rng, 7, 200000, []byte("tail"))
	m.check(t, s, 7)
	if _, err := s.Verify(7); err != nil {
		t.Fatal(err)
	}
}
