package meta

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// stdTree is the namespace most table cases start from.
var stdTree = []string{"/d/", "/d/f", "/d/sub/", "/d/sub/g", "/e/", "/f", "/l->d", "/p|"}

// nsCase is one namespace table case: run on a fresh standard tree, it
// must fail with want ("" = succeed); check then inspects the result.
type nsCase struct {
	name  string
	run   func(f *fixture) error
	want  metaapi.Code
	check func(t *testing.T, f *fixture)
}

func runCases(t *testing.T, cases []nsCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.tree(stdTree...)
			f.clk.Advance(time.Second) // so "times updated" is observable
			wantCode(t, tc.run(f), tc.want)
			if tc.check != nil {
				tc.check(t, f)
			}
		})
	}
}

func create(parent, name string, typ metaapi.FileType) func(f *fixture) error {
	return func(f *fixture) error {
		_, err := f.s.Create(metaapi.CreateReq{Parent: f.ino(parent), Name: metaapi.ByteString(name), Type: typ, Mode: 0o644, Who: root})
		return err
	}
}

func TestCreate(t *testing.T) {
	runCases(t, []nsCase{
		{name: "file", run: create("/d", "new", metaapi.TypeFile), check: func(t *testing.T, f *fixture) {
			a := f.attr("/d/new")
			if a.Type != metaapi.TypeFile || a.Nlink != 1 || a.Mode != 0o644 || a.Size != 0 {
				t.Fatalf("attr %+v", a)
			}
			if a.ChunkSize != testChunkSize || a.Policy == nil || a.Policy.Replicas != 3 {
				t.Fatalf("file layout attrs %+v", a)
			}
			if d := f.attr("/d"); d.Mtime != f.clk.Now().UnixNano() || d.Ctime != d.Mtime || d.Nlink != 3 {
				t.Fatalf("parent not updated: %+v", d)
			}
		}},
		{name: "dir", run: create("/d", "nd", metaapi.TypeDir), check: func(t *testing.T, f *fixture) {
			if a := f.attr("/d/nd"); a.Type != metaapi.TypeDir || a.Nlink != 2 {
				t.Fatalf("attr %+v", a)
			}
			if d := f.attr("/d"); d.Nlink != 4 { // ., .., sub/.., nd/..
				t.Fatalf("parent nlink %d, want 4", d.Nlink)
			}
		}},
		{name: "symlink", run: func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: "s", Type: metaapi.TypeSymlink, Target: "d/f", Mode: 0o600, Who: root})
			return err
		}, check: func(t *testing.T, f *fixture) {
			a := f.attr("/s")
			if a.Type != metaapi.TypeSymlink || a.Target != "d/f" || a.Size != 3 || a.Mode != 0o777 {
				t.Fatalf("attr %+v", a)
			}
		}},
		{name: "fifo", run: create("/", "q", metaapi.TypeFIFO), check: func(t *testing.T, f *fixture) {
			if a := f.attr("/q"); a.Type != metaapi.TypeFIFO || a.Policy != nil {
				t.Fatalf("attr %+v", a)
			}
		}},
		{name: "mode keeps only permission bits", run: func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: "m", Type: metaapi.TypeFile, Mode: 0o170755, Who: root})
			return err
		}, check: func(t *testing.T, f *fixture) {
			if m := f.attr("/m").Mode; m != 0o755 {
				t.Fatalf("mode %o", m)
			}
		}},
		{name: "existing file non-exclusive returns it", run: func(f *fixture) error {
			a, err := f.s.Create(metaapi.CreateReq{Parent: f.ino("/d"), Name: "f", Type: metaapi.TypeFile, Who: root})
			if err == nil && a.Ino != f.ino("/d/f") {
				t.Fatalf("returned ino %d, want %d", a.Ino, f.ino("/d/f"))
			}
			return err
		}},
		{name: "existing file exclusive", want: metaapi.EEXIST, run: func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: f.ino("/d"), Name: "f", Type: metaapi.TypeFile, Exclusive: true, Who: root})
			return err
		}},
		{name: "file over existing dir", want: metaapi.EEXIST, run: create("/d", "sub", metaapi.TypeFile)},
		{name: "dir over existing dir", want: metaapi.EEXIST, run: create("/", "d", metaapi.TypeDir)},
		{name: "dir over existing file", want: metaapi.EEXIST, run: create("/", "f", metaapi.TypeDir)},
		{name: "symlink over existing", want: metaapi.EEXIST, run: func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: "l", Type: metaapi.TypeSymlink, Target: "x", Who: root})
			return err
		}},
		{name: "parent is a file", want: metaapi.ENOTDIR, run: create("/f", "x", metaapi.TypeFile)},
		{name: "parent is a symlink", want: metaapi.ENOTDIR, run: create("/l", "x", metaapi.TypeFile)},
		{name: "parent missing", want: metaapi.ENOENT, run: func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: 9999, Name: "x", Type: metaapi.TypeFile, Who: root})
			return err
		}},
		{name: "empty name", want: metaapi.EINVAL, run: create("/", "", metaapi.TypeFile)},
		{name: "dot", want: metaapi.EINVAL, run: create("/", ".", metaapi.TypeDir)},
		{name: "dotdot", want: metaapi.EINVAL, run: create("/", "..", metaapi.TypeDir)},
		{name: "slash", want: metaapi.EINVAL, run: create("/", "a/b", metaapi.TypeFile)},
		{name: "NUL", want: metaapi.EINVAL, run: create("/", "a\x00b", metaapi.TypeFile)},
		{name: "name too long", want: metaapi.ENAMETOOLONG, run: create("/", repeat("n", metaapi.MaxNameLen+1), metaapi.TypeFile)},
		{name: "name at limit", run: create("/", repeat("n", metaapi.MaxNameLen), metaapi.TypeFile)},
		{name: "bad type", want: metaapi.EINVAL, run: create("/", "x", "door")},
		{name: "empty symlink target", want: metaapi.EINVAL, run: create("/", "x", metaapi.TypeSymlink)},
		{name: "symlink target too long", want: metaapi.ENAMETOOLONG, run: func(f *fixture) error {
			_, err := f.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: "x", Type: metaapi.TypeSymlink, Target: metaapi.ByteString(repeat("t", metaapi.MaxPathLen+1)), Who: root})
			return err
		}},
	})
}

