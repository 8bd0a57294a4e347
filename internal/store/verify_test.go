package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
)

// flip inverts one bit of byte off of chunk id's file.
func flip(t *testing.T, s *Store, id ids.ChunkID, off int64) {
	t.Helper()
	f, err := os.OpenFile(s.chunkPath(id), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestVerifyFindsEveryBadBlock(t *testing.T) {
	var mu sync.Mutex
	var reported []extent.List
	s := openStore(t, Options{BlockSize: 4096, OnCorrupt: func(id ids.ChunkID, v uint64, bad extent.List) {
		mu.Lock()
		defer mu.Unlock()
		reported = append(reported, bad)
	}})
	rng := rand.New(rand.NewPCG(1, 3))
	// Several checksum pages' worth, so Verify crosses read views.
	const n = 3*crcsPerPage*4096 + 1234
	if _, err := write(s, rng, 8, 0, randBytes(rng, n), 0); err != nil {
		t.Fatal(err)
	}
	if bad, err := s.Verify(8); err != nil || bad != nil {
		t.Fatalf("Verify of a healthy chunk: %v %v", bad, err)
	}
	offs := []int64{5, 4100, 2*crcsPerPage*4096 + 4097, n - 1}
	for _, off := range offs {
		flip(t, s, 8, off)
	}
	bad, err := s.Verify(8)
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Verify after flipping bytes: %v, want ErrCorrupt", err)
	}
	last := int64(n) / 4096 * 4096
	want := extent.List{{Off: 0, Len: 8192}, {Off: 2*crcsPerPage*4096 + 4096, Len: 4096}, {Off: last, Len: n - last}}
	if !equalLists(bad, want) {
		t.Fatalf("Verify found %v, want %v", bad, want)
	}
	if got := s.Suspect(8, 1); !equalLists(got, want) {
		t.Fatalf("Suspect = %v, want %v", got, want)
	}
	if len(reported) != 1 || !equalLists(reported[0], want) {
		t.Fatalf("reported %v, want one report of %v", reported, want)
	}
	for _, off := range offs {
		flip(t, s, 8, off) // restore
	}
	if bad, err := s.Verify(8); err != nil || bad != nil {
		t.Fatalf("Verify after restoring: %v %v", bad, err)
	}
	if got := s.Suspect(8, 1); got != nil {
		t.Fatalf("a chunk verified clean is still suspect: %v", got)
	}
	if _, err := s.Verify(12345); err != nil {
		t.Fatalf("Verify of an unknown chunk: %v", err)
	}
}

func equalLists(a, b extent.List) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHealRestoresOnlyBadBlocks(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096})
	rng := rand.New(rand.NewPCG(4, 5))
	const n = 10*4096 + 100
	data := randBytes(rng, n)
	if _, err := write(s, rng, 3, 0, data, 0); err != nil {
		t.Fatal(err)
	}
	flip(t, s, 3, 4096+7)
	flip(t, s, 3, n-3) // in the short last block
	bad, _ := s.Verify(3)
	if len(bad) != 2 {
		t.Fatalf("bad extents %v", bad)
	}

	// Data that does not match the stored checksums is refused whole.
	wrong := bytes.Clone(data[4096:8192])
	wrong[0]++
	if _, err := s.Heal(3, 1, 4096, wrong); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Heal with wrong data: %v, want ErrCorrupt", err)
	}
	// Not whole blocks, the wrong version, past the end.
	if _, err := s.Heal(3, 1, 4095, data[4095:8191]); !errors.Is(err, ErrRange) {
		t.Fatalf("Heal of unaligned bytes: %v, want ErrRange", err)
	}
	if _, err := s.Heal(3, 2, 4096, data[4096:8192]); !errors.Is(err, ErrStale) {
		t.Fatalf("Heal at another version: %v, want ErrStale", err)
	}
	if _, err := s.Heal(3, 1, 10*4096, append(bytes.Clone(data[10*4096:]), 0)); !errors.Is(err, ErrRange) {
		t.Fatalf("Heal past the end: %v, want ErrRange", err)
	}
	// A write open on the chunk: busy.
	w, err := s.BeginWrite(3, 0, 4096, 2) // a whole intact block
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Heal(3, 1, 4096, data[4096:8192]); !errors.Is(err, ErrBusy) {
		t.Fatalf("Heal during a write: %v, want ErrBusy", err)
	}
	w.Abort()

	// The whole chunk given: only the two bad blocks are rewritten.
	healed, err := s.Heal(3, 1, 0, data)
	if err != nil {
		t.Fatal(err)
	}
	want := extent.List{{Off: 4096, Len: 4096}, {Off: 10 * 4096, Len: 100}}
	if !equalLists(healed, want) {
		t.Fatalf("healed %v, want %v", healed, want)
	}
	if bad, err := s.Verify(3); err != nil || bad != nil {
		t.Fatalf("after healing: %v %v", bad, err)
	}
	got := make([]byte, n)
	r, err := s.OpenRead(3)
	if err != nil {
		t.Fatal(err)
	}
	r.ReadAt(got, 0)
	r.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("healed chunk differs from what was written")
	}
	if in, _ := s.Stat(3); in.Version != 1 || in.Length != n {
		t.Fatalf("healing changed the chunk's state: %+v", in)
	}
}

