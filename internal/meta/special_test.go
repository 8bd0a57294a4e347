package meta

import (
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Device nodes, sockets and FIFOs are inodes with no data: a type, a
// mode, owners, times and (devices) a device number.

func mknod(f *fixture, parent, name string, typ metaapi.FileType, rdev uint64, who metaapi.Who) (metaapi.Attr, error) {
	return f.s.Create(metaapi.CreateReq{Parent: f.ino(parent), Name: metaapi.ByteString(name), Type: typ, Mode: 0o640, Rdev: rdev, Exclusive: true, Who: who})
}

func TestSpecialInodes(t *testing.T) {
	f := newFixture(t, onDisk, func(o *Options) { o.DefaultReplicas = 1 })
	f.addNodes(1)
	f.tree("/d/")
	want := map[string]struct {
		typ  metaapi.FileType
		rdev uint64
	}{
		"blk":  {metaapi.TypeBlock, metaapi.Mkdev(7, 1)},
		"chr":  {metaapi.TypeChar, metaapi.Mkdev(4095, 1<<20-1)}, // the largest Linux number
		"sock": {metaapi.TypeSocket, 0},
		"fifo": {metaapi.TypeFIFO, 0},
	}
	for name, w := range want {
		a, err := mknod(f, "/d", name, w.typ, w.rdev, root)
		wantCode(t, err, "")
		if a.Type != w.typ || a.Rdev != w.rdev || a.Mode != 0o640 || a.Nlink != 1 || a.Size != 0 || a.Policy != nil || a.ChunkSize != 0 {
			t.Fatalf("%s: %+v", name, a)
		}
	}
	check := func(when string) {
		t.Helper()
		// Explicitly: the fixture checks at its end only the service it
		// opened, not one reopened.
		if err := f.s.Check(); err != nil {
			t.Fatalf("%s: the namespace check: %v", when, err)
		}
		r, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d"), Who: root})
		wantCode(t, err, "")
		if len(r.Entries) != len(want) {
			t.Fatalf("%s: %d entries, want %d", when, len(r.Entries), len(want))
		}
		for _, e := range r.Entries {
			a := f.attr("/d/" + string(e.Name))
			if w := want[string(e.Name)]; e.Type != w.typ || a.Type != w.typ || a.Rdev != w.rdev {
				t.Fatalf("%s: %s listed as %s, attr %+v; want %s %#x", when, e.Name, e.Type, a, w.typ, w.rdev)
			}
		}
	}
	check("created")
	f.reopen()
	check("after a restart")

	// They have no data: no layout, no truncation.
	for name := range want {
		_, err := f.s.Layout(1, metaapi.LayoutReq{Ino: f.ino("/d/" + name), Len: 1, Write: true, Who: root})
		wantCode(t, err, metaapi.EINVAL)
		_, err = f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/d/" + name), Size: ptr(int64(0)), Who: root})
		wantCode(t, err, metaapi.EINVAL)
	}
	// They link, rename over one another and unlink like files.
	_, err := f.s.Link(metaapi.LinkReq{Ino: f.ino("/d/blk"), NewParent: ids.RootIno, NewName: "blk2", Who: root})
	wantCode(t, err, "")
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/d"), OldName: "chr", NewParent: f.ino("/d"), NewName: "blk", Who: root}), "")
	if a := f.attr("/blk2"); a.Nlink != 1 || a.Type != metaapi.TypeBlock {
		t.Fatalf("device replaced by a rename: %+v", a)
	}
	if a := f.attr("/d/blk"); a.Type != metaapi.TypeChar || a.Rdev != want["chr"].rdev {
		t.Fatalf("renamed device: %+v", a)
	}
	for _, name := range []string{"blk", "sock", "fifo"} {
		wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/d"), Name: metaapi.ByteString(name), Who: root}), "")
	}
	if err := f.s.Check(); err != nil {
		t.Fatalf("the namespace check at the end: %v", err)
	}
}

func TestMknodRules(t *testing.T) {
	f := newFixture(t)
	permTree(f)
	for _, tc := range []struct {
		name   string
		parent string
		typ    metaapi.FileType
		rdev   uint64
		who    metaapi.Who
		want   metaapi.Code
	}{
		{"device by root", "/pub", metaapi.TypeBlock, metaapi.Mkdev(8, 0), root, ""},
		{"block device by a user", "/pub", metaapi.TypeBlock, metaapi.Mkdev(8, 0), alice, metaapi.EPERM},
		{"char device by a user", "/pub", metaapi.TypeChar, metaapi.Mkdev(1, 3), alice, metaapi.EPERM},
		{"whiteout by a user", "/pub", metaapi.TypeChar, 0, alice, ""},
		{"block 0:0 by a user is no whiteout", "/pub", metaapi.TypeBlock, 0, alice, metaapi.EPERM},
		{"socket by a user", "/pub", metaapi.TypeSocket, 0, alice, ""},
		{"fifo by a user", "/pub", metaapi.TypeFIFO, 0, alice, ""},
		// As mknod(2): the directory's permission, then the privilege.
		{"device in an unwritable directory", "/rootdir", metaapi.TypeChar, metaapi.Mkdev(1, 3), alice, metaapi.EACCES},
		{"device over an existing name", "/pub", metaapi.TypeChar, metaapi.Mkdev(1, 3), bob, metaapi.EEXIST},
		{"device number on a fifo", "/pub", metaapi.TypeFIFO, 1, root, metaapi.EINVAL},
		{"device number on a socket", "/pub", metaapi.TypeSocket, metaapi.Mkdev(1, 3), root, metaapi.EINVAL},
		{"major too large", "/pub", metaapi.TypeChar, metaapi.Mkdev(4096, 0), root, metaapi.EINVAL},
		{"minor too large", "/pub", metaapi.TypeChar, metaapi.Mkdev(1, 1<<20), root, metaapi.EINVAL},
		{"not an encoded number", "/pub", metaapi.TypeChar, 1 << 63, root, metaapi.EINVAL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "n"
			if tc.want == metaapi.EEXIST {
				name = "af"
			}
			a, err := mknod(f, tc.parent, name, tc.typ, tc.rdev, tc.who)
			wantCode(t, err, tc.want)
			if err != nil {
				return
			}
			if a.Type != tc.typ || a.Rdev != tc.rdev || a.UID != tc.who.UID {
				t.Fatalf("%+v", a)
			}
			wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: f.ino(tc.parent), Name: metaapi.ByteString(name), Who: root}), "")
		})
	}
}

