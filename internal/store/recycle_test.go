package store

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestRecycledFilesNeverLeakOldData: new chunks built from recycled files
// (full of a deleted chunk's bytes) read exactly as written, with every
// hole and every byte past the end reading as zeros or not at all.
func TestRecycledFilesNeverLeakOldData(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096, MaxChunkSize: 8 << 20})
	rng := rand.New(rand.NewPCG(31, 32))
	old := bytes.Repeat([]byte{0xEE}, 3<<20)
	m := newModel()
	for round := 0; round < 20; round++ {
		// Fill a chunk with 0xEE and delete it: its file joins the pool.
		id := ids.ChunkID(1000 + round)
		if _, err := write(s, rng, id, 0, old, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
		if n, _ := s.Recycled(); n == 0 {
			t.Fatal("deleted chunk's file was not recycled")
		}
		// A new chunk takes it: written sparse, in pieces, some direct.
		nid := ids.ChunkID(round + 1)
		for k := 0; k < 3; k++ {
			L := int64(len(m.data[nid]))
			off := L + rng.Int64N(300000)
			if k == 0 {
				off = rng.Int64N(100000) // a hole at the start of the chunk
			}
			m.mustWrite(t, s, rng, nid, off, randBytes(rng, 1+rng.IntN(700000)))
			m.check(t, s, nid)
		}
		if _, err := s.Verify(nid); err != nil {
			t.Fatal(err)
		}
	}
	s = reopen(t, s)
	for id := range m.data {
		m.check(t, s, id)
	}
}

func TestRecycleAbortedNewChunkAndBound(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096, RecycleBytes: 5 << 20})
	rng := rand.New(rand.NewPCG(1, 9))
	// An aborted first write of a chunk gives its file to the pool.
	w, err := s.BeginWrite(5, 0, 2<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := placeAll(w, rng, 0, randBytes(rng, 1<<20)); err != nil {
		t.Fatal(err)
	}
	w.Abort()
	if n, b := s.Recycled(); n != 1 || b == 0 {
		t.Fatalf("after an aborted new chunk: pool %d files, %d bytes", n, b)
	}
	if info, _ := s.Stat(5); info != (Info{}) {
		t.Fatalf("aborted chunk exists: %+v", info)
	}
	// The pool never holds more than its bound.
	for i := 0; i < 6; i++ {
		id := ids.ChunkID(100 + i)
		if _, err := write(s, rng, id, 0, randBytes(rng, 2<<20), 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(id); err != nil {
			t.Fatal(err)
		}
		if _, b := s.Recycled(); b > 5<<20 {
			t.Fatalf("pool holds %d bytes, bound 5 MiB", b)
		}
	}
	// It survives a restart.
	n, b := s.Recycled()
	s = reopen(t, s)
	if n2, b2 := s.Recycled(); n2 != n || b2 != b {
		t.Fatalf("pool after reopen: %d/%d, before %d/%d", n2, b2, n, b)
	}
	// Disabled: deleted files are removed.
	off := openStore(t, Options{RecycleBytes: -1})
	if _, err := write(off, rng, 1, 0, randBytes(rng, 100000), 0); err != nil {
		t.Fatal(err)
	}
	off.Delete(1)
	if n, _ := off.Recycled(); n != 0 {
		t.Fatal("recycling disabled but a file was kept")
	}
}