// A write that covers part of a block must not vouch for that block's
// other bytes when they are corrupt: its new checksum would hide them.
func TestPartialWriteRefusesCorruptEdgeBlock(t *testing.T) {
	var reports int
	s := openStore(t, Options{BlockSize: 4096, OnCorrupt: func(ids.ChunkID, uint64, extent.List) { reports++ }})
	rng := rand.New(rand.NewPCG(6, 7))
	data := randBytes(rng, 4*4096)
	if _, err := write(s, rng, 5, 0, data, 0); err != nil {
		t.Fatal(err)
	}
	flip(t, s, 5, 4096+10)
	// Refused as the write begins, before anything is placed (or, on a
	// replica, forwarded).
	if _, err := s.BeginWrite(5, 4096+100, 100, 2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("begin of a partial write over a corrupt block: %v, want ErrCorrupt", err)
	}
	// Overwrite bytes [4096+100, 4096+200): the block's other bytes
	// include the flipped one.
	if _, err := write(s, rng, 5, 4096+100, randBytes(rng, 100), 2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("partial write over a corrupt block: %v, want ErrCorrupt", err)
	}
	if reports != 2 || s.Suspect(5, 1) == nil {
		t.Fatalf("the corrupt edge block was not reported (%d reports)", reports)
	}
	if bad, _ := s.Verify(5); len(bad) != 1 {
		t.Fatalf("the corruption must stay visible: Verify found %v", bad)
	}
	// Writes that replace whole blocks, or touch only intact ones, go on.
	if _, err := write(s, rng, 5, 4096, randBytes(rng, 4096), 2); err != nil {
		t.Fatalf("a write of the whole bad block: %v", err)
	}
	if _, err := write(s, rng, 5, 3*4096+5, randBytes(rng, 10), 3); err != nil {
		t.Fatalf("a partial write of an intact block: %v", err)
	}
	if bad, err := s.Verify(5); err != nil || bad != nil {
		t.Fatalf("after rewriting the bad block: %v %v", bad, err)
	}
	// Appending in the middle of a corrupt last block: refused too.
	if _, err := write(s, rng, 6, 0, randBytes(rng, 4096+50), 0); err != nil {
		t.Fatal(err)
	}
	flip(t, s, 6, 4096+3)
	if _, err := write(s, rng, 6, 4096+50, randBytes(rng, 20), 2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("append into a corrupt last block: %v, want ErrCorrupt", err)
	}
}

// TestSuspectsOutliveOtherWrites: bad blocks a store knows of stay known
// when a write elsewhere in the chunk commits a new version (the fence's
// answer and the inventory say so until the copy is healed); the blocks
// a write rewrote whole are forgotten.
func TestSuspectsOutliveOtherWrites(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096})
	rng := rand.New(rand.NewPCG(8, 9))
	if _, err := write(s, rng, 4, 0, randBytes(rng, 8*4096), 0); err != nil {
		t.Fatal(err)
	}
	flip(t, s, 4, 10)
	flip(t, s, 4, 5*4096+10)
	if bad, _ := s.Verify(4); len(bad) != 2 {
		t.Fatalf("bad %v", bad)
	}
	if _, err := write(s, rng, 4, 3*4096, randBytes(rng, 4096), 2); err != nil {
		t.Fatal(err)
	}
	if got := s.Suspect(4, 2); !equalLists(got, extent.List{{Off: 0, Len: 4096}, {Off: 5 * 4096, Len: 4096}}) {
		t.Fatalf("after a write elsewhere: suspect %v", got)
	}
	if _, err := write(s, rng, 4, 5*4096, randBytes(rng, 4096), 3); err != nil {
		t.Fatal(err)
	}
	if got := s.Suspect(4, 3); !equalLists(got, extent.List{{Off: 0, Len: 4096}}) {
		t.Fatalf("after rewriting one bad block whole: suspect %v", got)
	}
}

// TestVerifyUnreadableCopy: a copy whose file is gone is bad throughout
// (reported so), and ErrUnreadable says it cannot be healed block by block.
func TestVerifyUnreadableCopy(t *testing.T) {
	var reported extent.List
	s := openStore(t, Options{BlockSize: 4096, OnCorrupt: func(_ ids.ChunkID, _ uint64, bad extent.List) { reported = bad }})
	rng := rand.New(rand.NewPCG(8, 10))
	if _, err := write(s, rng, 6, 0, randBytes(rng, 10000), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.chunkPath(6)); err != nil {
		t.Fatal(err)
	}
	bad, err := s.Verify(6)
	want := extent.List{{Off: 0, Len: 10000}}
	if !errors.Is(err, ErrUnreadable) || !errors.Is(err, ErrCorrupt) || !equalLists(bad, want) || !equalLists(reported, want) {
		t.Fatalf("Verify of a copy without its file: %v %v (reported %v)", bad, err, reported)
	}
}
