package store

import (
	"errors"
	"testing"
)

// headWrite writes n zero bytes at off as a head write planned on epoch.
func headWrite(t *testing.T, s *Store, off, n int64, epoch uint64) (Info, error) {
	t.Helper()
	w, err := s.BeginHead(7, off, n, 0)
	if err != nil {
		t.Fatalf("BeginHead: %v", err)
	}
	if err := w.Planned(epoch); err != nil {
		w.Abort()
		return Info{}, err
	}
	if err := w.Place(off, make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	return w.Commit()
}

// TestFence: a fence refuses writes planned before it, at begin and at
// commit, reports the state no earlier write can change any more, never
// goes down, survives a restart and Delete, and goes with Drop.
func TestFence(t *testing.T) {
	s := openStore(t, Options{})
	if _, err := headWrite(t, s, 0, 100, 0); err != nil {
		t.Fatalf("a write to a chunk never fenced: %v", err)
	}
	st, err := s.Fence(7, 5)
	if err != nil || st.Info.Version != 1 || st.Info.Length != 100 || st.Doubt || st.Fence != 5 {
		t.Fatalf("fence: %+v %v", st, err)
	}
	if _, err := headWrite(t, s, 0, 10, 4); !errors.Is(err, ErrFenced) {
		t.Fatalf("a write planned on epoch 4 after a fence at 5: %v", err)
	}
	if _, err := headWrite(t, s, 0, 10, 0); !errors.Is(err, ErrFenced) {
		t.Fatalf("a write that names no epoch after a fence: %v", err)
	}
	if info, err := headWrite(t, s, 100, 10, 5); err != nil || info.Version != 2 {
		t.Fatalf("a write planned on the fence's epoch: %+v %v", info, err)
	}

	// A fence raised while a write is open fails its commit.
	w, err := s.BeginHead(7, 0, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Planned(5); err != nil {
		t.Fatal(err)
	}
	w.Place(0, make([]byte, 10))
	if err := w.Sync(); err != nil {
		t.Fatal(err)
	}
	st, err = s.Fence(7, 9)
	if err != nil || st.Info.Version != 2 {
		t.Fatalf("fence during a write: %+v %v", st, err)
	}
	if _, err := w.Commit(); !errors.Is(err, ErrFenced) {
		t.Fatalf("commit after a fence raised past the write's epoch: %v", err)
	}
	if info, _ := s.Stat(7); info.Version != 2 {
		t.Fatalf("the refused write changed the chunk: %+v", info)
	}
	// Lower fences change nothing.
	if st, err := s.Fence(7, 3); err != nil || st.Fence != 9 {
		t.Fatalf("lower fence: %+v %v", st, err)
	}

	s = reopen(t, s)
	if _, err := headWrite(t, s, 0, 10, 8); !errors.Is(err, ErrFenced) {
		t.Fatalf("after a restart, a write planned on epoch 8: %v", err)
	}
	if err := s.Delete(7); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Fence(7, 0); err != nil || st.Fence != 9 || st.Info.Version != 0 {
		t.Fatalf("after Delete: %+v %v, want the fence kept", st, err)
	}
}

func TestFenceAbsentChunkAndDrop(t *testing.T) {
	s := openStore(t, Options{})
	st, err := s.Fence(7, 3)
	if err != nil || st.Info.Version != 0 || st.Fence != 3 {
		t.Fatalf("fence of a chunk the node does not hold: %+v %v", st, err)
	}
	w, err := s.BeginFollow(7, 0, 10, 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Planned(2); !errors.Is(err, ErrFenced) {
		t.Fatalf("follower write planned on epoch 2: %v", err)
	}
	w.Abort()
	if err := s.Drop(7); err != nil {
		t.Fatal(err)
	}
	// A writer with a layout from before the copy moved away is still
	// refused; one planned since is not.
	if _, err := headWrite(t, s, 0, 10, 2); !errors.Is(err, ErrFenced) {
		t.Fatalf("a stale write after Drop: %v", err)
	}
	if _, err := headWrite(t, s, 0, 10, 3); err != nil {
		t.Fatalf("a current write after Drop: %v", err)
	}
	s = reopen(t, s)
	if st, err := s.Fence(7, 0); err != nil || st.Fence != 3 || st.Info.Version != 1 {
		t.Fatalf("after Drop and a restart: %+v %v", st, err)
	}
}

func TestResolveDoubt(t *testing.T) {
	s := openStore(t, Options{})
	if _, err := headWrite(t, s, 0, 100, 0); err != nil {
		t.Fatal(err)
	}
	w := mustHead(t, s, 100, 100, 0xB)
	if err := w.AbortInDoubt(); err != nil {
		t.Fatal(err)
	}
	if err := s.ResolveDoubt(7, 2); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Doubt(7); !ok {
		t.Fatal("a doubt cleared for a version the chunk is not at")
	}
	if err := s.ResolveDoubt(7, 1); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s)
	if _, ok := s.Doubt(7); ok {
		t.Fatal("doubt back after a restart")
	}
	if _, err := s.BeginHead(7, 0, 10, 0xC); err != nil {
		t.Fatalf("a head write after the doubt was resolved: %v", err)
	}
}

// TestDropAt: a drop planned at an epoch deletes the copy only if no
// later reconciliation fenced it and it is still at the version planned;
// a later repair's copy survives a late drop.
func TestDropAt(t *testing.T) {
	s := openStore(t, Options{})
	if _, err := headWrite(t, s, 0, 10, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.DropAt(7, 5, 2); !errors.Is(err, ErrStale) {
		t.Fatalf("drop at the wrong version: %v", err)
	}
	if _, err := s.Fence(7, 7); err != nil { // a later repair
		t.Fatal(err)
	}
	if err := s.DropAt(7, 5, 1); !errors.Is(err, ErrFenced) {
		t.Fatalf("a drop planned before a later fence: %v", err)
	}
	if in, _ := s.Stat(7); in.Version != 1 {
		t.Fatalf("the copy went: %+v", in)
	}
	if err := s.DropAt(7, 7, 1); err != nil {
		t.Fatal(err)
	}
	if in, _ := s.Stat(7); in.Version != 0 {
		t.Fatalf("the copy stayed: %+v", in)
	}
}
