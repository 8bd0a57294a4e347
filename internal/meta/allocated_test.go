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
	if a.Chunks != 1 || a.Allocated() != 4096 {
		t.Fatalf("4 KiB written past a hole of 10 chunks: %d chunks, %d bytes allocated", a.Chunks, a.Allocated())
	}
	f.layout("/a", 0, 3*testChunkSize, true)
	f.layout("/a", 0, 3*testChunkSize, true) // existing: counted once
	if a := f.attr("/a"); a.Chunks != 4 || a.Allocated() != 3*testChunkSize+4096 {
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

// TestFileKeepsItsLastChunk: a file's attributes keep one past the index
// of its last chunk (ChunkEnd) as writes make chunks and truncation drops
// them, so st_blocks counts the last chunk up to the file's end only:
// writes past holes and below the last chunk, rewrites, truncation down
// (into a chunk, onto a boundary, to nothing) and up.
func TestFileKeepsItsLastChunk(t *testing.T) {
	const cs = testChunkSize
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/a")
	ino := f.ino("/a")
	resize := func(size int64) {
		t.Helper()
		if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	write := func(off, n int64) { // what a writer asks meta: a layout, then the size
		t.Helper()
		f.layout("/a", off, n, true)
		if a := f.attr("/a"); off+n > a.Size {
			resize(off + n)
		}
	}
	want := func(step string, chunks, end, allocated int64) {
		t.Helper()
		a := f.attr("/a")
		if a.Chunks != chunks || a.ChunkEnd != end || a.Allocated() != allocated {
			t.Fatalf("%s (size %d): %d chunks ending at %d, %d bytes allocated; want %d, %d, %d",
				step, a.Size, a.Chunks, a.ChunkEnd, a.Allocated(), chunks, end, allocated)
		}
	}
	want("new file", 0, 0, 0)
	write(10*cs, 4096)
	want("4 KiB past a hole of 10 chunks", 1, 11, 4096)
	write(3*cs+10, 100)
	want("100 bytes into chunk 3, below the last", 2, 11, cs+4096)
	write(10*cs, 4096)
	write(3*cs, 10)
	want("rewrites", 2, 11, cs+4096)
	resize(5*cs + 7)
	want("truncated below chunk 10: chunk 3 is the last, whole", 1, 4, cs)
	resize(3*cs + 50)
	want("truncated into chunk 3", 1, 4, 50)
	resize(20 * cs)
	want("grown by truncation: chunk 3 up to its end", 1, 4, cs)
	write(12*cs-4096, 4096)
	want("4 KiB at the end of chunk 11: counts from the chunk's start", 2, 12, 2*cs)
	resize(12 * cs)
	want("truncated onto chunk 11's end", 2, 12, 2*cs)
	resize(11 * cs)
	want("truncated onto chunk 11's start", 1, 4, cs)
	resize(3 * cs)
	want("truncated onto chunk 3's start", 0, 0, 0)
	write(0, 2*cs)
	want("written from the start", 2, 2, 2*cs)
	resize(0)
	want("truncated to nothing", 0, 0, 0)
}

// TestChunkEndFromBefore: a file whose chunks were made before ChunkEnd
// was kept has it 0 (not known) and counts whole chunks; a chunk made
// below its unknown last one leaves it unknown rather than wrong (the
// check would say so), and truncation that drops chunks finds it.
func TestChunkEndFromBefore(t *testing.T) {
	const cs = testChunkSize
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/old")
	ino := f.ino("/old")
	f.layout("/old", 0, 1, true)
	f.layout("/old", 10*cs, 1, true)
	size := int64(10*cs + 1)
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
		t.Fatal(err)
	}
	in, err := loadInode(f.s.db, ino)
	if err != nil {
		t.Fatal(err)
	}
	in.ChunkEnd = 0 // as written before the field existed
	if err := f.s.db.Set(inodeKey(ino), mustJSON(in), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	f.layout("/old", 3*cs, 1, true)
	if a := f.attr("/old"); a.Chunks != 3 || a.ChunkEnd != 0 || a.Allocated() != 3*cs {
		t.Fatalf("a chunk below an unknown last one: %d chunks ending at %d, %d bytes allocated", a.Chunks, a.ChunkEnd, a.Allocated())
	}
	if res := f.checkNS(false); len(res.Problems) != 0 {
		t.Fatalf("an unknown last chunk is no problem: %+v", res.Problems)
	}
	size = 3*cs + 10
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
		t.Fatal(err)
	}
	if a := f.attr("/old"); a.Chunks != 2 || a.ChunkEnd != 4 || a.Allocated() != cs+10 {
		t.Fatalf("truncated into chunk 3: %d chunks ending at %d, %d bytes allocated", a.Chunks, a.ChunkEnd, a.Allocated())
	}
}

// TestErasureCodedFileAllocated: an erasure-coded file's chunk is a
// stripe group, its ChunkSize the group's data bytes (not what its data
// and parity units hold together), so st_blocks counts data: 8 KiB
// written past a hole of ten stripe groups of RS(3,2) is 8 KiB.
func TestErasureCodedFileAllocated(t *testing.T) {
	f := newFixture(t)
	f.addNodes(5)
	ec := metaapi.ErasureCode{Data: 3, Parity: 2, Cell: 4096}
	f.setPolicy("/", metaapi.Policy{EC: &ec})
	f.tree("/e")
	ino := f.ino("/e")
	gs := f.attr("/e").ChunkSize
	if gs != ec.ChunkSize() || gs%(int64(ec.Data)*ec.Cell) != 0 {
		t.Fatalf("RS(3,2) file: chunk size %d, want %d (whole stripes of data)", gs, ec.ChunkSize())
	}
	l := f.layout("/e", 10*gs, 8192, true)
	if len(l.Chunks) != 1 || len(l.Chunks[0].Replicas) != ec.Units() {
		t.Fatalf("one stripe group of %d units: %+v", ec.Units(), l.Chunks)
	}
	size := 10*gs + 8192
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
		t.Fatal(err)
	}
	if a := f.attr("/e"); a.Chunks != 1 || a.ChunkEnd != 11 || a.Allocated() != 8192 {
		t.Fatalf("8 KiB past 10 stripe groups: %d groups ending at %d, %d bytes allocated", a.Chunks, a.ChunkEnd, a.Allocated())
	}
	f.layout("/e", gs, 3*ec.Cell, true)
	if a := f.attr("/e"); a.Chunks != 2 || a.ChunkEnd != 11 || a.Allocated() != gs+8192 {
		t.Fatalf("and a stripe in group 1: %d groups ending at %d, %d bytes allocated", a.Chunks, a.ChunkEnd, a.Allocated())
	}
	size = gs + 5000
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: &size, Who: root}); err != nil {
		t.Fatal(err)
	}
	if a := f.attr("/e"); a.Chunks != 1 || a.ChunkEnd != 2 || a.Allocated() != 5000 {
		t.Fatalf("truncated into group 1: %d groups ending at %d, %d bytes allocated", a.Chunks, a.ChunkEnd, a.Allocated())
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
	tamperEnd := func(path string, end int64) {
		t.Helper()
		in, err := loadInode(f.s.db, f.ino(path))
		if err != nil {
			t.Fatal(err)
		}
		in.ChunkEnd = end
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
	if res := f.checkNS(false); len(res.Problems) != 0 {
		t.Fatalf("counts restored: %+v", res.Problems)
	}

	// The last chunk's index, which st_blocks trusts as much. /b's and
	// /c's chunks are 0-2, /a's 0-1; /e has none. 0 with chunks is a file
	// from before the index was kept: not known, not wrong.
	tamperEnd("/a", 3)
	tamperEnd("/b", 2)
	tamperEnd("/c", 0)
	tamperEnd("/e", 1)
	p = byKind(f.checkNS(false))[metaapi.CheckMetadata]
	if p.Count != 3 {
		t.Fatalf("3 files keeping a last chunk they do not have: %+v", p)
	}
	for _, want := range []string{"/a: keeps its last chunk at index 2, has it at 1", "/b: keeps its last chunk at index 1, has it at 2",
		"/e: keeps its last chunk at index 0, has none"} {
		if !slices.Contains(p.Examples, want) {
			t.Errorf("examples %q lack %q", p.Examples, want)
		}
	}
	tamperEnd("/a", 2)
	tamperEnd("/b", 3)
	tamperEnd("/c", 3)
	tamperEnd("/e", 0)
}