func TestCreateNumbersNeverReused(t *testing.T) {
	f := newFixture(t)
	seen := map[ids.Ino]bool{ids.RootIno: true}
	for i := 0; i < 20; i++ {
		a := f.mk("/", "x", metaapi.TypeFile, 0o644, root)
		if seen[a.Ino] {
			t.Fatalf("inode %d reused", a.Ino)
		}
		seen[a.Ino] = true
		wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: "x", Who: root}), "")
	}
}

func TestLookupGetAttr(t *testing.T) {
	runCases(t, []nsCase{
		{name: "lookup", run: func(f *fixture) error {
			a, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/d"), Name: "sub"})
			if err == nil && (a.Type != metaapi.TypeDir || a.Ino != f.ino("/d/sub")) {
				t.Fatalf("lookup gave %+v", a)
			}
			return err
		}},
		{name: "lookup symlink not followed", run: func(f *fixture) error {
			a, err := f.s.Lookup(metaapi.LookupReq{Parent: ids.RootIno, Name: "l"})
			if err == nil && a.Type != metaapi.TypeSymlink {
				t.Fatalf("lookup gave %+v", a)
			}
			return err
		}},
		{name: "lookup missing", want: metaapi.ENOENT, run: func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: ids.RootIno, Name: "nope"})
			return err
		}},
		{name: "lookup in file", want: metaapi.ENOTDIR, run: func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/f"), Name: "x"})
			return err
		}},
		{name: "lookup missing parent", want: metaapi.ENOENT, run: func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: 12345, Name: "x"})
			return err
		}},
		{name: "lookup bad name", want: metaapi.EINVAL, run: func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: ids.RootIno, Name: "."})
			return err
		}},
		{name: "lookup dotdot", run: func(f *fixture) error {
			a, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/d/sub"), Name: ".."})
			if err == nil && a.Ino != f.ino("/d") {
				t.Fatalf(".. of /d/sub gave inode %d, want /d's %d", a.Ino, f.ino("/d"))
			}
			return err
		}},
		{name: "lookup dotdot of root", run: func(f *fixture) error {
			a, err := f.s.Lookup(metaapi.LookupReq{Parent: ids.RootIno, Name: ".."})
			if err == nil && a.Ino != ids.RootIno {
				t.Fatalf(".. of / gave inode %d", a.Ino)
			}
			return err
		}},
		{name: "lookup dotdot in file", want: metaapi.ENOTDIR, run: func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: f.ino("/f"), Name: ".."})
			return err
		}},
		{name: "lookup long name", want: metaapi.ENAMETOOLONG, run: func(f *fixture) error {
			_, err := f.s.Lookup(metaapi.LookupReq{Parent: ids.RootIno, Name: metaapi.ByteString(repeat("x", 300))})
			return err
		}},
		{name: "getattr root", run: func(f *fixture) error {
			a, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: ids.RootIno})
			if err == nil && (a.Type != metaapi.TypeDir || a.Mode != 0o755 || a.UID != 0 || a.Nlink != 4) {
				t.Fatalf("root attr %+v (want nlink 4: ., .., d/.., e/..)", a)
			}
			return err
		}},
		{name: "getattr missing", want: metaapi.ENOENT, run: func(f *fixture) error {
			_, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: 777})
			return err
		}},
	})
}

