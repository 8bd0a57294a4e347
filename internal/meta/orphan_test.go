package meta

import (
	"context"
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// orphanExpiry reads the orphan record of ino: its lease expiry (unix ns)
// and whether there is one.
func (f *fixture) orphanExpiry(ino ids.Ino) (int64, bool) {
	f.t.Helper()
	var exp int64
	var found bool
	err := f.s.read(func(v view) error {
		raw, ok, err := getRaw(v.r, orphanKey(ino))
		if err != nil || !ok {
			return err
		}
		if len(raw) != 8 {
			f.t.Fatalf("orphan record of %d is %d bytes", ino, len(raw))
		}
		exp, found = int64(binary.BigEndian.Uint64(raw)), true
		return nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return exp, found
}

// wantOrphan fails unless ino is an orphan: no name, nlink 0, an orphan
// record, Check happy.
func (f *fixture) wantOrphan(ino ids.Ino) metaapi.Attr {
	f.t.Helper()
	a, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: ino})
	if err != nil {
		f.t.Fatalf("orphan %d: GetAttr: %v", ino, err)
	}
	if a.Nlink != 0 {
		f.t.Fatalf("orphan %d has nlink %d, want 0", ino, a.Nlink)
	}
	if _, ok := f.orphanExpiry(ino); !ok {
		f.t.Fatalf("inode %d has nlink 0 but no orphan record", ino)
	}
	if err := f.s.Check(); err != nil {
		f.t.Fatalf("Check with orphan %d: %v", ino, err)
	}
	return a
}

// wantFreed fails unless ino is gone, orphan record included.
func (f *fixture) wantFreed(ino ids.Ino) {
	f.t.Helper()
	_, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: ino})
	if !metaapi.IsCode(err, metaapi.ENOENT) {
		f.t.Fatalf("inode %d: GetAttr err = %v, want ENOENT (freed)", ino, err)
	}
	if _, ok := f.orphanExpiry(ino); ok {
		f.t.Fatalf("freed inode %d still has an orphan record", ino)
	}
	if err := f.s.Check(); err != nil {
		f.t.Fatalf("Check after freeing %d: %v", ino, err)
	}
}

func (f *fixture) release(ino ids.Ino, renew bool, who metaapi.Who) error {
	return f.s.Release(metaapi.ReleaseReq{Ino: ino, Renew: renew, Who: who})
}

func (f *fixture) rm(parent, name string, keep bool) error {
	return f.s.Remove(metaapi.RemoveReq{Parent: f.ino(parent), Name: metaapi.ByteString(name), Keep: keep, Who: root})
}

// gcQueue collects every node's deletion queue (without acknowledging).
func (f *fixture) gcQueue(nodes []ids.NodeID) []ids.ChunkID {
	f.t.Helper()
	var out []ids.ChunkID
	for _, n := range nodes {
		out = append(out, goneIDs(f.heartbeat(n))...)
	}
	slices.Sort(out)
	return out
}

func chunkIDs(r metaapi.LayoutResp) []ids.ChunkID {
	var out []ids.ChunkID
	for _, c := range r.Chunks {
		out = append(out, c.Chunk)
	}
	slices.Sort(out)
	return out
}

