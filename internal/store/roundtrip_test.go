package store

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

func TestRoundTripSimple(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(1, 1))
	m := newModel()
	B := int64(s.BlockSize())
	m.mustWrite(t, s, rng, 1, 0, randBytes(rng, 100000))
	m.check(t, s, 1)
	m.mustWrite(t, s, rng, 1, 5*B+7, randBytes(rng, 3*int(B))) // overwrite + extend
	m.check(t, s, 1)
	m.mustWrite(t, s, rng, 1, 1000, randBytes(rng, 10)) // small overwrite inside a block
	m.check(t, s, 1)
	m.mustWrite(t, s, rng, 2, 40*B+3, randBytes(rng, 10)) // sparse new chunk
	m.check(t, s, 2)
	m.mustWrite(t, s, rng, 2, 0, nil) // version bump
	m.check(t, s, 2)
	if in, _ := s.Stat(3); in != (Info{}) {
		t.Fatalf("unknown chunk: %+v", in)
	}
	m.check(t, s, 3)
	if b, n := s.Usage(); b != int64(len(m.data[1])+len(m.data[2])) || n != 2 {
		t.Fatalf("Usage = %d, %d", b, n)
	}
}

// TestRoundTripRandom is the main property test: random writes (sparse,
// extending, overwriting, zero-length, across checksum-page boundaries) in
// random packet splits, each checked against a model, with reopens and
// verification along the way.
func TestRoundTripRandom(t *testing.T) {
	const B = 4096
	const pageBytes = B * crcsPerPage
	dir := testDir(t)
	s := openStore(t, Options{Dir: dir, BlockSize: B, MaxChunkSize: 3 * pageBytes})
	rng := rand.New(rand.NewPCG(7, 11))
	m := newModel()
	chunks := []ids.ChunkID{1, 2, 3, 0xffffffffffffffff}
	steps := 400
	if testing.Short() {
		steps = 100
	}
	for step := range steps {
		id := chunks[rng.IntN(len(chunks))]
		L := int64(len(m.data[id]))
		var off int64
		switch rng.IntN(6) {
		case 0: // at or just past the end
			off = L + int64(rng.IntN(3))*int64(rng.IntN(B+1))
		case 1: // inside: an overwrite
			if L > 0 {
				off = rng.Int64N(L)
			}
		case 2: // near a checksum page boundary
			off = int64(1+rng.IntN(2))*pageBytes - int64(rng.IntN(2*B))
		case 3: // anywhere (sparse)
			off = rng.Int64N(3 * pageBytes)
		case 4: // block aligned
			off = rng.Int64N(3*crcsPerPage) * B
		default: // near the last partial block
			off = max(0, L-int64(rng.IntN(B)))
		}
		var n int64
		switch rng.IntN(8) {
		case 0:
			n = 0
		case 1:
			n = rng.Int64N(300 << 10)
		case 2:
			n = B
		default:
			n = rng.Int64N(3 * B)
		}
		off = min(off, 3*pageBytes)
		n = min(n, 3*pageBytes-off)
		m.mustWrite(t, s, rng, id, off, randBytes(rng, int(n)))
		m.check(t, s, id)

		switch rng.IntN(40) {
		case 0:
			s = reopen(t, s)
			for _, id := range chunks {
				m.check(t, s, id)
			}
		case 1:
			if _, err := s.Verify(id); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
	s = reopen(t, s)
	var total, count int64
	for _, id := range chunks {
		m.check(t, s, id)
		if _, err := s.Verify(id); err != nil {
			t.Fatal(err)
		}
		if m.info[id].Version > 0 {
			total += int64(len(m.data[id]))
			count++
		}
	}
	if b, n := s.Usage(); b != total || n != count {
		t.Fatalf("Usage = %d, %d; want %d, %d", b, n, total, count)
	}
	var listed []ids.ChunkID
	if err := s.List(func(id ids.ChunkID, in Info) bool {
		if in != m.info[id] {
			t.Errorf("List: %v %+v, want %+v", id, in, m.info[id])
		}
		listed = append(listed, id)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(listed) != int(count) {
		t.Fatalf("List gave %v, want %d chunks", listed, count)
	}
}

// TestHoleAfterExtendedBlock covers a block that grows with zeros: the old
// last partial block when a later write lands beyond it, by zero-length
// extension too.
func TestHoleAfterExtendedBlock(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(2, 2))
	m := newModel()
	B := int64(s.BlockSize())
	m.mustWrite(t, s, rng, 9, 0, randBytes(rng, 1000))
	m.mustWrite(t, s, rng, 9, 3*B+5, randBytes(rng, 100))
	m.check(t, s, 9)
	m.mustWrite(t, s, rng, 9, 5*B+200, nil) // extends to 5B+200 with a hole
	m.check(t, s, 9)
	m.mustWrite(t, s, rng, 9, 5*B+100, randBytes(rng, 10)) // inside the hole tail
	m.check(t, s, 9)
	if _, err := s.Verify(9); err != nil {
		t.Fatal(err)
	}
}

func TestReopenKeepsBlockSize(t *testing.T) {
	dir := testDir(t)
	s := openStore(t, Options{Dir: dir, BlockSize: 8192})
	s.Close()
	s2, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.BlockSize() != 8192 {
		t.Fatalf("block size after reopen %d", s2.BlockSize())
	}
	if sp, err := s2.Space(); err != nil || sp.Total <= 0 || sp.Avail <= 0 || sp.Avail > sp.Total {
		t.Fatalf("Space = %+v, %v", sp, err)
	}
	s2.Close()
	if _, err := Open(Options{Dir: dir, BlockSize: 4096}); err == nil {
		t.Fatal("reopen with another block size succeeded")
	}
}

func TestTagPersists(t *testing.T) {
	s := openStore(t, Options{})
	w, err := s.BeginWrite(5, 0, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.Place(0, []byte("abc"))
	w.SetTag(0xfeed)
	if in, err := w.Commit(); err != nil || in.Tag != 0xfeed {
		t.Fatalf("commit: %+v %v", in, err)
	}
	s = reopen(t, s)
	if in, _ := s.Stat(5); in != (Info{Version: 1, Length: 3, Tag: 0xfeed}) {
		t.Fatalf("after reopen: %+v", in)
	}
}
