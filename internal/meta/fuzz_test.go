package meta

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// oracleTree is built both in meta and in a real directory, so that path
// resolution can be compared with the kernel's. Symlink targets are
// relative and never climb above the root, so the real tree behaves as if
// it were mounted at "/".
var oracleTree = []string{
	"/a/", "/a/b/", "/a/f", "/x", "/a/b/c/", "/a/b/c/deep",
	"/a/up->..", "/a/lb->b", "/a/self->.", "/a/b/back->../f", "/s->a/b",
	"/dangle->nothing", "/loop->loop", "/ping->pong", "/pong->ping", "/tofile->x",
	"/a/b/c/top->../../..", "/a/chain->lb/c/top",
}

type oracle struct {
	f    *fixture
	dir  string
	inos map[uint64]ids.Ino // host inode -> meta inode
}

func newOracle(t testing.TB) *oracle {
	f := newFixture(t)
	f.tree(oracleTree...)
	o := &oracle{f: f, dir: t.TempDir(), inos: map[uint64]ids.Ino{}}
	for _, p := range oracleTree {
		host := filepath.Join(o.dir, strings.TrimSuffix(p, "/"))
		var err error
		switch {
		case strings.HasSuffix(p, "/"):
			err = os.Mkdir(host, 0o755)
		case strings.Contains(p, "->"):
			link, target, _ := strings.Cut(p, "->")
			host = filepath.Join(o.dir, link)
			err = os.Symlink(target, host)
			p = link
		default:
			err = os.WriteFile(host, nil, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(host)
		if err != nil {
			t.Fatal(err)
		}
		o.inos[fi.Sys().(*syscall.Stat_t).Ino] = f.ino(strings.TrimSuffix(p, "/"))
	}
	fi, _ := os.Stat(o.dir)
	o.inos[fi.Sys().(*syscall.Stat_t).Ino] = ids.RootIno
	return o
}

// host resolves path in the real tree: the meta inode it maps to, or the
// error code.
func (o *oracle) host(path string, follow bool) (ids.Ino, metaapi.Code) {
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	fi, err := stat(o.dir + path)
	if err != nil {
		var errno syscall.Errno
		if !errors.As(err, &errno) {
			return 0, "?" + metaapi.Code(err.Error())
		}
		switch errno {
		case syscall.ENOENT:
			return 0, metaapi.ENOENT
		case syscall.ENOTDIR:
			return 0, metaapi.ENOTDIR
		case syscall.ELOOP:
			return 0, metaapi.ELOOP
		case syscall.ENAMETOOLONG:
			return 0, metaapi.ENAMETOOLONG
		case syscall.EINVAL:
			return 0, metaapi.EINVAL
		}
		return 0, metaapi.Code(errno.Error())
	}
	return o.inos[fi.Sys().(*syscall.Stat_t).Ino], ""
}

var resolveSeeds = []string{
	"", "/", "//", "/a", "/a/", "/a/b/c/deep", "/a/f/", "/a/f/x", "/a/up", "/a/up/a/f", "/a/lb/c/", "/a/self/self/f",
	"/a/b/back", "/s/back/", "/dangle", "/dangle/", "/loop", "/loop/x", "/ping", "/tofile/", "/x/.", "/a/./b//c/",
	"/a/b/c/top/a", "/a/chain", "/a/chain/s/c", "/nope", "/a/nope/x", "/" + strings.Repeat("z", 256), "/a/\x00",
	"relative", "/a/../x", "/..", "/a/b/c/top/..",
}

// FuzzResolve compares meta's path resolution with the kernel's on the same
// tree, for every path that stays inside it, and checks that any input
// yields either an inode or one of the documented errors.
func FuzzResolve(f *testing.F) {
	for _, s := range resolveSeeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	o := newOracle(f)
	f.Fuzz(func(t *testing.T, path string, follow bool) {
		a, err := o.f.s.Resolve(metaapi.ResolveReq{Path: metaapi.ByteString(path), Follow: follow})
		var code metaapi.Code
		if err != nil {
			var me *metaapi.Error
			if !errors.As(err, &me) {
				t.Fatalf("Resolve(%q): non-API error %v", path, err)
			}
			switch me.Code {
			case metaapi.ENOENT, metaapi.ENOTDIR, metaapi.ELOOP, metaapi.ENAMETOOLONG, metaapi.EINVAL:
			default:
				t.Fatalf("Resolve(%q): unexpected %v", path, err)
			}
			code = me.Code
		}
		if len(path) > metaapi.MaxPathLen && code != metaapi.ENAMETOOLONG {
			t.Fatalf("Resolve of a %d-byte path: %v", len(path), err)
		}
		// The kernel comparison: absolute paths that cannot climb above
		// the real tree's root (no literal ".."; the tree's own links
		// never do) and are short enough that the real prefix does not
		// matter.
		if !strings.HasPrefix(path, "/") || strings.Contains(path, "..") || len(path) > 2048 {
			return
		}
		wantIno, wantCode := o.host(path, follow)
		if strings.IndexByte(path, 0) >= 0 {
			wantCode = metaapi.EINVAL
		}
		if code != wantCode || (code == "" && a.Ino != wantIno) {
			t.Fatalf("Resolve(%q, follow=%v) = ino %d, %q; kernel says ino %d, %q", path, follow, a.Ino, code, wantIno, wantCode)
		}
	})
}

// FuzzValidName checks the name validator against its specification and
// that every valid name can be created, found and listed.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", ".", "..", "...", "a", "a/b", "/", "a\x00", strings.Repeat("n", 255), strings.Repeat("n", 256), "ünïcode", " ", "\xff"} {
		f.Add(s)
	}
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, name string) {
		err := validName(name)
		var want metaapi.Code
		switch {
		case name == "" || name == "." || name == "..":
			want = metaapi.EINVAL
		case len(name) > metaapi.MaxNameLen:
			want = metaapi.ENAMETOOLONG
		case strings.ContainsAny(name, "/\x00"):
			want = metaapi.EINVAL
		}
		if want == "" && err != nil || want != "" && !metaapi.IsCode(err, want) {
			t.Fatalf("validName(%q) = %v, want %q", name, err, want)
		}
		_, cerr := fx.s.Create(metaapi.CreateReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Type: metaapi.TypeFile, Who: root})
		if want != "" {
			if !metaapi.IsCode(cerr, want) {
				t.Fatalf("Create(%q) = %v, want %s", name, cerr, want)
			}
			return
		}
		if cerr != nil {
			t.Fatalf("Create(%q): %v", name, cerr)
		}
		a, err := fx.s.Resolve(metaapi.ResolveReq{Path: metaapi.ByteString("/" + name)})
		if err != nil || a.Type != metaapi.TypeFile {
			t.Fatalf("Resolve(/%q) = %+v, %v", name, a, err)
		}
		r, err := fx.s.Readdir(metaapi.ReaddirReq{Ino: ids.RootIno, After: metaapi.ByteString(name[:len(name)-1]), Limit: 1, Who: root})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Entries) != 1 || string(r.Entries[0].Name) != name {
			t.Fatalf("readdir after %q: %+v", name[:len(name)-1], r.Entries)
		}
		if err := fx.s.Remove(metaapi.RemoveReq{Parent: ids.RootIno, Name: metaapi.ByteString(name), Who: root}); err != nil {
			t.Fatal(err)
		}
	})
}
