package store

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

var errCrash = errors.New("simulated crash")

// crashWrite runs a write whose Commit is stopped by a hook as if the
// process died there, then "restarts": closes the store without any
// cleanup of the write and opens it again.
func crashWrite(t *testing.T, s *Store, setHook func(*hooks), id ids.ChunkID, off int64, data []byte) *Store {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(off), 1))
	w, err := s.BeginWrite(id, off, int64(len(data)), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := placeAll(w, rng, off, data); err != nil {
		t.Fatal(err)
	}
	setHook(&s.hooks)
	if _, err := w.Commit(); !errors.Is(err, errCrash) {
		t.Fatalf("Commit = %v, want the simulated crash", err)
	}
	w.Abort() // releases file descriptors only: the process is "dead"
	return reopen(t, s)
}

func TestCrashAfterIndexCommitReplaysRedo(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  int64
		n    int
	}{
		{"overwrite", 5000, 20000},
		{"straddle", 90000, 30000},
		{"append", 100000, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, Options{})
			rng := rand.New(rand.NewPCG(5, 5))
			m := newModel()
			m.mustWrite(t, s, rng, 3, 0, randBytes(rng, 100000))
			data := randBytes(rng, tc.n)
			s = crashWrite(t, s, func(h *hooks) { h.afterIndexCommit = func() error { return errCrash } },
				3, tc.off, data)
			m.apply(3, tc.off, data)
			m.check(t, s, 3)
			if _, err := s.Verify(3); err != nil {
				t.Fatal(err)
			}
			assertNoRedo(t, s)
			m.mustWrite(t, s, rng, 3, 10, randBytes(rng, 10)) // and life goes on
			m.check(t, s, 3)
		})
	}
}

func TestCrashBeforeIndexCommitKeepsOld(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  int64
		n    int
	}{
		{"overwrite", 5000, 20000},
		{"straddle", 90000, 30000},
		{"append", 100000, 5000},
		{"sparse", 300000, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t, Options{})
			rng := rand.New(rand.NewPCG(6, 6))
			m := newModel()
			m.mustWrite(t, s, rng, 3, 0, randBytes(rng, 100000))
			s = crashWrite(t, s, func(h *hooks) { h.beforeIndexCommit = func() error { return errCrash } },
				3, tc.off, randBytes(rng, tc.n))
			m.check(t, s, 3)
			assertNoRedo(t, s)
			// The version the crashed write would have taken is free, and
			// its leftovers do not show through a new hole.
			m.mustWrite(t, s, rng, 3, 400000, randBytes(rng, 10))
			m.check(t, s, 3)
			if _, err := s.Verify(3); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRedoWithStagingGone: the commit applied and synced the staged bytes
// and removed the staging file, but the unsynced redo delete was lost.
func TestRedoWithStagingGone(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(8, 8))
	m := newModel()
	m.mustWrite(t, s, rng, 4, 0, randBytes(rng, 50000))
	data := randBytes(rng, 1000)
	dir := s.dir
	s = crashWrite(t, s, func(h *hooks) {
		h.afterIndexCommit = func() error {
			// Do the apply by hand, then "crash" before deleting the record.
			f, _ := os.OpenFile(s.chunkPath(4), os.O_WRONLY, 0)
			f.WriteAt(data, 100)
			f.Close()
			ents, _ := os.ReadDir(filepath.Join(dir, stagingDir))
			for _, e := range ents {
				os.Remove(filepath.Join(dir, stagingDir, e.Name()))
			}
			return errCrash
		}
	}, 4, 100, data)
	m.apply(4, 100, data)
	m.check(t, s, 4)
	assertNoRedo(t, s)
}

// TestApplyFailureIsRepairedOnNextUse: an I/O error applying staged bytes
// after the commit point leaves a pending redo that the next user of the
// chunk applies before seeing it.
func TestApplyFailureIsRepairedOnNextUse(t *testing.T) {
	s := openStore(t, Options{})
	rng := rand.New(rand.NewPCG(9, 9))
	m := newModel()
	m.mustWrite(t, s, rng, 6, 0, randBytes(rng, 50000))
	fail := true
	s.hooks.applyFault = func() error {
		if fail {
			return errors.New("injected EIO")
		}
		return nil
	}
	data := randBytes(rng, 3000)
	in, err := write(s, rng, 6, 1234, data, 0)
	if err == nil {
		t.Fatal("commit with a failing apply returned no error")
	}
	if want := m.apply(6, 1234, data); in != want {
		t.Fatalf("commit returned %+v, want %+v (it is committed)", in, want)
	}
	fail = false
	m.check(t, s, 6)
	assertNoRedo(t, s)
	// A fresh failure, then a restart instead of a next use.
	fail = true
	data = randBytes(rng, 3000)
	if _, err := write(s, rng, 6, 40000, data, 0); err == nil {
		t.Fatal("commit with a failing apply returned no error")
	}
	m.apply(6, 40000, data)
	fail = false
	s = reopen(t, s)
	m.check(t, s, 6)
}

func assertNoRedo(t *testing.T, s *Store) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.dir, stagingDir))
	if err != nil || len(ents) != 0 {
		t.Fatalf("staging dir: %v, %v", ents, err)
	}
	n := 0
	it, _ := s.db.NewIter(nil)
	for ok := it.First(); ok; ok = it.Next() {
		if it.Key()[0] == kindRedo {
			n++
		}
	}
	it.Close()
	if n != 0 {
		t.Fatalf("%d redo records left", n)
	}
}