func TestOrphanRemoveKeepAndRelease(t *testing.T) {
	const cs = testChunkSize
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
	nodes := f.addNodes(1)
	f.tree("/d/", "/d/f", "/other")
	ino := f.ino("/d/f")
	r := f.layout("/d/f", 0, 2*cs, true)
	if _, err := f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 2 * cs, Who: root,
		Chunks: []metaapi.ChunkVersion{{Index: 0, Chunk: r.Chunks[0].Chunk, Version: 1}}}); err != nil {
		t.Fatal(err)
	}
	before := f.s.Status2()
	f.clk.Advance(time.Second)

	wantCode(t, f.rm("/d", "f", true), "")

	_, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/d"), Name: "f"})
	wantCode(t, err, metaapi.ENOENT)
	if f.exists("/d/f") {
		t.Fatal("/d/f still resolves")
	}
	if names := f.names("/d"); len(names) != 0 {
		t.Fatalf("/d lists %v", names)
	}
	a := f.wantOrphan(ino)
	if a.Size != 2*cs || a.Type != metaapi.TypeFile || a.Ctime != f.clk.Now().UnixNano() {
		t.Fatalf("orphan attr %+v", a)
	}
	if exp, _ := f.orphanExpiry(ino); exp != f.clk.Now().Add(10*time.Minute).UnixNano() {
		t.Fatalf("orphan lease expires at %d, want now + default 10m", exp)
	}
	if q := f.gcQueue(nodes); len(q) != 0 {
		t.Fatalf("orphan's chunks queued for deletion: %v", q)
	}
	if st := f.s.Status2(); st.Files != before.Files || st.Chunks != before.Chunks {
		t.Fatalf("status with orphan %+v, before %+v", st, before)
	}

	// Still readable and writable by inode number.
	rd, err := f.s.Layout(7, metaapi.LayoutReq{Ino: ino, Off: 0, Len: 2 * cs, Who: root})
	wantCode(t, err, "")
	if !slices.Equal(chunkIDs(rd), chunkIDs(r)) || rd.Chunks[0].Version != 1 {
		t.Fatalf("read layout of orphan %+v, want chunks %v", rd.Chunks, chunkIDs(r))
	}
	wr, err := f.s.Layout(7, metaapi.LayoutReq{Ino: ino, Off: 0, Len: 3 * cs, Write: true, Who: root})
	wantCode(t, err, "")
	if len(wr.Chunks) != 3 {
		t.Fatalf("write layout of orphan: %d chunks, want 3", len(wr.Chunks))
	}
	a, err = f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 3 * cs, Who: root,
		Chunks: []metaapi.ChunkVersion{{Index: 2, Chunk: wr.Chunks[2].Chunk, Version: 1}}})
	wantCode(t, err, "")
	if a.Size != 3*cs || a.Nlink != 0 {
		t.Fatalf("commit to orphan gave %+v", a)
	}
	// ftruncate on the open, unlinked file works too.
	a, err = f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: ptr(int64(3 * cs)), Who: root})
	if err != nil || a.Nlink != 0 {
		t.Fatalf("setattr on orphan: %+v %v", a, err)
	}
	f.wantOrphan(ino)
	if st := f.s.Status2(); st.Files != before.Files || st.Chunks != before.Chunks+1 {
		t.Fatalf("status after writing the orphan %+v, before %+v", st, before)
	}

	// Releasing frees it and queues all its chunks.
	wantCode(t, f.release(ino, false, root), "")
	f.wantFreed(ino)
	if q, want := f.gcQueue(nodes), chunkIDs(wr); !slices.Equal(q, want) {
		t.Fatalf("deletion queue %v after release, want %v", q, want)
	}
	if st := f.s.Status2(); st.Files != before.Files-1 || st.Chunks != 0 {
		t.Fatalf("status after release %+v, before %+v", st, before)
	}
	_, err = f.s.Layout(7, metaapi.LayoutReq{Ino: ino, Len: 1, Who: root})
	wantCode(t, err, metaapi.ENOENT)

	// Released again (a retry), or renewed after the end: harmless.
	wantCode(t, f.release(ino, false, root), "")
	wantCode(t, f.release(ino, true, root), "")
	wantCode(t, f.release(ino, false, bob), "")
	f.wantFreed(ino)
	if _, ok := f.orphanExpiry(ino); ok {
		t.Fatal("a late renew recreated the orphan record")
	}
	if !f.exists("/other") {
		t.Fatal("unrelated file gone")
	}
}

func TestOrphanKeepWithOtherLink(t *testing.T) {
	f := newFixture(t)
	f.tree("/f")
	ino := f.ino("/f")
	if _, err := f.s.Link(metaapi.LinkReq{Ino: ino, NewParent: ids.RootIno, NewName: "g", Who: root}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.rm("/", "f", true), "")
	if a := f.attr("/g"); a.Ino != ino || a.Nlink != 1 {
		t.Fatalf("/g after keep-removing /f: %+v", a)
	}
	if _, ok := f.orphanExpiry(ino); ok {
		t.Fatal("orphan record for a file that still has a name")
	}
	// Release and renew do nothing to a file with a name.
	wantCode(t, f.release(ino, false, root), "")
	wantCode(t, f.release(ino, true, root), "")
	if a := f.attr("/g"); a.Ino != ino || a.Nlink != 1 {
		t.Fatalf("/g after release: %+v", a)
	}
	if _, ok := f.orphanExpiry(ino); ok {
		t.Fatal("renew of a named file created an orphan record")
	}
	// Removing the last name with Keep then does orphan it.
	wantCode(t, f.rm("/", "g", true), "")
	f.wantOrphan(ino)
	wantCode(t, f.release(ino, false, root), "")
	f.wantFreed(ino)
}