func TestResolve(t *testing.T) {
	f := newFixture(t)
	f.tree(stdTree...)
	f.tree("/abs->/d/sub", "/rel->d/sub/g", "/dangling->nowhere", "/loop1->loop2", "/loop2->loop1",
		"/d/up->../e", "/d/self->.", "/chain->l", "/tofile->f", "/d/sub/deep/")
	// A chain of exactly maxSymlinks links resolves; one more does not.
	prev := "d"
	for i := 1; i <= maxSymlinks; i++ {
		name := "c" + itoa(i)
		f.mk("/", name+"->"+prev, metaapi.TypeSymlink, 0, root)
		prev = name
	}
	f.mk("/", "c41->c40", metaapi.TypeSymlink, 0, root)

	for _, tc := range []struct {
		path   string
		follow bool
		want   string // path of the expected inode (resolved without following), or ""
		code   metaapi.Code
	}{
		{path: "", want: "/"},
		{path: "/", want: "/"},
		{path: "//", want: "/"},
		{path: "/d", want: "/d"},
		{path: "/d/", want: "/d"},
		{path: "//d///sub//", want: "/d/sub"},
		{path: "/d/./sub/.", want: "/d/sub"},
		{path: "/d/sub/..", want: "/d"},
		{path: "/..", want: "/"},
		{path: "/../../d", want: "/d"},
		{path: "/d/f", want: "/d/f"},
		{path: "/d/f/", code: metaapi.ENOTDIR},
		{path: "/d/f/.", code: metaapi.ENOTDIR},
		{path: "/d/f/..", code: metaapi.ENOTDIR},
		{path: "/d/f/x", code: metaapi.ENOTDIR},
		{path: "/d/nope", code: metaapi.ENOENT},
		{path: "/nope/x", code: metaapi.ENOENT},
		{path: "d", code: metaapi.EINVAL},
		{path: "/d\x00", code: metaapi.EINVAL},
		// symlinks
		{path: "/l", want: "/l"},
		{path: "/l", follow: true, want: "/d"},
		{path: "/l/", want: "/d"}, // trailing slash follows
		{path: "/l/f", want: "/d/f"},
		{path: "/l/sub/g", want: "/d/sub/g"},
		{path: "/abs", follow: true, want: "/d/sub"},
		{path: "/abs/g", want: "/d/sub/g"},
		{path: "/abs/..", want: "/d"}, // physical "..": parent of the target
		{path: "/rel", follow: true, want: "/d/sub/g"},
		{path: "/rel/", code: metaapi.ENOTDIR},
		{path: "/tofile/", code: metaapi.ENOTDIR},
		{path: "/dangling", want: "/dangling"},
		{path: "/dangling", follow: true, code: metaapi.ENOENT},
		{path: "/dangling/x", code: metaapi.ENOENT},
		{path: "/loop1", want: "/loop1"},
		{path: "/loop1", follow: true, code: metaapi.ELOOP},
		{path: "/loop1/x", code: metaapi.ELOOP},
		{path: "/d/up", follow: true, want: "/e"},
		{path: "/d/self/self/self/f", want: "/d/f"},
		{path: "/chain/sub", want: "/d/sub"},
		{path: "/c40", follow: true, want: "/d"},
		{path: "/c40/f", want: "/d/f"},
		{path: "/c41", follow: true, code: metaapi.ELOOP},
		{path: "/c41", want: "/c41"},
		// limits
		{path: "/" + repeat("x", metaapi.MaxNameLen+1), code: metaapi.ENAMETOOLONG},
		{path: "/d/sub/deep/" + repeat("x", metaapi.MaxNameLen), code: metaapi.ENOENT},
		{path: "/" + repeat("./", metaapi.MaxPathLen/2), code: metaapi.ENAMETOOLONG},
		{path: "/" + repeat("./", metaapi.MaxPathLen/2-1) + "d", want: "/d"},
	} {
		a, err := f.s.Resolve(metaapi.ResolveReq{Path: metaapi.ByteString(tc.path), Follow: tc.follow})
		if tc.code != "" {
			if !metaapi.IsCode(err, tc.code) {
				t.Errorf("Resolve(%.40q, follow=%v) = %+v, %v; want %s", tc.path, tc.follow, a, err, tc.code)
			}
			continue
		}
		if err != nil {
			t.Errorf("Resolve(%.40q, follow=%v): %v", tc.path, tc.follow, err)
			continue
		}
		if want := f.ino(tc.want); a.Ino != want {
			t.Errorf("Resolve(%.40q, follow=%v) = inode %d, want %d (%s)", tc.path, tc.follow, a.Ino, want, tc.want)
		}
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func remove(parent, name string, dir bool, who metaapi.Who) func(f *fixture) error {
	return func(f *fixture) error {
		return f.s.Remove(metaapi.RemoveReq{Parent: f.ino(parent), Name: metaapi.ByteString(name), Dir: dir, Who: who})
	}
}

func gone(paths ...string) func(t *testing.T, f *fixture) {
	return func(t *testing.T, f *fixture) {
		for _, p := range paths {
			if f.exists(p) {
				t.Errorf("%s still exists", p)
			}
		}
	}
}

func TestRemove(t *testing.T) {
	runCases(t, []nsCase{
		{name: "unlink file", run: remove("/d", "f", false, root), check: func(t *testing.T, f *fixture) {
			gone("/d/f")(t, f)
			if d := f.attr("/d"); d.Mtime != f.clk.Now().UnixNano() || d.Nlink != 3 {
				t.Fatalf("parent %+v", d)
			}
		}},
		{name: "unlink symlink not target", run: remove("/", "l", false, root), check: func(t *testing.T, f *fixture) {
			gone("/l")(t, f)
			if !f.exists("/d") {
				t.Fatal("symlink target removed")
			}
		}},
		{name: "unlink fifo", run: remove("/", "p", false, root), check: gone("/p")},
		{name: "unlink dir", want: metaapi.EISDIR, run: remove("/", "e", false, root)},
		{name: "unlink missing", want: metaapi.ENOENT, run: remove("/", "zz", false, root)},
		{name: "unlink in file", want: metaapi.ENOTDIR, run: remove("/f", "x", false, root)},
		{name: "unlink bad name", want: metaapi.EINVAL, run: remove("/", ".", false, root)},
		{name: "rmdir empty", run: remove("/", "e", true, root), check: func(t *testing.T, f *fixture) {
			gone("/e")(t, f)
			if r := f.attr("/"); r.Nlink != 3 {
				t.Fatalf("root nlink %d, want 3", r.Nlink)
			}
		}},
		{name: "rmdir non-empty", want: metaapi.ENOTEMPTY, run: remove("/", "d", true, root)},
		{name: "rmdir file", want: metaapi.ENOTDIR, run: remove("/", "f", true, root)},
		{name: "rmdir symlink to dir", want: metaapi.ENOTDIR, run: remove("/", "l", true, root)},
		{name: "rmdir missing", want: metaapi.ENOENT, run: remove("/", "zz", true, root)},
		{name: "rmdir dotdot", want: metaapi.EINVAL, run: remove("/d", "..", true, root)},
	})
}

func TestLink(t *testing.T) {
	link := func(src, parent, name string) func(f *fixture) error {
		return func(f *fixture) error {
			_, err := f.s.Link(metaapi.LinkReq{Ino: f.ino(src), NewParent: f.ino(parent), NewName: metaapi.ByteString(name), Who: root})
			return err
		}
	}
	runCases(t, []nsCase{
		{name: "link file", run: link("/d/f", "/e", "f2"), check: func(t *testing.T, f *fixture) {
			a, b := f.attr("/d/f"), f.attr("/e/f2")
			if a.Ino != b.Ino || a.Nlink != 2 {
				t.Fatalf("%+v %+v", a, b)
			}
			if a.Ctime != f.clk.Now().UnixNano() {
				t.Fatal("ctime not updated")
			}
			// Removing one name keeps the inode; removing both frees it.
			wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/d"), Name: "f", Who: root}), "")
			if b := f.attr("/e/f2"); b.Nlink != 1 {
				t.Fatalf("nlink %d after unlink, want 1", b.Nlink)
			}
			wantCode(t, f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/e"), Name: "f2", Who: root}), "")
			_, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: a.Ino})
			wantCode(t, err, metaapi.ENOENT)
		}},
		{name: "link symlink", run: link("/l", "/", "l2")},
		{name: "link fifo", run: link("/p", "/d", "p2")},
		{name: "link dir", want: metaapi.EPERM, run: link("/e", "/", "e2")},
		{name: "link existing name", want: metaapi.EEXIST, run: link("/f", "/d", "f")},
		{name: "link into file", want: metaapi.ENOTDIR, run: link("/f", "/d/f", "x")},
		{name: "link bad name", want: metaapi.EINVAL, run: link("/f", "/d", "a/b")},
		{name: "link missing inode", want: metaapi.ENOENT, run: func(f *fixture) error {
			_, err := f.s.Link(metaapi.LinkReq{Ino: 4242, NewParent: ids.RootIno, NewName: "x", Who: root})
			return err
		}},
		{name: "link too many", want: metaapi.EMLINK, run: func(f *fixture) error {
			// Fake a file at the link limit rather than making 65000 links.
			ino, e := f.ino("/f"), f.ino("/e")
			err := f.s.update(func(tx *txn) error {
				in, err := tx.inode(ino)
				if err != nil {
					return err
				}
				for i := 1; i < maxLinks; i++ {
					name := "h" + itoa(i)
					if err := tx.setEntry(e, name, dirent{Ino: ino, Type: metaapi.TypeFile}); err != nil {
						return err
					}
				}
				in.Nlink = maxLinks
				tx.dirty(in)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = f.s.Link(metaapi.LinkReq{Ino: ino, NewParent: ids.RootIno, NewName: "one-more", Who: root})
			return err
		}},
	})
}

// TestRenameMatrix runs rename over every combination of source kind and
// target kind.
func TestRenameMatrix(t *testing.T) {
	// Fresh per case: /src/{file, dir/, emptydir/, link->x}, /dst/{file,
	// emptydir/, full/{x}, link->y}, /src/hard is a hard link to /src/file.
	setup := func(f *fixture) {
		f.tree("/src/", "/src/file", "/src/dir/", "/src/dir/inner", "/src/emptydir/", "/src/link->x",
			"/dst/", "/dst/file", "/dst/emptydir/", "/dst/full/", "/dst/full/x", "/dst/link->y")
		if _, err := f.s.Link(metaapi.LinkReq{Ino: f.ino("/src/file"), NewParent: f.ino("/src"), NewName: "hard", Who: root}); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		from, to  string
		noReplace bool
		want      metaapi.Code
	}{
		{"/src/file", "/dst/new", false, ""},
		{"/src/file", "/dst/file", false, ""},
		{"/src/file", "/dst/link", false, ""},
		{"/src/file", "/dst/emptydir", false, metaapi.EISDIR},
		{"/src/file", "/dst/full", false, metaapi.EISDIR},
		{"/src/file", "/src/file", false, ""}, // onto itself
		{"/src/file", "/src/hard", false, ""}, // onto another name of itself: no-op
		{"/src/file", "/src/file", true, metaapi.EEXIST},
		{"/src/file", "/dst/file", true, metaapi.EEXIST},
		{"/src/file", "/dst/new", true, ""},
		{"/src/dir", "/dst/new", false, ""},
		{"/src/dir", "/dst/emptydir", false, ""},
		{"/src/dir", "/dst/full", false, metaapi.ENOTEMPTY},
		{"/src/dir", "/dst/file", false, metaapi.ENOTDIR},
		{"/src/dir", "/dst/link", false, metaapi.ENOTDIR},
		{"/src/dir", "/src/dir/sub", false, metaapi.EINVAL}, // into itself
		{"/src/dir", "/src/dir/inner2", false, metaapi.EINVAL},
		{"/src", "/src/dir/x", false, metaapi.EINVAL}, // into a descendant
		{"/src/dir", "/src/renamed", false, ""},       // same parent
		{"/src/emptydir", "/dst/emptydir", false, ""},
		{"/src/link", "/dst/file", false, ""},
		{"/src/link", "/dst/emptydir", false, metaapi.EISDIR},
		{"/src/dir/inner", "/src", false, metaapi.ENOTEMPTY}, // target is an ancestor of the source
		{"/src/missing", "/dst/new", false, metaapi.ENOENT},
		{"/src/file", "/dst/file/x", false, metaapi.ENOTDIR},
	} {
		t.Run(tc.from+"→"+tc.to, func(t *testing.T) {
			f := newFixture(t)
			setup(f)
			before := map[string]metaapi.Attr{}
			for _, p := range []string{"/src", "/dst", "/src/file", "/src/dir", "/dst/emptydir", "/dst/file"} {
				before[p] = f.attr(p)
			}
			var srcIno ids.Ino
			if f.exists(tc.from) {
				srcIno = f.ino(tc.from)
			}
			f.clk.Advance(time.Second)
			fromDir, fromName := splitPath(tc.from)
			toDir, toName := splitPath(tc.to)
			var newParent ids.Ino
			if f.exists(toDir) {
				newParent = f.ino(toDir)
			} else {
				newParent = f.ino("/dst/file") // exists, not a dir
			}
			err := f.s.Rename(metaapi.RenameReq{
				OldParent: f.ino(fromDir), OldName: metaapi.ByteString(fromName),
				NewParent: newParent, NewName: metaapi.ByteString(toName),
				NoReplace: tc.noReplace, Who: root,
			})
			wantCode(t, err, tc.want)
			if tc.want != "" {
				// Nothing changed.
				for p, a := range before {
					if got := f.attr(p); !reflect.DeepEqual(got, a) {
						t.Errorf("%s changed by a failed rename: %+v -> %+v", p, a, got)
					}
				}
				return
			}
			if got := f.ino(tc.to); got != srcIno {
				t.Fatalf("%s is inode %d, want %d", tc.to, got, srcIno)
			}
			if tc.from != tc.to && !(tc.from == "/src/file" && tc.to == "/src/hard") && f.exists(tc.from) {
				t.Fatalf("%s still exists", tc.from)
			}
		})
	}
}

func TestRenameCounts(t *testing.T) {
	f := newFixture(t)
	f.tree("/a/", "/a/d/", "/a/d/x", "/b/", "/b/t/", "/f", "/g")
	f.clk.Advance(time.Second)
	// Directory across parents, replacing an empty dir.
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/a"), OldName: "d", NewParent: f.ino("/b"), NewName: "t", Who: root}), "")
	if a, b := f.attr("/a"), f.attr("/b"); a.Nlink != 2 || b.Nlink != 3 {
		t.Fatalf("nlink a=%d b=%d, want 2 and 3", a.Nlink, b.Nlink)
	}
	now := f.clk.Now().UnixNano()
	if a, b, d := f.attr("/a"), f.attr("/b"), f.attr("/b/t"); a.Mtime != now || b.Mtime != now || d.Ctime != now {
		t.Fatal("times not updated")
	}
	if f.attr("/b/t/..").Ino != f.ino("/b") {
		t.Fatal(".. of moved directory not updated")
	}
	if f.s.Status2().Dirs != 3+1 { // root, a, b, t (the replaced t is gone)
		t.Fatalf("dirs count %d", f.s.Status2().Dirs)
	}
	// File over file frees the replaced file.
	g := f.ino("/g")
	wantCode(t, f.s.Rename(metaapi.RenameReq{OldParent: ids.RootIno, OldName: "f", NewParent: ids.RootIno, NewName: "g", Who: root}), "")
	if _, err := f.s.GetAttr(metaapi.GetAttrReq{Ino: g}); !metaapi.IsCode(err, metaapi.ENOENT) {
		t.Fatalf("replaced file still there: %v", err)
	}
}

// Status2 is Status without error, for tests.
func (s *Service) Status2() metaapi.StatusResp {
	st, err := s.Status()
	if err != nil {
		panic(err)
	}
	return st
}

func TestReaddir(t *testing.T) {
	f := newFixture(t)
	f.tree("/d/")
	var want []string
	for i := 0; i < 25; i++ {
		name := string(rune('a'+i%26)) + itoa(i)
		f.mk("/d", name, metaapi.TypeFile, 0o644, root)
		want = append(want, name)
	}
	f.mk("/d", "zdir", metaapi.TypeDir, 0o755, root)
	want = append(want, "zdir")
	slices.Sort(want)

	var got []string
	after := ""
	pages := 0
	for {
		r, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d"), After: metaapi.ByteString(after), Limit: 7, Who: root})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(r.Entries) > 7 {
			t.Fatalf("page of %d entries, limit 7", len(r.Entries))
		}
		for _, e := range r.Entries {
			got = append(got, string(e.Name))
			if e.Ino != f.ino("/d/"+string(e.Name)) {
				t.Fatalf("entry %s has ino %d", e.Name, e.Ino)
			}
			if (e.Name == "zdir") != (e.Type == metaapi.TypeDir) {
				t.Fatalf("entry %s has type %s", e.Name, e.Type)
			}
		}
		if !r.More {
			break
		}
		after = string(r.Entries[len(r.Entries)-1].Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("readdir = %v\nwant %v", got, want)
	}
	if pages != 4 {
		t.Fatalf("%d pages, want 4", pages)
	}
	// Exact fit: no More on the last page.
	r, _ := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d"), Limit: 26, Who: root})
	if len(r.Entries) != 26 || r.More {
		t.Fatalf("limit 26: %d entries, more=%v", len(r.Entries), r.More)
	}
	// After a name that is not present.
	r, _ = f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d"), After: "z", Who: root})
	if len(r.Entries) != 1 || r.Entries[0].Name != "zdir" {
		t.Fatalf("after z: %+v", r.Entries)
	}
	// Empty directory gives an empty (non-nil) list.
	f.tree("/e/")
	r, _ = f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/e"), Who: root})
	if r.Entries == nil || len(r.Entries) != 0 || r.More {
		t.Fatalf("empty dir: %+v", r)
	}
	_, err := f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d/a0"), Who: root})
	wantCode(t, err, metaapi.ENOTDIR)
	_, err = f.s.Readdir(metaapi.ReaddirReq{Ino: 999, Who: root})
	wantCode(t, err, metaapi.ENOENT)
	_, err = f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d"), Limit: -1, Who: root})
	wantCode(t, err, metaapi.EINVAL)
	r, err = f.s.Readdir(metaapi.ReaddirReq{Ino: f.ino("/d"), Limit: metaapi.MaxReaddirLimit * 10, Who: root})
	wantCode(t, err, "")
	if len(r.Entries) != 26 {
		t.Fatalf("huge limit: %d entries", len(r.Entries))
	}
}

func TestSetAttr(t *testing.T) {
	setattr := func(path string, req metaapi.SetAttrReq) func(f *fixture) error {
		return func(f *fixture) error {
			req.Ino = f.ino(path)
			_, err := f.s.SetAttr(req)
			return err
		}
	}
	runCases(t, []nsCase{
		{name: "chmod", run: setattr("/f", metaapi.SetAttrReq{Mode: ptr(uint32(0o1600)), Who: root}), check: func(t *testing.T, f *fixture) {
			a := f.attr("/f")
			if a.Mode != 0o1600 || a.Ctime != f.clk.Now().UnixNano() {
				t.Fatalf("%+v", a)
			}
		}},
		{name: "chown", run: setattr("/f", metaapi.SetAttrReq{UID: ptr(uint32(5)), GID: ptr(uint32(6)), Who: root}), check: func(t *testing.T, f *fixture) {
			if a := f.attr("/f"); a.UID != 5 || a.GID != 6 {
				t.Fatalf("%+v", a)
			}
		}},
		{name: "chown clears setuid", run: func(f *fixture) error {
			setattr("/f", metaapi.SetAttrReq{Mode: ptr(uint32(0o6755)), Who: root})(f)
			return setattr("/f", metaapi.SetAttrReq{UID: ptr(uint32(5)), Who: root})(f)
		}, check: func(t *testing.T, f *fixture) {
			if a := f.attr("/f"); a.Mode != 0o755 {
				t.Fatalf("mode %o, want 755", a.Mode)
			}
		}},
		{name: "times", run: setattr("/d", metaapi.SetAttrReq{Atime: ptr(int64(11)), Mtime: ptr(int64(22)), Who: root}), check: func(t *testing.T, f *fixture) {
			if a := f.attr("/d"); a.Atime != 11 || a.Mtime != 22 || a.Ctime != f.clk.Now().UnixNano() {
				t.Fatalf("%+v", a)
			}
		}},
		{name: "times now", run: setattr("/d", metaapi.SetAttrReq{Atime: ptr(int64(11)), MtimeNow: true, Who: root}), check: func(t *testing.T, f *fixture) {
			if a, now := f.attr("/d"), f.clk.Now().UnixNano(); a.Atime != 11 || a.Mtime != now || a.Ctime != now {
				t.Fatalf("%+v", a)
			}
		}},
		{name: "nothing", run: setattr("/f", metaapi.SetAttrReq{Who: root}), check: func(t *testing.T, f *fixture) {
			if a := f.attr("/f"); a.Ctime == f.clk.Now().UnixNano() {
				t.Fatal("empty setattr changed ctime")
			}
		}},
		{name: "size grow", run: setattr("/f", metaapi.SetAttrReq{Size: ptr(int64(5000)), Who: root}), check: func(t *testing.T, f *fixture) {
			if a := f.attr("/f"); a.Size != 5000 || a.Mtime != f.clk.Now().UnixNano() {
				t.Fatalf("%+v", a)
			}
		}},
		{name: "size of dir", want: metaapi.EISDIR, run: setattr("/d", metaapi.SetAttrReq{Size: ptr(int64(0)), Who: root})},
		{name: "size of fifo", want: metaapi.EINVAL, run: setattr("/p", metaapi.SetAttrReq{Size: ptr(int64(0)), Who: root})},
		{name: "negative size", want: metaapi.EINVAL, run: setattr("/f", metaapi.SetAttrReq{Size: ptr(int64(-1)), Who: root})},
		{name: "huge size", want: metaapi.EFBIG, run: setattr("/f", metaapi.SetAttrReq{Size: ptr(int64(metaapi.MaxFileSize + 1)), Who: root})},
		{name: "missing", want: metaapi.ENOENT, run: func(f *fixture) error {
			_, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: 5555, Mode: ptr(uint32(0)), Who: root})
			return err
		}},
		{name: "failed check changes nothing", want: metaapi.EISDIR, run: setattr("/d", metaapi.SetAttrReq{Mode: ptr(uint32(0o700)), Size: ptr(int64(1)), Who: root}),
			check: func(t *testing.T, f *fixture) {
				if m := f.attr("/d").Mode; m != 0o755 {
					t.Fatalf("mode changed to %o by a failed setattr", m)
				}
			}},
	})
}

// Operations on entries return the directories they changed, as they are
// after the change: the mount answers the kernel's next getattr of them.
func TestChangedDirsReturned(t *testing.T) {
	f := newFixture(t)
	f.tree("/a/", "/b/")
	f.clk.Advance(time.Second)
	r, err := f.s.create(0, metaapi.CreateReq{Parent: f.ino("/a"), Name: "d", Type: metaapi.TypeDir, Mode: 0o755, Who: root})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Dirs) != 1 || r.Dirs[0] != f.attr("/a") || r.Dirs[0].Nlink != 3 || r.Dirs[0].Mtime != f.clk.Now().UnixNano() {
		t.Fatalf("mkdir: dirs %+v, /a is %+v", r.Dirs, f.attr("/a"))
	}
	f.clk.Advance(time.Second)
	l, err := f.s.link(metaapi.LinkReq{Ino: f.mk("/a", "f", metaapi.TypeFile, 0o644, root).Ino, NewParent: f.ino("/b"), NewName: "g", Who: root})
	if err != nil || len(l.Dirs) != 1 || l.Dirs[0] != f.attr("/b") {
		t.Fatalf("link: %+v, %v; /b is %+v", l.Dirs, err, f.attr("/b"))
	}
	f.clk.Advance(time.Second)
	mv, err := f.s.rename(metaapi.RenameReq{OldParent: f.ino("/a"), OldName: "d", NewParent: f.ino("/b"), NewName: "d", Who: root})
	if err != nil || len(mv.Dirs) != 2 || mv.Dirs[0] != f.attr("/a") || mv.Dirs[1] != f.attr("/b") || mv.Dirs[1].Nlink != 3 {
		t.Fatalf("rename across: %+v, %v", mv.Dirs, err)
	}
	mv, err = f.s.rename(metaapi.RenameReq{OldParent: f.ino("/b"), OldName: "g", NewParent: f.ino("/b"), NewName: "h", Who: root})
	if err != nil || len(mv.Dirs) != 1 || mv.Dirs[0] != f.attr("/b") {
		t.Fatalf("rename within: %+v, %v", mv.Dirs, err)
	}
	f.clk.Advance(time.Second)
	rm, err := f.s.remove(metaapi.RemoveReq{Parent: f.ino("/b"), Name: "d", Dir: true, Who: root})
	if err != nil || len(rm.Dirs) != 1 || rm.Dirs[0] != f.attr("/b") || rm.Dirs[0].Nlink != 2 {
		t.Fatalf("rmdir: %+v, %v; /b is %+v", rm.Dirs, err, f.attr("/b"))
	}
	if _, err := f.s.remove(metaapi.RemoveReq{Parent: f.ino("/b"), Name: "nothing", Who: root}); err == nil {
		t.Fatal("removing a missing name succeeded")
	}
}
