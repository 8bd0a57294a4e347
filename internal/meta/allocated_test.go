package meta

import (
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestFileCountsItsChunks: a file's attributes count its chunks as they
// are made and dropped, so st_blocks can leave holes out: a write past a
// large hole makes one chunk; truncation drops the chunks past the end.
func TestFileCountsItsChunks(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/a")
	ino := f.ino("/a")
	if a := f.attr("/a"); !a.Counted || a.Chunks != 0 {
		t.Fatalf("new file: %+v", a)
	}
	f.layout("/a", 10*testChunkSize, 4096, true)
	size := int64(10*testChunkSize + 4096)
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
		t.Fatal(err)
	}
	a := f.attr("/a")
	if a.Chunks != 1 || a.Allocated() != testChunkSize {
		t.Fatalf("4 KiB written past a hole of 10 chunks: %d chunks, %d bytes allocated", a.Chunks, a.Allocated())
	}
	f.layout("/a", 0, 3*testChunkSize, true)
	f.layout("/a", 0, 3*testChunkSize, true) // existing: counted once
	if a := f.attr("/a"); a.Chunks != 4 || a.Allocated() != 4*testChunkSize {
		t.Fatalf("4 chunks written: %d chunks, %d bytes allocated", a.Chunks, a.Allocated())
	}
	size = 2*testChunkSize - 1
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
		t.Fatal(err)
	}
	if a := f.attr("/a"); a.Chunks != 2 || a.Allocated() != size {
		t.Fatalf("truncated into chunk 1: %d chunks, %d bytes allocated", a.Chunks, a.Allocated())
	}
}