func TestOrphanRemoveWithoutKeepFrees(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
	nodes := f.addNodes(1)
	f.tree("/f")
	ino := f.ino("/f")
	c := f.layout("/f", 0, 1, true).Chunks[0].Chunk
	wantCode(t, f.rm("/", "f", false), "")
	f.wantFreed(ino)
	if q := f.gcQueue(nodes); !slices.Equal(q, []ids.ChunkID{c}) {
		t.Fatalf("deletion queue %v, want [%v]", q, c)
	}
	if st := f.s.Status2(); st.Files != 0 || st.Chunks != 0 {
		t.Fatalf("status %+v", st)
	}
}

func TestOrphanRenameOver(t *testing.T) {
	rename := func(f *fixture, from, to string, keep bool) error {
		return f.s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: metaapi.ByteString(from), NewParent: f.ino("/d"), NewName: metaapi.ByteString(to), Keep: keep, Who: root})
	}
	t.Run("keep", func(t *testing.T) {
		f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
		nodes := f.addNodes(1)
		f.tree("/d/", "/a", "/d/b")
		a, b := f.ino("/a"), f.ino("/d/b")
		cb := f.layout("/d/b", 0, 1, true).Chunks[0].Chunk
		wantCode(t, rename(f, "a", "b", true), "")
		if got := f.ino("/d/b"); got != a {
			t.Fatalf("/d/b is %d, want %d", got, a)
		}
		if f.attr("/d/b").Nlink != 1 {
			t.Fatal("moved file lost its link")
		}
		f.wantOrphan(b)
		if _, ok := f.orphanExpiry(a); ok {
			t.Fatal("the moved file got an orphan record")
		}
		if q := f.gcQueue(nodes); len(q) != 0 {
			t.Fatalf("replaced file's chunks queued while kept: %v", q)
		}
		if st := f.s.Status2(); st.Files != 2 {
			t.Fatalf("%d files, want 2 (moved + orphan)", st.Files)
		}
		_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: b, Len: 1, Who: root})
		wantCode(t, err, "")
		wantCode(t, f.release(b, false, root), "")
		f.wantFreed(b)
		if q := f.gcQueue(nodes); !slices.Equal(q, []ids.ChunkID{cb}) {
			t.Fatalf("deletion queue %v, want [%v]", q, cb)
		}
	})
	t.Run("without keep", func(t *testing.T) {
		f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
		nodes := f.addNodes(1)
		f.tree("/d/", "/a", "/d/b")
		b := f.ino("/d/b")
		cb := f.layout("/d/b", 0, 1, true).Chunks[0].Chunk
		wantCode(t, rename(f, "a", "b", false), "")
		f.wantFreed(b)
		if q := f.gcQueue(nodes); !slices.Equal(q, []ids.ChunkID{cb}) {
			t.Fatalf("deletion queue %v, want [%v]", q, cb)
		}
	})
	t.Run("keep, target has another link", func(t *testing.T) {
		f := newFixture(t)
		f.tree("/d/", "/a", "/d/b")
		b := f.ino("/d/b")
		f.s.Link(metaapi.LinkReq{Ino: b, NewParent: ids.RootIno, NewName: "h", Who: root})
		wantCode(t, rename(f, "a", "b", true), "")
		if h := f.attr("/h"); h.Ino != b || h.Nlink != 1 {
			t.Fatalf("/h %+v", h)
		}
		if _, ok := f.orphanExpiry(b); ok {
			t.Fatal("orphan record for a file with a name")
		}
	})
	t.Run("keep, without a target", func(t *testing.T) {
		f := newFixture(t)
		f.tree("/d/", "/a")
		a := f.ino("/a")
		wantCode(t, rename(f, "a", "new", true), "")
		if got := f.attr("/d/new"); got.Ino != a || got.Nlink != 1 {
			t.Fatalf("/d/new %+v", got)
		}
		if _, ok := f.orphanExpiry(a); ok {
			t.Fatal("orphan record after a plain move")
		}
	})
	t.Run("keep, target is another name of the source", func(t *testing.T) {
		f := newFixture(t)
		f.tree("/d/", "/a")
		a := f.ino("/a")
		f.s.Link(metaapi.LinkReq{Ino: a, NewParent: f.ino("/d"), NewName: "b", Who: root})
		wantCode(t, rename(f, "a", "b", true), "")
		if got := f.attr("/d/b"); got.Ino != a || got.Nlink != 2 {
			t.Fatalf("/d/b %+v", got)
		}
		if _, ok := f.orphanExpiry(a); ok {
			t.Fatal("orphan record after a no-op rename")
		}
	})
}

