package store

import (
	"errors"
	"testing"
)

func mustHead(t *testing.T, s *Store, off, n int64, tag uint64) *Write {
	t.Helper()
	w, err := s.BeginHead(7, off, n, tag)
	if err != nil {
		t.Fatalf("BeginHead [%d,+%d) tag %x: %v", off, n, tag, err)
	}
	return w
}

// TestDoubtAdmission: after a head write is aborted in doubt, the head
// gives its version again only to the same write, the next one only to a
// write covering it, refuses the rest, and the record survives a restart
// until a commit resolves it.
func TestDoubtAdmission(t *testing.T) {
	s := openStore(t, Options{})
	w := mustHead(t, s, 0, 100, 0xA)
	w.Place(0, make([]byte, 100))
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	w = mustHead(t, s, 100, 100, 0xB) // v2, in doubt
	if w.Version() != 2 || w.Base() != 1 {
		t.Fatalf("v%d base %d", w.Version(), w.Base())
	}
	if err := w.AbortInDoubt(); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s)
	if d, ok := s.Doubt(7); !ok || d != (Doubt{Base: 1, Version: 2, Tag: 0xB, Off: 100, End: 200}) {
		t.Fatalf("doubt after reopen: %+v %v", d, ok)
	}
	// Neither retry nor cover: refused, retryably.
	for _, c := range []struct {
		off, n int64
		tag    uint64
	}{{0, 150, 0xC}, {150, 100, 0xC}, {100, 50, 0xB}, {0, 0, 0}} {
		if _, err := s.BeginHead(7, c.off, c.n, c.tag); !errors.Is(err, ErrInDoubt) {
			t.Fatalf("[%d,+%d) tag %x: %v, want ErrInDoubt", c.off, c.n, c.tag, err)
		}
	}
	// The same write gets its version back.
	w = mustHead(t, s, 100, 100, 0xB)
	if w.Version() != 2 || w.Base() != 1 {
		t.Fatalf("retry: v%d base %d", w.Version(), w.Base())
	}
	w.Abort() // plain abort: the doubt stays
	// A covering write skips the doubtful version and fails in doubt too:
	// the span widens to its version, the base stays.
	w = mustHead(t, s, 50, 200, 0xD)
	if w.Version() != 3 || w.Base() != 1 {
		t.Fatalf("cover: v%d base %d", w.Version(), w.Base())
	}
	w.AbortInDoubt()
	if d, _ := s.Doubt(7); d != (Doubt{Base: 1, Version: 3, Tag: 0xD, Off: 50, End: 250}) {
		t.Fatalf("doubt after a covering write failed: %+v", d)
	}
	if _, err := s.BeginHead(7, 100, 100, 0xB); !errors.Is(err, ErrInDoubt) {
		t.Fatalf("the first write, now covered by a later doubt: %v", err)
	}
	w = mustHead(t, s, 0, 300, 0xE)
	if w.Version() != 4 || w.Base() != 1 {
		t.Fatalf("second cover: v%d base %d", w.Version(), w.Base())
	}
	w.Place(0, make([]byte, 300))
	if info, err := w.Commit(); err != nil || info.Version != 4 {
		t.Fatalf("commit: %+v %v", info, err)
	}
	if d, ok := s.Doubt(7); ok {
		t.Fatalf("doubt after a covering commit: %+v", d)
	}
	s = reopen(t, s)
	if _, ok := s.Doubt(7); ok {
		t.Fatal("doubt back after reopen")
	}
	w = mustHead(t, s, 0, 10, 0xF)
	if w.Version() != 5 {
		t.Fatalf("after resolution: v%d", w.Version())
	}
	w.Abort()
}

// TestFollowSkipsDoubtfulVersions: a replica accepts a write at any
// version from its base, and refuses one whose base it has not reached or
// whose version it has.
func TestFollowSkipsDoubtfulVersions(t *testing.T) {
	s := openStore(t, Options{})
	w, err := s.BeginFollow(7, 0, 10, 3, 0) // at v0, skipping 1 and 2
	if err != nil {
		t.Fatal(err)
	}
	w.Place(0, make([]byte, 10))
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	for _, c := range [][2]uint64{{3, 2}, {5, 4}, {2, 0}} {
		if _, err := s.BeginFollow(7, 0, 10, c[0], c[1]); !errors.Is(err, ErrStale) {
			t.Fatalf("v%d base %d at v3: %v, want ErrStale", c[0], c[1], err)
		}
	}
	if _, err := s.BeginFollow(7, 0, 10, 3, 3); err == nil {
		t.Fatal("base == version accepted")
	}
	if w, err = s.BeginFollow(7, 0, 10, 6, 3); err != nil {
		t.Fatal(err)
	}
	w.Abort()
}

// TestAbortInDoubtNeedsHead: a follower's write cannot leave a doubt.
func TestAbortInDoubtNeedsHead(t *testing.T) {
	s := openStore(t, Options{})
	w, err := s.BeginWrite(7, 0, 10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AbortInDoubt(); err == nil {
		t.Fatal("follower recorded a doubt")
	}
	if _, ok := s.Doubt(7); ok {
		t.Fatal("doubt recorded")
	}
	if w, err = s.BeginWrite(7, 0, 10, 1); err != nil {
		t.Fatalf("chunk not released: %v", err)
	}
	w.Abort()
}
