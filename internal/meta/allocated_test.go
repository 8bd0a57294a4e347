package meta

import (
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"

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

// TestCheckFindsChunkCountDrift: st_blocks trusts a file's chunk count,
// so `sluice check` compares it with the file's chunk records: a count
// off by one either way, or chunks counted that have no record, is a
// metadata problem. A consistent namespace (chunks made, truncated,
// replaced by a rename, removed) has none.
func TestCheckFindsChunkCountDrift(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/a", "/b", "/c", "/d")
	for _, p := range []string{"/a", "/b", "/c", "/d"} {
		f.layout(p, 0, 3*testChunkSize, true)
	}
	for _, size := range []int64{3 * testChunkSize, testChunkSize + 1} {
		if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/a"), Size: &size, Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	if a := f.attr("/a"); a.Chunks != 2 {
		t.Fatalf("truncated to 2 chunks: counts %d", a.Chunks)
	}
	if err := f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/"), OldName: "d", NewParent: f.ino("/"), NewName: "c", Who: root}); err != nil {
		t.Fatal(err)
	}
	if res := f.checkNS(false); len(res.Problems) != 0 {
		t.Fatalf("consistent namespace: %+v", res.Problems)
	}
	tamper := func(path string, chunks int64) {
		t.Helper()
		in, err := loadInode(f.s.db, f.ino(path))
		if err != nil {
			t.Fatal(err)
		}
		in.Chunks = chunks
		if err := f.s.db.Set(inodeKey(in.Ino), mustJSON(in), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	tamper("/a", 3) // 2 records
	tamper("/b", 2) // 3 records
	f.tree("/e")
	tamper("/e", 5) // none
	p := byKind(f.checkNS(false))[metaapi.CheckMetadata]
	if p.Count != 3 {
		t.Fatalf("3 files counting chunks they do not have: %+v", p)
	}
	for _, want := range []string{"/a: counts 3 chunks, has 2", "/b: counts 2 chunks, has 3", "/e: counts 5 chunks, has 0"} {
		if !slices.Contains(p.Examples, want) {
			t.Errorf("examples %q lack %q", p.Examples, want)
		}
	}
	tamper("/a", 2)
	tamper("/b", 3)
	tamper("/e", 0)
}