func TestOrphanLease(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1; o.OrphanLease = time.Minute })
	nodes := f.addNodes(1)
	f.tree("/f", "/g", "/h")
	ino, short, named := f.ino("/f"), f.ino("/g"), f.ino("/h")
	c := f.layout("/f", 0, 1, true).Chunks[0].Chunk
	cg := f.layout("/g", 0, 1, true).Chunks[0].Chunk
	t0 := f.clk.Now()
	wantCode(t, f.rm("/", "f", true), "")
	wantCode(t, f.rm("/", "g", true), "")
	if exp, _ := f.orphanExpiry(ino); exp != t0.Add(time.Minute).UnixNano() {
		t.Fatalf("expiry %v, want t0+1m", time.Duration(exp-t0.UnixNano()))
	}

	// Within the lease, the sweep leaves it.
	f.clk.Advance(30 * time.Second)
	f.s.SweepOrphans()
	f.wantOrphan(ino)
	f.wantOrphan(short)

	// Renewing extends it from now.
	wantCode(t, f.release(ino, true, root), "")
	if exp, _ := f.orphanExpiry(ino); exp != t0.Add(90*time.Second).UnixNano() {
		t.Fatalf("renewed expiry t0+%v, want t0+1m30s", time.Duration(exp-t0.UnixNano()))
	}
	f.wantOrphan(ino)

	// Past the original lease: the renewed orphan stays, the other goes.
	f.clk.Advance(45 * time.Second) // t0+75s
	f.s.SweepOrphans()
	f.wantOrphan(ino)
	f.wantFreed(short)
	if q := f.gcQueue(nodes); !slices.Equal(q, []ids.ChunkID{cg}) {
		t.Fatalf("deletion queue %v, want [%v]", q, cg)
	}
	f.heartbeat(nodes[0], cg)

	// Past the renewed lease: freed.
	f.clk.Advance(16 * time.Second) // t0+91s
	f.s.SweepOrphans()
	f.wantFreed(ino)
	if q := f.gcQueue(nodes); !slices.Equal(q, []ids.ChunkID{c}) {
		t.Fatalf("deletion queue %v, want [%v]", q, c)
	}
	if a := f.attr("/h"); a.Ino != named || a.Nlink != 1 {
		t.Fatalf("sweep touched a named file: %+v", a)
	}
	if st := f.s.Status2(); st.Files != 1 || st.Chunks != 0 {
		t.Fatalf("status after sweeping %+v", st)
	}
	// A release after the sweep is a no-op.
	wantCode(t, f.release(ino, false, root), "")
	wantCode(t, f.release(ino, true, root), "")
	f.wantFreed(ino)
}

func TestOrphanLeaseBackgroundSweeper(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.OrphanLease = time.Minute; o.SweepInterval = 5 * time.Millisecond })
	f.tree("/f")
	ino := f.ino("/f")
	wantCode(t, f.rm("/", "f", true), "")
	time.Sleep(30 * time.Millisecond)
	f.wantOrphan(ino)
	f.clk.Advance(2 * time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: ino}); metaapi.IsCode(err, metaapi.ENOENT) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("background sweeper did not free the lapsed orphan")
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.wantFreed(ino)
}

