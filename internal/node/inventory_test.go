package node

import (
	"log/slog"
	"slices"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/store"
)

func putChunk(t *testing.T, s *store.Store, id ids.ChunkID, epoch uint64) {
	t.Helper()
	w, err := s.BeginWrite(id, 0, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Planned(epoch); err != nil {
		t.Fatal(err)
	}
	if err := w.Place(0, []byte("abc")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestRetiredCopyPlacedBackIsKept: meta retires this node's copy of a
// chunk at epoch 5 (moved elsewhere), but before the node acts on it a
// reconciliation at epoch 7 places the chunk here again and copies it.
// The late deletion must not take the new copy; a copy nothing placed
// back is dropped.
func TestRetiredCopyPlacedBackIsKept(t *testing.T) {
	s, err := store.Open(store.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := &Node{store: s, log: slog.New(slog.DiscardHandler)}
	putChunk(t, s, 1, 3) // retired at 5, placed back at 7
	if _, err := s.Fence(1, 7); err != nil {
		t.Fatal(err)
	}
	putChunk(t, s, 2, 3) // retired at 5, nothing since
	done := n.applyRetired([]metaapi.RetiredCopy{{Chunk: 1, Epoch: 5}, {Chunk: 2, Epoch: 5}})
	if !slices.Equal(done, []ids.ChunkID{1, 2}) {
		t.Fatalf("settled %v, want both acknowledged", done)
	}
	if in, _ := s.Stat(1); in.Version != 1 {
		t.Fatalf("the copy placed back was deleted by the late retirement: %+v", in)
	}
	if in, _ := s.Stat(2); in.Version != 0 {
		t.Fatalf("the retired copy was kept: %+v", in)
	}
}
