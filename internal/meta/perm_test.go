package meta

import (
	"testing"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
)

// permTree: directories with interesting modes and owners.
//
//	/rootdir   0755 root      /pub     0777 root      /sticky 01777 root
//	/priv      0700 alice     /grp     0770 alice:1000
//	/other     0703 alice     /noown   0077 alice     /none   0000 root
//	/noread    0311 alice     /sgid    02777 alice:1000
//	/pub/af    0644 alice     /sticky/af 0644 alice   /pub/ad 0555 alice (dir)
func permTree(f *fixture) {
	f.tree("/rootdir/", "/pub/", "/sticky/", "/pub2/")
	set := func(path string, mode, uid, gid uint32) {
		f.t.Helper()
		if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino(path), Mode: &mode, UID: &uid, GID: &gid, Who: root}); err != nil {
			f.t.Fatal(err)
		}
	}
	set("/pub", 0o777, 0, 0)
	set("/pub2", 0o777, 0, 0)
	set("/sticky", 0o1777, 0, 0)
	for _, d := range []struct {
		name string
		mode uint32
	}{{"priv", 0o700}, {"grp", 0o770}, {"other", 0o703}, {"noown", 0o077}, {"noread", 0o311}, {"sgid", 0o2777}} {
		f.mk("/", d.name, metaapi.TypeDir, 0o755, root)
		set("/"+d.name, d.mode, alice.UID, alice.GID)
	}
	f.mk("/", "none", metaapi.TypeDir, 0, root)
	f.mk("/pub", "af", metaapi.TypeFile, 0o644, alice)
	f.mk("/pub", "ad", metaapi.TypeDir, 0o555, alice)
	f.mk("/sticky", "af", metaapi.TypeFile, 0o644, alice)
}