func TestOrphanLink(t *testing.T) {
	f := newFixture(t)
	f.tree("/d/", "/f")
	ino := f.ino("/f")
	wantCode(t, f.rm("/", "f", true), "")
	_, err := f.s.Link(metaapi.LinkReq{Ino: ino, NewParent: f.ino("/d"), NewName: "back", Who: root})
	wantCode(t, err, metaapi.ENOENT)
	if f.exists("/d/back") {
		t.Fatal("failed link left a name")
	}
	f.wantOrphan(ino)
	wantCode(t, f.release(ino, false, root), "")
	f.wantFreed(ino)
}

func TestOrphanReleasePermissions(t *testing.T) {
	f := newFixture(t)
	f.mk("/", "d", metaapi.TypeDir, 0o777, root)
	mk := func(name string, mode uint32) ids.Ino {
		a := f.mk("/d", name, metaapi.TypeFile, mode, alice)
		if err := f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/d"), Name: metaapi.ByteString(name), Keep: true, Who: alice}); err != nil {
			t.Fatal(err)
		}
		f.wantOrphan(a.Ino)
		return a.Ino
	}
	// Releasing a file that is no orphan does nothing, whoever asks.
	named := f.mk("/d", "named", metaapi.TypeFile, 0o600, alice)
	wantCode(t, f.release(named.Ino, false, bob), "")
	wantCode(t, f.release(named.Ino, true, bob), "")
	if _, ok := f.orphanExpiry(named.Ino); ok || f.attr("/d/named").Nlink != 1 {
		t.Fatal("release of a named file changed it")
	}

	private := mk("private", 0o600)
	for _, who := range []metaapi.Who{bob, carol} {
		wantCode(t, f.release(private, false, who), metaapi.EACCES)
		wantCode(t, f.release(private, true, who), metaapi.EACCES)
	}
	f.wantOrphan(private)
	wantCode(t, f.release(private, false, alice), "")
	f.wantFreed(private)

	// The owner may end it even without any permission bit.
	none := mk("none", 0)
	wantCode(t, f.release(none, true, alice), "")
	wantCode(t, f.release(none, false, bob), metaapi.EACCES)
	wantCode(t, f.release(none, false, alice), "")
	f.wantFreed(none)

	// Read or write access suffices; root always may.
	groupRead := mk("gr", 0o640)
	wantCode(t, f.release(groupRead, false, bob), metaapi.EACCES)
	wantCode(t, f.release(groupRead, false, carol), "")
	f.wantFreed(groupRead)
	otherWrite := mk("ow", 0o602)
	wantCode(t, f.release(otherWrite, false, bob), "")
	f.wantFreed(otherWrite)
	byRoot := mk("root", 0)
	wantCode(t, f.release(byRoot, false, root), "")
	f.wantFreed(byRoot)
}

func TestOrphanKeepIgnoredForNonFiles(t *testing.T) {
	f := newFixture(t)
	f.tree("/e/", "/l->e", "/p|", "/d/", "/d/e2/", "/d/l2->x", "/src/", "/srcl->y")
	before := f.s.Status2()
	check := func(ino ids.Ino) {
		t.Helper()
		f.wantFreed(ino)
	}
	e, l, p := f.ino("/e"), f.ino("/l"), f.ino("/p")
	wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "e", Dir: true, Keep: true, Who: root}), "")
	check(e)
	wantCode(t, f.rm("/", "l", true), "")
	check(l)
	wantCode(t, f.rm("/", "p", true), "")
	check(p)
	if st := f.s.Status2(); st.Dirs != before.Dirs-1 || st.Files != before.Files-2 {
		t.Fatalf("status %+v, before %+v", st, before)
	}
	// Rename over an empty directory or a symlink, with Keep.
	e2, l2 := f.ino("/d/e2"), f.ino("/d/l2")
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: "src", NewParent: f.ino("/d"), NewName: "e2", Keep: true, Who: root}), "")
	check(e2)
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: "srcl", NewParent: f.ino("/d"), NewName: "l2", Keep: true, Who: root}), "")
	check(l2)
	// Release of a freed non-file is a no-op.
	wantCode(t, f.release(e, false, root), "")
	wantCode(t, f.release(l, true, root), "")
}

