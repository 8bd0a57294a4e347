package store

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

func TestErrBusy(t *testing.T) {
	s := openStore(t, Options{})
	w, err := s.BeginWrite(1, 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginWrite(1, 100, 10, 0); !errors.Is(err, ErrBusy) {
		t.Fatalf("second BeginWrite: %v, want ErrBusy", err)
	}
	if err := s.Delete(1); !errors.Is(err, ErrBusy) {
		t.Fatalf("Delete during a write: %v, want ErrBusy", err)
	}
	// Other chunks are unaffected.
	w2, err := s.BeginWrite(2, 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	w2.Abort()
	w.Abort()
	// Retryable: free again after the abort.
	w, err = s.BeginWrite(1, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginWrite(1, 0, 0, 0); err != nil {
		t.Fatalf("BeginWrite after commit: %v", err)
	}
}

func TestErrStale(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(1, 1))
	for v := uint64(1); v <= 3; v++ {
		if _, err := write(s, rng, 1, 0, []byte("abc"), v); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []uint64{1, 3, 5} {
		_, err := s.BeginWrite(1, 0, 1, v)
		if !errors.Is(err, ErrStale) {
			t.Fatalf("version %d: %v, want ErrStale", v, err)
		}
		if !strings.Contains(err.Error(), "version 3, want 4") {
			t.Fatalf("ErrStale message lacks have/want: %v", err)
		}
	}
	w, err := s.BeginWrite(1, 0, 1, 0)
	if err != nil || w.Version() != 4 {
		t.Fatalf("assigned version: %v, %v", w, err)
	}
	w.Abort()
}

func TestErrRange(t *testing.T) {
	s := openStore(t, Options{MaxChunkSize: 1 << 20})
	for _, c := range []struct{ off, n int64 }{{-1, 1}, {0, -1}, {1 << 20, 1}, {1<<20 - 1, 2}, {1 << 62, 1 << 62}} {
		if _, err := s.BeginWrite(1, c.off, c.n, 0); !errors.Is(err, ErrRange) {
			t.Errorf("BeginWrite(%d, %d): %v, want ErrRange", c.off, c.n, err)
		}
	}
	if w, err := s.BeginWrite(1, 1<<20-2, 2, 0); err != nil {
		t.Errorf("write ending at MaxChunkSize: %v", err)
	} else {
		w.Abort()
	}

	w, err := s.BeginWrite(1, 100, 300, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	p := make([]byte, 100)
	bad := []struct {
		name string
		off  int64
		n    int
	}{
		{"before start", 0, 100},
		{"gap", 150, 100},
		{"beyond end", 350, 100},
		{"too long", 100, 301},
	}
	for _, b := range bad {
		if err := w.Place(b.off, make([]byte, b.n)); !errors.Is(err, ErrRange) {
			t.Errorf("Place %s: %v, want ErrRange", b.name, err)
		}
	}
	if err := w.Place(100, p); err != nil {
		t.Fatal(err)
	}
	if err := w.Place(150, p); !errors.Is(err, ErrRange) {
		t.Errorf("overlapping Place: %v, want ErrRange", err)
	}
	if err := w.Place(100, p); !errors.Is(err, ErrRange) {
		t.Errorf("repeated Place: %v, want ErrRange", err)
	}
	if _, err := w.Commit(); !errors.Is(err, ErrIncomplete) {
		t.Errorf("early Commit: %v, want ErrIncomplete", err)
	}
	// An early Commit leaves the write open: finish it.
	if err := w.Place(200, make([]byte, 200)); err != nil {
		t.Fatal(err)
	}
	if in, err := w.Commit(); err != nil || in != (Info{Version: 1, Length: 400}) {
		t.Fatalf("Commit = %+v, %v", in, err)
	}
	if err := w.Place(400, p); !errors.Is(err, ErrClosed) {
		t.Errorf("Place after Commit: %v, want ErrClosed", err)
	}
	if _, err := w.Commit(); !errors.Is(err, ErrClosed) {
		t.Errorf("Commit twice: %v, want ErrClosed", err)
	}

	r, err := s.OpenRead(1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Checksums(0, 2, nil); !errors.Is(err, ErrRange) {
		t.Errorf("Checksums beyond Length: %v", err)
	}
	if _, err := r.Checksums(-1, 1, nil); !errors.Is(err, ErrRange) {
		t.Errorf("Checksums(-1): %v", err)
	}
	if _, err := r.ReadAt(p, -1); err == nil {
		t.Errorf("ReadAt negative offset succeeded")
	}
}

func TestErrClosed(t *testing.T) {
	s := openStore(t, Options{})
	w, err := s.BeginWrite(1, 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Place(0, []byte{1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Commit after Close: %v", err)
	}
	w.Abort()
	if _, err := s.BeginWrite(2, 0, 1, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("BeginWrite after Close: %v", err)
	}
	if _, err := s.Stat(2); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stat after Close: %v", err)
	}
	if _, err := s.OpenRead(2); !errors.Is(err, ErrClosed) {
		t.Fatalf("OpenRead after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestDelete(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(1, 2))
	m := newModel()
	m.mustWrite(t, s, rng, 1, 0, randBytes(rng, 70000))
	m.mustWrite(t, s, rng, 2, 0, randBytes(rng, 100))
	if err := s.Delete(1); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(99); err != nil {
		t.Fatalf("Delete unknown: %v", err)
	}
	if b, n := s.Usage(); b != 100 || n != 1 {
		t.Fatalf("Usage after delete: %d, %d", b, n)
	}
	lo, hi := pageBounds(1)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		t.Fatal(err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		t.Errorf("checksum page %x left after Delete", it.Key())
	}
	it.Close()
	delete(m.data, 1)
	delete(m.info, 1)
	m.check(t, s, 1)
	s = reopen(t, s)
	m.check(t, s, 1)
	m.check(t, s, 2)
	// Written again from version 1, with no stale checksum pages.
	m.mustWrite(t, s, rng, 1, 50000, randBytes(rng, 10))
	m.check(t, s, 1)
}