func TestPermissions(t *testing.T) {
	mk := func(parent string, who metaapi.Who) func(f *fixture) error {
		return func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: f.ino(parent), Name: "new", Type: metaapi.TypeFile, Mode: 0o644, Who: who})
			return err
		}
	}
	rm := func(parent, name string, who metaapi.Who) func(f *fixture) error {
		return func(f *fixture) error {
			return f.s.Remove(metaapi.RemoveReq{Parent: f.ino(parent), Name: metaapi.ByteString(name), Who: who})
		}
	}
	setattr := func(path string, who metaapi.Who, req metaapi.SetAttrReq) func(f *fixture) error {
		return func(f *fixture) error {
			req.Ino, req.Who = f.ino(path), who
			_, err := f.s.SetAttr(req)
			return err
		}
	}
	for _, tc := range []struct {
		name string
		run  func(f *fixture) error
		want metaapi.Code
	}{
		{"create: other without write", mk("/rootdir", alice), metaapi.EACCES},
		{"create: world-writable", mk("/pub", bob), ""},
		{"create: owner only, by owner", mk("/priv", alice), ""},
		{"create: owner only, by other", mk("/priv", bob), metaapi.EACCES},
		{"create: group member via GIDs", mk("/grp", carol), ""},
		{"create: group, non-member", mk("/grp", bob), metaapi.EACCES},
		{"create: others wx", mk("/other", bob), ""},
		{"create: owner triplet wins over group/other", mk("/noown", alice), metaapi.EACCES},
		{"create: root bypasses", mk("/none", root), ""},
		{"create: existing file needs no write", func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: f.ino("/rootdir"), Name: "x", Type: metaapi.TypeFile, Who: root})
			if err != nil {
				return err
			}
			_, err = f.s.Create(metaapi.CreateReq{Parent: f.ino("/rootdir"), Name: "x", Type: metaapi.TypeFile, Who: alice})
			return err
		}, ""},
		{"create: existing name in unsearchable dir", func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: f.ino("/priv"), Name: "x", Type: metaapi.TypeFile, Exclusive: true, Who: alice})
			if err != nil {
				return err
			}
			_, err = f.s.Create(metaapi.CreateReq{Parent: f.ino("/priv"), Name: "x", Type: metaapi.TypeFile, Exclusive: true, Who: bob})
			return err
		}, metaapi.EACCES},
		{"unlink: other's file in world-writable dir", rm("/pub", "af", bob), ""},
		{"unlink: sticky, not owner", rm("/sticky", "af", bob), metaapi.EPERM},
		{"unlink: sticky, file owner", rm("/sticky", "af", alice), ""},
		{"unlink: sticky, root", rm("/sticky", "af", root), ""},
		{"unlink: no write on dir", rm("/", "pub", alice), metaapi.EACCES},
		{"rmdir: no write on dir", func(f *fixture) error {
			return f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/"), Name: "priv", Dir: true, Who: alice})
		}, metaapi.EACCES},
		{"rename: within writable dir", func(f *fixture) error {
			return f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/pub"), OldName: "af", NewParent: f.ino("/pub"), NewName: "bf", Who: bob})
		}, ""},
		{"rename: target dir not writable", func(f *fixture) error {
			return f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/pub"), OldName: "af", NewParent: f.ino("/rootdir"), NewName: "bf", Who: alice})
		}, metaapi.EACCES},
		{"rename: source dir not writable", func(f *fixture) error {
			return f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/"), OldName: "pub", NewParent: f.ino("/pub2"), NewName: "x", Who: alice})
		}, metaapi.EACCES},
		{"rename: sticky source", func(f *fixture) error {
			return f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/sticky"), OldName: "af", NewParent: f.ino("/pub"), NewName: "x", Who: bob})
		}, metaapi.EPERM},
		{"rename: dir across parents needs write on it", func(f *fixture) error {
			return f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/pub"), OldName: "ad", NewParent: f.ino("/pub2"), NewName: "ad", Who: alice})
		}, metaapi.EACCES},
		{"rename: read-only dir within its parent", func(f *fixture) error {
			return f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/pub"), OldName: "ad", NewParent: f.ino("/pub"), NewName: "ad2", Who: alice})
		}, ""},
		{"link: needs write on new parent", func(f *fixture) error {
			_, err := f.s.Link(metaapi.LinkReq{Ino: f.ino("/pub/af"), NewParent: f.ino("/rootdir"), NewName: "x", Who: alice})
			return err
		}, metaapi.EACCES},
		{"readdir: no read", func(f *fixture) error {
			_, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/noread"), Who: bob})
			return err
		}, metaapi.EACCES},
		{"readdir: owner without read", func(f *fixture) error {
			_, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/noread"), Who: alice})
			return err
		}, metaapi.EACCES},
		{"readdir: root", func(f *fixture) error {
			_, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/none"), Who: root})
			return err
		}, ""},
		{"chmod: owner", setattr("/pub/af", alice, metaapi.SetAttrReq{Mode: ptr(uint32(0o600))}), ""},
		{"chmod: not owner", setattr("/pub/af", bob, metaapi.SetAttrReq{Mode: ptr(uint32(0o777))}), metaapi.EPERM},
		{"chown: not root", setattr("/pub/af", alice, metaapi.SetAttrReq{UID: ptr(bob.UID)}), metaapi.EPERM},
		{"chown: to same uid", setattr("/pub/af", alice, metaapi.SetAttrReq{UID: ptr(alice.UID)}), ""},
		{"chgrp: owner to own group", setattr("/pub/af", carol, metaapi.SetAttrReq{}), ""},
		{"chgrp: owner to foreign group", setattr("/pub/af", alice, metaapi.SetAttrReq{GID: ptr(uint32(4242))}), metaapi.EPERM},
		{"chgrp: non-owner", setattr("/pub/af", carol, metaapi.SetAttrReq{GID: ptr(uint32(1000))}), ""}, // unchanged gid is no change
		{"chgrp: non-owner real change", setattr("/pub/af", carol, metaapi.SetAttrReq{GID: ptr(uint32(1002))}), metaapi.EPERM},
		{"truncate: no write", setattr("/pub/af", bob, metaapi.SetAttrReq{Size: ptr(int64(0))}), metaapi.EACCES},
		{"truncate: group read-only", setattr("/pub/af", carol, metaapi.SetAttrReq{Size: ptr(int64(0))}), metaapi.EACCES},
		{"truncate: owner", setattr("/pub/af", alice, metaapi.SetAttrReq{Size: ptr(int64(0))}), ""},
		{"utimes: not owner, no write", setattr("/pub/af", bob, metaapi.SetAttrReq{Mtime: ptr(int64(1))}), metaapi.EPERM},
		{"utimes: owner", setattr("/pub/af", alice, metaapi.SetAttrReq{Mtime: ptr(int64(1))}), ""},
		{"utimes: explicit, writer but not owner", func(f *fixture) error {
			if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/pub/af"), Mode: ptr(uint32(0o666)), Who: alice}); err != nil {
				return err
			}
			return setattr("/pub/af", bob, metaapi.SetAttrReq{Mtime: ptr(int64(1))})(f)
		}, metaapi.EPERM},
		{"utimes: now, writer but not owner", func(f *fixture) error {
			if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/pub/af"), Mode: ptr(uint32(0o666)), Who: alice}); err != nil {
				return err
			}
			return setattr("/pub/af", bob, metaapi.SetAttrReq{AtimeNow: true, MtimeNow: true})(f)
		}, ""},
		{"utimes: now, neither owner nor writer", setattr("/pub/af", bob, metaapi.SetAttrReq{MtimeNow: true}), metaapi.EACCES},
		{"lookup: no search permission", func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/priv"), Name: "x", Who: bob})
			return err
		}, metaapi.EACCES},
		{"lookup: search without read", func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/noread"), Name: "x", Who: bob})
			return err
		}, metaapi.ENOENT},
		{"setpolicy: not owner", func(f *fixture) error {
			_, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/pub"), Policy: metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}, Who: alice})
			return err
		}, metaapi.EPERM},
		{"setpolicy: owner", func(f *fixture) error {
			_, err := f.s.SetPolicy(metaapi.SetPolicyReq{Ino: f.ino("/priv"), Policy: metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}, Who: alice})
			return err
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			permTree(f)
			wantCode(t, tc.run(f), tc.want)
		})
	}
}

func TestSetgidDirectory(t *testing.T) {
	f := newFixture(t)
	permTree(f)
	a := f.mk("/sgid", "file", metaapi.TypeFile, 0o2755, carol) // carol is in group 1000
	d := f.mk("/sgid", "dir", metaapi.TypeDir, 0o755, carol)
	if a.GID != alice.GID || d.GID != alice.GID {
		t.Fatalf("gids %d %d, want the directory's %d", a.GID, d.GID, alice.GID)
	}
	if d.Mode&modeSetgid == 0 {
		t.Fatal("subdirectory did not inherit setgid")
	}
	if a.Mode&modeSetgid == 0 {
		t.Fatal("carol is in the group; setgid should stay")
	}
	// Bob is not in the group: a setgid file he creates there loses the bit.
	b := f.mk("/sgid", "b", metaapi.TypeFile, 0o2755, bob)
	if b.GID != alice.GID {
		t.Fatalf("gid %d", b.GID)
	}
	if m := f.attr("/sgid/b").Mode; m != 0o755 {
		t.Fatalf("mode %o, want 755", m)
	}
}