// SetAttrReq.KillSuidgid: what an unprivileged write or truncation drops.
func TestKillSuidgid(t *testing.T) {
	for _, tc := range []struct {
		name     string
		typ      metaapi.FileType
		mode     uint32
		who      metaapi.Who
		want     uint32
		wantCode metaapi.Code
	}{
		{"setuid and setgid of a group-executable file", metaapi.TypeFile, 0o6777, bob, 0o777, ""},
		{"setgid without group execute stays", metaapi.TypeFile, 0o6767, bob, 0o2767, ""},
		{"setgid alone, group-executable", metaapi.TypeFile, 0o2777, bob, 0o777, ""},
		{"by the owner", metaapi.TypeFile, 0o4755, alice, 0o755, ""},
		{"by a member of the group with write access", metaapi.TypeFile, 0o6775, carol, 0o775, ""},
		{"without write access", metaapi.TypeFile, 0o4755, bob, 0o4755, metaapi.EACCES},
		{"nothing to drop needs nothing", metaapi.TypeFile, 0o755, bob, 0o755, ""},
		{"a directory keeps its bits", metaapi.TypeDir, 0o3777, bob, 0o3777, ""},
		{"a fifo drops them", metaapi.TypeFIFO, 0o6777, bob, 0o777, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.tree("/pub/")
			f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/pub"), Mode: ptr(uint32(0o777)), Who: root})
			f.mk("/pub", "x", tc.typ, 0o644, alice)
			_, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/pub/x"), Mode: &tc.mode, Who: alice})
			wantCode(t, err, "")
			before := f.attr("/pub/x")
			f.clk.Advance(time.Second)
			a, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: before.Ino, KillSuidgid: true, Who: tc.who})
			wantCode(t, err, tc.wantCode)
			after := f.attr("/pub/x")
			if after.Mode != tc.want {
				t.Fatalf("mode %o, want %o", after.Mode, tc.want)
			}
			if err == nil && a.Mode != tc.want {
				t.Fatalf("returned mode %o, want %o", a.Mode, tc.want)
			}
			if changed := after.Ctime != before.Ctime; changed != (tc.want != tc.mode) {
				t.Fatalf("ctime changed: %v, mode changed: %v", changed, tc.want != tc.mode)
			}
		})
	}
}