func TestOrphanSurvivesRestart(t *testing.T) {
	f := newFixture(t, onDisk, func(o *Options) { o.DefaultReplicas = 1; o.OrphanLease = time.Minute })
	nodes := f.addNodes(1)
	f.tree("/f", "/g")
	ino, other := f.ino("/f"), f.ino("/g")
	lay := f.layout("/f", 0, 2*testChunkSize, true)
	f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 2 * testChunkSize, Who: root})
	f.layout("/g", 0, 1, true)
	wantCode(t, f.rm("/", "f", true), "")
	wantCode(t, f.rm("/", "g", true), "")
	exp, _ := f.orphanExpiry(ino)
	attr := f.wantOrphan(ino)
	before := f.s.Status2()

	f.reopen()

	if got := f.wantOrphan(ino); got.Ino != attr.Ino || got.Size != attr.Size || got.Ctime != attr.Ctime || got.UID != attr.UID {
		t.Fatalf("orphan after restart %+v, was %+v", got, attr)
	}
	if e, ok := f.orphanExpiry(ino); !ok || e != exp {
		t.Fatalf("lease after restart %d %v, was %d", e, ok, exp)
	}
	if st := f.s.Status2(); st.Files != before.Files || st.Chunks != before.Chunks {
		t.Fatalf("status after restart %+v, before %+v", st, before)
	}
	rd, err := f.s.Layout(1, metaapi.LayoutReq{Ino: ino, Len: 2 * testChunkSize, Who: root})
	wantCode(t, err, "")
	if !slices.Equal(chunkIDs(rd), chunkIDs(lay)) {
		t.Fatalf("orphan's chunks after restart %v, want %v", chunkIDs(rd), chunkIDs(lay))
	}
	// The lease still runs after a restart: the sweep frees both.
	f.clk.Advance(30 * time.Second)
	f.s.SweepOrphans()
	f.wantOrphan(ino)
	f.wantOrphan(other)
	wantCode(t, f.release(other, false, root), "")
	f.wantFreed(other)
	f.clk.Advance(31 * time.Second)
	f.reopen()
	f.s.SweepOrphans()
	f.wantFreed(ino)
	q := f.gcQueue(nodes)
	for _, c := range chunkIDs(lay) {
		if !slices.Contains(q, c) {
			t.Fatalf("chunk %v of the swept orphan not queued (queue %v)", c, q)
		}
	}
	if st := f.s.Status2(); st.Files != 0 || st.Chunks != 0 {
		t.Fatalf("status %+v", st)
	}
}

func TestOrphanHTTP(t *testing.T) {
	f, srv := newHTTP(t)
	c := client(t, srv, metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)))
	ctx := context.Background()
	f.tree("/f", "/a", "/b")
	ino, b := f.ino("/f"), f.ino("/b")
	wantCode(t, c.Call(ctx, metaapi.OpRemove, metaapi.RemoveReq{Parent: ids.RootIno, Name: "f", Keep: true, Who: root}, nil), "")
	f.wantOrphan(ino)
	wantCode(t, c.Call(ctx, metaapi.OpRename, metaapi.RenameReq{OldParent: ids.RootIno, OldName: "a", NewParent: ids.RootIno, NewName: "b", Keep: true, Who: root}, nil), "")
	f.wantOrphan(b)
	f.clk.Advance(time.Minute)
	wantCode(t, c.Call(ctx, metaapi.OpRelease, metaapi.ReleaseReq{Ino: ino, Renew: true, Who: root}, nil), "")
	if exp, _ := f.orphanExpiry(ino); exp != f.clk.Now().Add(10*time.Minute).UnixNano() {
		t.Fatal("renew over HTTP did not extend the lease")
	}
	wantCode(t, c.Call(ctx, metaapi.OpRelease, metaapi.ReleaseReq{Ino: ino, Who: root}, nil), "")
	f.wantFreed(ino)
	wantCode(t, c.Call(ctx, metaapi.OpRelease, metaapi.ReleaseReq{Ino: b, Who: root}, nil), "")
	f.wantFreed(b)
}

