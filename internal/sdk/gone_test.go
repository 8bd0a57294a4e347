package sdk_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestWriteAfterTruncateElsewhere: a client writing through a layout
// cached before another client truncated the file below that chunk is
// refused by the nodes (the chunk was deleted: tombstones), fetches a
// fresh layout and writes a new chunk; the deleted one is not re-created.
func TestWriteAfterTruncateElsewhere(t *testing.T) {
	c := startCluster(t, 3)
	a := newClient(t, c, sdk.Options{})
	b := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(6, 15))
	data := randBytes(rng, 2*testChunk)
	f, err := a.Create(ctx, "/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	lr, err := c.Meta.Layout(1, metaapi.LayoutReq{Ino: f.Attr().Ino, Off: testChunk, Len: 1, Who: metaapi.Who{}})
	if err != nil {
		t.Fatal(err)
	}
	old := lr.Chunks[0].Chunk
	fb, err := b.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	if err := fb.Truncate(ctx, testChunk); err != nil {
		t.Fatal(err)
	}
	holders := func(id ids.ChunkID) int {
		n := 0
		for _, nd := range c.Nodes {
			if info, err := nd.Store().Stat(id); err != nil || info.Version != 0 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for holders(old) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("chunk %v still on %d nodes after the truncate", old, holders(old))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// a's cached layout names the deleted chunk.
	tail := randBytes(rng, 4096)
	if _, err := f.WriteAt(tail, testChunk); err != nil {
		t.Fatalf("write past the truncation through a stale layout: %v", err)
	}
	if holders(old) != 0 {
		t.Errorf("deleted chunk %v re-created", old)
	}
	for i, nd := range c.Nodes {
		if _, ok := nd.Store().Tombstoned(old); !ok {
			t.Errorf("node %d keeps no tombstone for chunk %v", i, old)
		}
	}
	fr, err := b.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, testChunk+len(tail))
	if n, err := fr.ReadAt(got, 0); err != nil || n != len(got) || fr.Size() != int64(len(got)) {
		t.Fatalf("read back: %d bytes of %d, size %d, %v", n, len(got), fr.Size(), err)
	}
	if !bytes.Equal(got[:testChunk], data[:testChunk]) || !bytes.Equal(got[testChunk:], tail) {
		t.Fatal("read back other bytes")
	}
}