// A change of owner or group drops the bits of any non-directory, as
// chown(2) does, even to the same owner; a mode set in the same call
// wins (NFS SETATTR).
func TestChownDropsSuidgid(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  metaapi.FileType
		req  metaapi.SetAttrReq
		want uint32
	}{
		{"file, new owner", metaapi.TypeFile, metaapi.SetAttrReq{UID: ptr(uint32(5))}, 0o555},
		{"file, same owner", metaapi.TypeFile, metaapi.SetAttrReq{UID: ptr(root.UID)}, 0o555},
		{"file, group", metaapi.TypeFile, metaapi.SetAttrReq{GID: ptr(uint32(7))}, 0o555},
		{"fifo", metaapi.TypeFIFO, metaapi.SetAttrReq{UID: ptr(uint32(5))}, 0o555},
		{"char device", metaapi.TypeChar, metaapi.SetAttrReq{UID: ptr(uint32(5))}, 0o555},
		{"socket", metaapi.TypeSocket, metaapi.SetAttrReq{GID: ptr(uint32(7))}, 0o555},
		{"directory keeps them", metaapi.TypeDir, metaapi.SetAttrReq{UID: ptr(uint32(5))}, 0o6555},
		{"mode in the same call", metaapi.TypeFile, metaapi.SetAttrReq{UID: ptr(uint32(5)), Mode: ptr(uint32(0o6555))}, 0o6555},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.mk("/", "x", tc.typ, 0o644, root)
			ino := f.ino("/x")
			_, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Mode: ptr(uint32(0o6555)), Who: root})
			wantCode(t, err, "")
			req := tc.req
			req.Ino, req.Who = ino, root
			_, err = f.s.SetAttr(req)
			wantCode(t, err, "")
			if m := f.attr("/x").Mode; m != tc.want {
				t.Fatalf("mode %o, want %o", m, tc.want)
			}
		})
	}
}

// The owner of a file writes and truncates its data whatever its mode
// (through the descriptor that created it read-only); others are held
// to the mode.
func TestOwnerWritesReadOnlyFile(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.DefaultReplicas = 1 })
	f.addNodes(1)
	f.tree("/pub/")
	f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/pub"), Mode: ptr(uint32(0o777)), Who: root})
	ino := f.mk("/pub", "ro", metaapi.TypeFile, 0o444, alice).Ino
	for _, tc := range []struct {
		name string
		who  metaapi.Who
		want metaapi.Code
	}{
		{"owner", alice, ""},
		{"group member", carol, metaapi.EACCES},
		{"other", bob, metaapi.EACCES},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := f.s.Layout(1, metaapi.LayoutReq{Ino: ino, Len: 10, Write: true, Who: tc.who})
			wantCode(t, err, tc.want)
			if err == nil {
				_, err = f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 10,
					Chunks: []metaapi.ChunkVersion{{Index: 0, Chunk: l.Chunks[0].Chunk, Version: l.Chunks[0].Version + 1, End: 10}}, Who: tc.who})
				wantCode(t, err, "")
			}
			_, err = f.s.Commit(metaapi.CommitReq{Ino: ino, Size: 10, Who: tc.who})
			wantCode(t, err, tc.want)
			_, err = f.s.SetAttr(metaapi.SetAttrReq{Ino: ino, Size: ptr(int64(3)), Who: tc.who})
			wantCode(t, err, tc.want)
		})
	}
	if a := f.attr("/pub/ro"); a.Size != 3 || a.Mode != 0o444 {
		t.Fatalf("%+v, want size 3, mode 444", a)
	}
}