// O_TMPFILE: a file made with no name is an orphan from birth; Link names
// it (unless it was made exclusive), Release or a lapsed lease frees it.
func TestTmpfile(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1; o.OrphanLease = time.Minute })
	f.addNodes(1)
	f.tree("/d/")
	mk := func(excl bool, who metaapi.Who) (metaapi.Attr, error) {
		return f.s.Create(metaapi.CreateReq{Parent: f.ino("/d"), Type: metaapi.TypeFile, Mode: 0o600, Tmpfile: true, Exclusive: excl, Who: who})
	}
	files := f.s.Status2().Files
	a, err := mk(false, root)
	if err != nil {
		t.Fatal(err)
	}
	f.wantOrphan(a.Ino)
	if names := f.names("/d"); len(names) != 0 {
		t.Fatalf("a tmpfile shows in its directory: %v", names)
	}
	if a.Policy == nil || a.Policy.Replicas != 1 || a.Mode != 0o600 {
		t.Fatalf("tmpfile attributes %+v", a)
	}
	// Written through its layout like any file.
	if _, err := f.s.Layout(7, metaapi.LayoutReq{Ino: a.Ino, Off: 0, Len: 1, Write: true, Who: root}); err != nil {
		t.Fatalf("layout of a tmpfile: %v", err)
	}
	// Only its owner may name it (meta cannot see who holds it open).
	_, err = f.s.Link(metaapi.LinkReq{Ino: a.Ino, NewParent: f.ino("/d"), NewName: "stolen", Who: alice})
	wantCode(t, err, metaapi.EPERM)
	// Linked into place: a named file, no longer an orphan; Release (the
	// close) leaves it.
	if _, err := f.s.Link(metaapi.LinkReq{Ino: a.Ino, NewParent: f.ino("/d"), NewName: "final", Who: root}); err != nil {
		t.Fatal(err)
	}
	if b := f.attr("/d/final"); b.Ino != a.Ino || b.Nlink != 1 {
		t.Fatalf("linked tmpfile: %+v", b)
	}
	if _, ok := f.orphanExpiry(a.Ino); ok {
		t.Fatal("a linked tmpfile still has an orphan record")
	}
	wantCode(t, f.release(a.Ino, false, root), "")
	f.clk.Advance(2 * time.Minute)
	f.s.SweepOrphans()
	if b := f.attr("/d/final"); b.Ino != a.Ino {
		t.Fatal("the linked tmpfile went with its lease")
	}
	// Removed again while open, it is an ordinary orphan: no name back.
	wantCode(t, f.rm("/d", "final", true), "")
	_, err = f.s.Link(metaapi.LinkReq{Ino: a.Ino, NewParent: f.ino("/d"), NewName: "again", Who: root})
	wantCode(t, err, metaapi.ENOENT)
	wantCode(t, f.release(a.Ino, false, root), "")
	f.wantFreed(a.Ino)

	// O_EXCL: never linkable; released, it is gone.
	x, err := mk(true, root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.s.Link(metaapi.LinkReq{Ino: x.Ino, NewParent: f.ino("/d"), NewName: "x", Who: root})
	wantCode(t, err, metaapi.ENOENT)
	wantCode(t, f.release(x.Ino, false, root), "")
	f.wantFreed(x.Ino)
	// A crashed owner: the lease lapses.
	y, err := mk(false, root)
	if err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(2 * time.Minute)
	f.s.SweepOrphans()
	f.wantFreed(y.Ino)
	if got := f.s.Status2().Files; got != files {
		t.Fatalf("%d files after every tmpfile went, want %d", got, files)
	}

	// Bad requests and permissions.
	_, err = f.s.Create(metaapi.CreateReq{Parent: f.ino("/d"), Name: "n", Type: metaapi.TypeFile, Tmpfile: true, Who: root})
	wantCode(t, err, metaapi.EINVAL)
	_, err = f.s.Create(metaapi.CreateReq{Parent: f.ino("/d"), Type: metaapi.TypeDir, Tmpfile: true, Who: root})
	wantCode(t, err, metaapi.EINVAL)
	_, err = mk(false, alice)
	wantCode(t, err, metaapi.EACCES)
	if err := f.s.Check(); err != nil {
		t.Fatal(err)
	}
}
