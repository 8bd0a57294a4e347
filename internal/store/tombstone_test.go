package store

import (
	"errors"
	"os"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

func chunkFileExists(t *testing.T, s *Store, id ids.ChunkID) bool {
	t.Helper()
	_, err := os.Stat(s.chunkPath(id))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestTombstone: a tombstone deletes the chunk, refuses every later
// write at begin (creating nothing) whatever epoch it names, fails the
// commit of a write open when it came, refuses repairs' fences, and
// survives a restart.
func TestTombstone(t *testing.T) {
	s := openStore(t, Options{})
	if _, err := headWrite(t, s, 0, 100, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Tombstone(7, 1000); err != nil {
		t.Fatalf("Tombstone: %v", err)
	}
	if info, err := s.Stat(7); err != nil || info.Version != 0 {
		t.Fatalf("after the tombstone: %+v %v", info, err)
	}
	if b, n := s.Usage(); b != 0 || n != 0 {
		t.Fatalf("usage after the tombstone: %d bytes, %d chunks", b, n)
	}
	if chunkFileExists(t, s, 7) {
		t.Fatal("the chunk file is still there")
	}
	if until, ok := s.Tombstoned(7); !ok || until != 1000 {
		t.Fatalf("Tombstoned: %d %v", until, ok)
	}
	refused := func(when string) {
		t.Helper()
		for _, begin := range []func() (*Write, error){
			func() (*Write, error) { return s.BeginHead(7, 0, 10, 0) },
			func() (*Write, error) { return s.BeginWrite(7, 0, 10, 1) },
			func() (*Write, error) { return s.BeginFollow(7, 0, 10, 1, 0) },
		} {
			if w, err := begin(); !errors.Is(err, ErrDeleted) {
				if w != nil {
					w.Abort()
				}
				t.Fatalf("%s: a write to a chunk with a tombstone: %v", when, err)
			}
		}
		if chunkFileExists(t, s, 7) {
			t.Fatalf("%s: a refused write created the chunk file", when)
		}
		if _, err := s.Fence(7, 1<<40); !errors.Is(err, ErrDeleted) {
			t.Fatalf("%s: a fence of a chunk with a tombstone: %v", when, err)
		}
	}
	refused("before a restart")
	s = reopen(t, s)
	refused("after a restart")
	if until, ok := s.Tombstoned(7); !ok || until != 1000 {
		t.Fatalf("Tombstoned after a restart: %d %v", until, ok)
	}

	// A write open when the tombstone comes cannot commit; the data goes
	// once it is aborted and the deletion is repeated.
	w, err := s.BeginHead(9, 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Planned(1); err != nil {
		t.Fatal(err)
	}
	if err := w.Place(0, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := s.Tombstone(9, 1000); !errors.Is(err, ErrBusy) {
		t.Fatalf("a tombstone over an open write: %v, want ErrBusy", err)
	}
	if _, err := w.Commit(); !errors.Is(err, ErrDeleted) {
		t.Fatalf("the commit of a write open when the tombstone came: %v", err)
	}
	w.Abort()
	if err := s.Tombstone(9, 1000); err != nil {
		t.Fatalf("the deletion repeated: %v", err)
	}
	if info, _ := s.Stat(9); info.Version != 0 || chunkFileExists(t, s, 9) {
		t.Fatalf("chunk 9 after its tombstone: %+v, file %v", info, chunkFileExists(t, s, 9))
	}
}

// TestTombstoneExpiry: a tombstone refuses writes up to and including
// its until and goes once past it, for good (across a restart); it only
// ever moves later.
func TestTombstoneExpiry(t *testing.T) {
	for _, c := range []struct {
		until, now int64
		want       bool
	}{{1000, 999, false}, {1000, 1000, false}, {1000, 1001, true}, {0, 1, true}} {
		if got := expired(c.until, c.now); got != c.want {
			t.Errorf("expired(until %d, now %d) = %v", c.until, c.now, got)
		}
	}
	s := openStore(t, Options{})
	if err := s.Tombstone(7, 2000); err != nil {
		t.Fatal(err)
	}
	if err := s.Tombstone(7, 1500); err != nil { // an older deletion's word
		t.Fatal(err)
	}
	if until, _ := s.Tombstoned(7); until != 2000 {
		t.Fatalf("a tombstone moved earlier: until %d", until)
	}
	if err := s.Tombstone(8, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fence(9, 4); err != nil { // a plain fence never expires
		t.Fatal(err)
	}
	if n, err := s.ExpireTombstones(1000); err != nil || n != 0 {
		t.Fatalf("ExpireTombstones at until: %d %v", n, err)
	}
	if n, err := s.ExpireTombstones(1001); err != nil || n != 1 {
		t.Fatalf("ExpireTombstones past 8's until: %d %v", n, err)
	}
	if _, ok := s.Tombstoned(8); ok {
		t.Fatal("chunk 8's tombstone outlived its expiry")
	}
	if _, ok := s.Tombstoned(7); !ok {
		t.Fatal("chunk 7's tombstone went before its expiry")
	}
	if _, err := s.BeginHead(7, 0, 10, 0); !errors.Is(err, ErrDeleted) {
		t.Fatalf("write to chunk 7: %v", err)
	}
	s = reopen(t, s)
	if _, ok := s.Tombstoned(8); ok {
		t.Fatal("an expired tombstone came back after a restart")
	}
	if n, err := s.ExpireTombstones(1 << 62); err != nil || n != 1 {
		t.Fatalf("ExpireTombstones of the rest: %d %v", n, err)
	}
	if info, err := headWrite(t, s, 0, 10, 0); err != nil || info.Version != 1 {
		t.Fatalf("a write after the tombstone expired: %+v %v", info, err)
	}
	if st, err := s.Fence(9, 0); err != nil || st.Fence != 4 {
		t.Fatalf("the plain fence of chunk 9: %+v %v", st, err)
	}
}

// TestCollect: the inventory's deletion keeps a copy fenced after meta
// judged it (meta placed a member here since), waits for an open write,
// and keeps the fence.
func TestCollect(t *testing.T) {
	s := openStore(t, Options{})
	if _, err := headWrite(t, s, 0, 100, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Fence(7, 5); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Collect(7, 4); err != nil || ok {
		t.Fatalf("collect judged at epoch 4 of a copy fenced at 5: %v %v", ok, err)
	}
	if info, _ := s.Stat(7); info.Version != 1 {
		t.Fatalf("the copy fenced after the judgement: %+v", info)
	}
	w, err := s.BeginHead(7, 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Collect(7, 5); !errors.Is(err, ErrBusy) {
		t.Fatalf("collect with a write open: %v", err)
	}
	w.Abort()
	if ok, err := s.Collect(7, 5); err != nil || !ok {
		t.Fatalf("collect judged at the fence's epoch: %v %v", ok, err)
	}
	if info, _ := s.Stat(7); info.Version != 0 || chunkFileExists(t, s, 7) {
		t.Fatalf("after collect: %+v", info)
	}
	if _, err := headWrite(t, s, 0, 10, 4); !errors.Is(err, ErrFenced) {
		t.Fatalf("the fence after collect: %v", err)
	}
}

// TestListFrom lists from a chunk id on.
func TestListFrom(t *testing.T) {
	s := openStore(t, Options{})
	for _, id := range []ids.ChunkID{3, 5, 9} {
		w, err := s.BeginHead(id, 0, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		w.Place(0, []byte{1})
		if _, err := w.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var got []ids.ChunkID
	if err := s.ListFrom(4, func(id ids.ChunkID, _ Info) bool { got = append(got, id); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 5 || got[1] != 9 {
		t.Fatalf("ListFrom(4): %v", got)
	}
}
