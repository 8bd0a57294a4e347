package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// linuxNames are file names Linux allows that are not UTF-8, or that
// become alike once such bytes are replaced: every byte value but NUL,
// '/' and '.' alone (a lone "." is taken), overlong and surrogate
// sequences, U+FFFD itself, and the longest name allowed. Sorted, as
// meta lists them.
func linuxNames() []string {
	var names []string
	for b := 1; b < 256; b++ {
		if b != '/' && b != '.' {
			names = append(names, string([]byte{byte(b)}))
		}
	}
	names = append(names, "caf\xe9.txt", "caf\xe8.txt", "caf\ufffd.txt", "\xc0\xaf", "\xed\xa0\x80",
		"..\xff", "$'x'", strings.Repeat("\xff", 255))
	slices.Sort(names)
	return names
}

// wantNames fails unless got (any order) are exactly want's bytes.
func wantNames(t *testing.T, what string, got, want []string) {
	t.Helper()
	got = slices.Sorted(slices.Values(got))
	if !slices.Equal(got, want) {
		missing, extra := diffNames(want, got)
		t.Fatalf("%s: %d names, want %d; missing %q, not created %q", what, len(got), len(want), first(missing, 10), first(extra, 10))
	}
}

// mountNames lists a directory through the mount.
func mountNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	mustOK(t, "readdir "+dir, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// cliNames lists a directory with `sluice ls -0`: names as they are.
func cliNames(t *testing.T, conf, dir string) []string {
	t.Helper()
	out := mustRun(t, conf, nil, "ls", "-0", dir).stdout
	var names []string
	for _, n := range strings.Split(string(out), "\x00") {
		if n != "" {
			names = append(names, strings.TrimSuffix(n, "/"))
		}
	}
	return names
}

// TestByteNames: names are bytes through every front end. The issue's
// case through a real mount (caf\xe9.txt and caf\xe8.txt are two files;
// an O_TRUNC open of one leaves the other alone), every byte value in
// names, symlink targets and attribute names, rename; the same through
// the NFS gateway (a `sluice nfs` process, driven by Sluice's NFS client,
// raw NFS calls and libnfs); and the CLI's put, ls, get, cat, mv and rm.
// Each front end's names are checked through the others.
func TestByteNames(t *testing.T) {
	base := baseDir(t)
	c := startUp(t, filepath.Join(base, "data"), 1)
	m := mountAt(t, c.conf, "mnt")
	addr, _ := nfsGateway(t, c.conf)
	names := linuxNames()
	e9, e8 := "caf\xe9.txt", "caf\xe8.txt"
	latin9, latin8 := []byte("caf\xe9 is e acute in Latin-1"), []byte("caf\xe8 is e grave in Latin-1")

	t.Run("fuse", func(t *testing.T) {
		dir := mkdirs(t, m.dir, "fuse")
		writeFile(t, filepath.Join(dir, e9), latin9)
		writeFile(t, filepath.Join(dir, e8), latin8)
		wantNames(t, "readdir through the mount", mountNames(t, dir), []string{e8, e9})
		wantContent(t, filepath.Join(dir, e9), latin9)
		wantContent(t, filepath.Join(dir, e8), latin8)
		// open(O_TRUNC) of one is that one.
		f, err := os.OpenFile(filepath.Join(dir, e8), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
		mustOK(t, "open O_TRUNC", err)
		_, err = f.Write([]byte("new"))
		mustOK(t, "write", err)
		mustOK(t, "close", f.Close())
		wantContent(t, filepath.Join(dir, e8), []byte("new"))
		wantContent(t, filepath.Join(dir, e9), latin9)

		// Every name, each file holding its own name.
		all := mkdirs(t, dir, "all")
		for _, n := range names {
			writeFile(t, filepath.Join(all, n), []byte(n))
		}
		wantNames(t, "readdir through the mount", mountNames(t, all), names)
		wantNames(t, "sluice ls -0", cliNames(t, c.conf, "/fuse/all"), names)
		for _, n := range names {
			wantContent(t, filepath.Join(all, n), []byte(n))
		}

		// Symlinks named by each name, their targets through the others.
		links := mkdirs(t, dir, "links")
		for _, n := range names {
			target := "../all/" + n
			mustOK(t, "symlink", os.Symlink(target, filepath.Join(links, n)))
			if got, err := os.Readlink(filepath.Join(links, n)); err != nil || got != target {
				t.Fatalf("readlink %q = %q, %v; want %q", n, got, err, target)
			}
			wantContent(t, filepath.Join(links, n), []byte(n)) // followed by the kernel
		}
		wantNames(t, "readdir of the symlinks", mountNames(t, links), names)

		// Rename: the other name is not touched.
		moved := "moved \xe9\x80\xff"
		mustOK(t, "rename", os.Rename(filepath.Join(dir, e9), filepath.Join(dir, moved)))
		_, err = os.Lstat(filepath.Join(dir, e9))
		wantErrno(t, "the old name after rename", err, syscall.ENOENT)
		wantContent(t, filepath.Join(dir, moved), latin9)
		wantContent(t, filepath.Join(dir, e8), []byte("new"))
		wantNames(t, "readdir after rename", mountNames(t, dir), []string{"all", e8, "links", moved})

		// Attribute names.
		p := filepath.Join(dir, e8)
		mustOK(t, "setxattr", unix.Setxattr(p, "user."+e9, []byte("e9"), 0))
		mustOK(t, "setxattr", unix.Setxattr(p, "user."+e8, []byte("e8"), 0))
		buf := make([]byte, 4096)
		n, err := unix.Listxattr(p, buf)
		mustOK(t, "listxattr", err)
		if got := strings.Split(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00"); !slices.Equal(got, []string{"user." + e8, "user." + e9}) {
			t.Fatalf("listxattr: %q", got)
		}
		for name, want := range map[string]string{"user." + e9: "e9", "user." + e8: "e8"} {
			if n, err := unix.Getxattr(p, name, buf); err != nil || string(buf[:n]) != want {
				t.Fatalf("getxattr %q = %q, %v; want %q", name, buf[:n], err, want)
			}
		}
	})

	t.Run("nfs", func(t *testing.T) {
		mustRun(t, c.conf, nil, "mkdir", "/nfs")
		// The gateway squashes root (its default export): the clients
		// write as nobody.
		chmodPath(t, c.conf, "/nfs", 0o777)
		local := mkdirs(t, base, "nfs-local")
		src9, src8 := filepath.Join(local, "9"), filepath.Join(local, "8")
		writeFile(t, src9, latin9)
		writeFile(t, src8, latin8)
		// Sluice's NFS client: LOOKUP and CREATE by these names.
		mustRun(t, c.conf, nil, "nfs-put", "--server", addr, src9, "/nfs/"+e9)
		mustRun(t, c.conf, nil, "nfs-put", "--server", addr, src8, "/nfs/"+e8)
		wantNames(t, "the mount's readdir of what NFS wrote", mountNames(t, filepath.Join(m.dir, "nfs")), []string{e8, e9})
		for name, want := range map[string][]byte{e9: latin9, e8: latin8} {
			if got := mustRun(t, c.conf, nil, "nfs-get", "--server", addr, "/nfs/"+name, "-").stdout; !bytes.Equal(got, want) {
				t.Fatalf("nfs-get %q: %q, want %q", name, got, want)
			}
		}
		// A create that truncates (UNCHECKED, size 0) is of that one.
		writeFile(t, src8, []byte("new"))
		mustRun(t, c.conf, nil, "nfs-put", "--server", addr, src8, "/nfs/"+e8)
		wantContent(t, filepath.Join(m.dir, "nfs", e8), []byte("new"))
		wantContent(t, filepath.Join(m.dir, "nfs", e9), latin9)

		// Raw calls: every name created, listed, linked to and renamed.
		n := dialNFS(t, addr)
		dir := n.lookup(n.root(), "nfs")
		all := n.mkdir(dir, "all")
		for _, name := range names {
			n.create(all, name)
		}
		wantNames(t, "READDIR", n.readdir(all), names)
		wantNames(t, "the mount's readdir", mountNames(t, filepath.Join(m.dir, "nfs", "all")), names)
		links := n.mkdir(dir, "links")
		for _, name := range names {
			target := "../all/" + name
			n.symlink(links, name, target)
			if got := n.readlink(n.lookup(links, name)); got != target {
				t.Fatalf("READLINK of %q = %q, want %q", name, got, target)
			}
			if got, err := os.Readlink(filepath.Join(m.dir, "nfs", "links", name)); err != nil || got != target {
				t.Fatalf("the mount reads symlink %q made over NFS as %q, %v", name, got, err)
			}
		}
		moved := "moved \xe9\x80\xff"
		n.rename(dir, e9, dir, moved)
		if st := n.lookupStatus(dir, e9); st != nfs3.ErrNoent {
			t.Fatalf("LOOKUP of the old name after RENAME: status %d, want NOENT", st)
		}
		wantNames(t, "READDIR after RENAME", n.readdir(dir), []string{"all", e8, "links", moved})
		wantContent(t, filepath.Join(m.dir, "nfs", moved), latin9)
		wantContent(t, filepath.Join(m.dir, "nfs", e8), []byte("new"))
		for _, name := range names {
			n.remove(all, name)
		}
		wantNames(t, "READDIR after REMOVE", n.readdir(all), nil)

		// A client that is not Sluice's.
		t.Run("libnfs", func(t *testing.T) {
			requireLibnfs(t)
			if got := libnfs(t, "nfs-cat", nfsURL(addr, "/nfs/"+moved)); !bytes.Equal(got, latin9) {
				t.Fatalf("nfs-cat %q: %q", moved, got)
			}
			if got := libnfs(t, "nfs-cat", nfsURL(addr, "/nfs/"+e8)); string(got) != "new" {
				t.Fatalf("nfs-cat %q: %q", e8, got)
			}
			var listed []string
			for _, line := range strings.Split(string(libnfs(t, "nfs-ls", nfsURL(addr, "/nfs"))), "\n") {
				for _, name := range []string{e8, moved, e9} {
					if strings.HasSuffix(line, " "+name) {
						listed = append(listed, name)
					}
				}
			}
			wantNames(t, "nfs-ls", listed, []string{e8, moved})
		})
	})

	t.Run("cli", func(t *testing.T) {
		mustRun(t, c.conf, nil, "mkdir", "/cli")
		local := mkdirs(t, base, "cli-local")
		writeFile(t, filepath.Join(local, e9), latin9)
		mustRun(t, c.conf, nil, "put", filepath.Join(local, e9), "/cli/") // named after the local file
		mustRun(t, c.conf, bytes.NewReader(latin8), "put", "-", "/cli/"+e8)
		wantNames(t, "the mount's readdir of what the CLI wrote", mountNames(t, filepath.Join(m.dir, "cli")), []string{e8, e9})
		if got := string(mustRun(t, c.conf, nil, "ls", "/cli").stdout); got != `$'caf\xe8.txt'`+"\n"+`$'caf\xe9.txt'`+"\n" {
			t.Fatalf("sluice ls: %q", got)
		}
		wantNames(t, "sluice ls -0", cliNames(t, c.conf, "/cli"), []string{e8, e9})

		out := mkdirs(t, base, "cli-out")
		mustRun(t, c.conf, nil, "get", "/cli/"+e9, out+"/")
		wantContent(t, filepath.Join(out, e9), latin9)
		mustRun(t, c.conf, nil, "get", "/cli/"+e8, filepath.Join(out, "x\xe8"))
		wantContent(t, filepath.Join(out, "x\xe8"), latin8)
		// Replacing one (put writes beside it and renames into place, so
		// the mount's cached entry is stale: read with the CLI) leaves
		// the other.
		cat := func(p string, want []byte) {
			t.Helper()
			if got := mustRun(t, c.conf, nil, "cat", p).stdout; !bytes.Equal(got, want) {
				t.Fatalf("sluice cat %q: %q, want %q", p, got, want)
			}
		}
		mustRun(t, c.conf, strings.NewReader("new"), "put", "-", "/cli/"+e8)
		cat("/cli/"+e8, []byte("new"))
		cat("/cli/"+e9, latin9)

		moved := "moved \xe9\x80\xff"
		mustRun(t, c.conf, nil, "mv", "/cli/"+e9, "/cli/"+moved)
		wantNames(t, "after sluice mv", cliNames(t, c.conf, "/cli"), []string{e8, moved})
		cat("/cli/"+moved, latin9)
		mustRun(t, c.conf, nil, "rm", "/cli/"+e8)
		wantNames(t, "after sluice rm", cliNames(t, c.conf, "/cli"), []string{moved})
		cat("/cli/"+moved, latin9)

		// A symlink: ls -l and stat quote its name and target.
		mustOK(t, "symlink", os.Symlink(e8+"\n", filepath.Join(m.dir, "cli", "l\xe9")))
		long := string(mustRun(t, c.conf, nil, "ls", "-l", "/cli").stdout)
		if !strings.Contains(long, ` $'l\xe9' -> $'caf\xe8.txt\x0a'`+"\n") || !strings.Contains(long, ` $'moved \xe9\x80\xff'`+"\n") {
			t.Fatalf("sluice ls -l:\n%s", long)
		}
		if st := string(mustRun(t, c.conf, nil, "stat", "/cli/l\xe9").stdout); !strings.Contains(st, `File: $'/cli/l\xe9'`) || !strings.Contains(st, `Target: $'caf\xe8.txt\x0a'`) {
			t.Fatalf("sluice stat:\n%s", st)
		}
		if !utf8.ValidString(long) {
			t.Fatalf("sluice ls -l printed bytes that are not UTF-8:\n%q", long)
		}

		// Every name: cat and rm take them as arguments.
		all := mkdirs(t, m.dir, "cli", "all")
		var paths []string
		var want []byte
		for _, n := range names {
			writeFile(t, filepath.Join(all, n), []byte(n))
			paths = append(paths, "/cli/all/"+n)
			want = append(want, n...)
		}
		wantNames(t, "sluice ls -0", cliNames(t, c.conf, "/cli/all"), names)
		if got := mustRun(t, c.conf, nil, append([]string{"cat"}, paths...)...).stdout; !bytes.Equal(got, want) {
			t.Fatalf("sluice cat of every name: %q, want %q", preview(got), preview(want))
		}
		mustRun(t, c.conf, nil, append([]string{"rm"}, paths...)...)
		wantNames(t, "after sluice rm of every name", mountNames(t, all), nil)
	})
	checkClean(t, c.conf, 30*time.Second)
}

// nfsConn makes raw NFSv3 calls to a gateway, as root, from a reserved
// port (root's client's; the default export squashes root to nobody).
type nfsConn struct {
	t    *testing.T
	rpc  *oncrpc.Client
	cred *oncrpc.AuthSysCred
}

func dialNFS(t *testing.T, addr string) *nfsConn {
	t.Helper()
	rc, err := oncrpc.DialResv(context.Background(), addr, oncrpc.ResvRequired)
	mustOK(t, "dialing the gateway", err)
	t.Cleanup(func() { rc.Close() })
	return &nfsConn{t: t, rpc: rc, cred: &oncrpc.AuthSysCred{Machine: "test"}}
}

func (n *nfsConn) callProg(prog, proc uint32, args func(w *xdr.Writer)) (nfs3.Status, *xdr.Reader) {
	n.t.Helper()
	var w xdr.Writer
	args(&w)
	res, err := n.rpc.Call(context.Background(), prog, nfs3.Version, proc, n.cred, w.B)
	mustOK(n.t, "NFS call", err)
	r := xdr.NewReader(res)
	return nfs3.Status(r.Uint32()), r
}

// call makes an NFS call that must succeed.
func (n *nfsConn) call(what string, proc uint32, args func(w *xdr.Writer)) *xdr.Reader {
	n.t.Helper()
	st, r := n.callProg(nfs3.ProgNFS, proc, args)
	if st != nfs3.OK {
		n.t.Fatalf("%s: status %d", what, st)
	}
	return r
}

func (n *nfsConn) root() []byte {
	n.t.Helper()
	st, r := n.callProg(nfs3.ProgMount, nfs3.MountMnt, func(w *xdr.Writer) { w.String("/") })
	if st != 0 {
		n.t.Fatalf("MNT /: status %d", st)
	}
	return bytes.Clone(r.Opaque(64))
}

func (n *nfsConn) lookupStatus(dir []byte, name string) nfs3.Status {
	n.t.Helper()
	st, _ := n.callProg(nfs3.ProgNFS, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
	return st
}

func (n *nfsConn) lookup(dir []byte, name string) []byte {
	n.t.Helper()
	r := n.call("LOOKUP "+name, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
	return bytes.Clone(r.Opaque(64))
}

// newHandle reads a post_op_fh3 that must be there.
func (n *nfsConn) newHandle(what string, r *xdr.Reader) []byte {
	n.t.Helper()
	if !r.Bool() {
		n.t.Fatalf("%s returned no handle", what)
	}
	return bytes.Clone(r.Opaque(64))
}

func (n *nfsConn) create(dir []byte, name string) []byte {
	n.t.Helper()
	r := n.call("CREATE "+name, nfs3.ProcCreate, func(w *xdr.Writer) {
		w.Opaque(dir)
		w.String(name)
		w.Uint32(1) // GUARDED
		sattrNone(w)
	})
	return n.newHandle("CREATE", r)
}

func (n *nfsConn) mkdir(dir []byte, name string) []byte {
	n.t.Helper()
	r := n.call("MKDIR "+name, nfs3.ProcMkdir, func(w *xdr.Writer) { w.Opaque(dir); w.String(name); sattrNone(w) })
	return n.newHandle("MKDIR", r)
}

func (n *nfsConn) symlink(dir []byte, name, target string) {
	n.t.Helper()
	n.call("SYMLINK "+name, nfs3.ProcSymlink, func(w *xdr.Writer) { w.Opaque(dir); w.String(name); sattrNone(w); w.String(target) })
}

func (n *nfsConn) readlink(fh []byte) string {
	n.t.Helper()
	r := n.call("READLINK", nfs3.ProcReadlink, func(w *xdr.Writer) { w.Opaque(fh) })
	nfs3.SkipPostOp(r)
	return r.String(4096)
}

func (n *nfsConn) rename(from []byte, fromName string, to []byte, toName string) {
	n.t.Helper()
	n.call("RENAME "+fromName, nfs3.ProcRename, func(w *xdr.Writer) { w.Opaque(from); w.String(fromName); w.Opaque(to); w.String(toName) })
}

func (n *nfsConn) remove(dir []byte, name string) {
	n.t.Helper()
	n.call("REMOVE "+name, nfs3.ProcRemove, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
}

// readdir lists dir with READDIR in small replies, so that a listing
// takes several.
func (n *nfsConn) readdir(dir []byte) []string {
	n.t.Helper()
	var names []string
	var cookie uint64
	verf := make([]byte, 8)
	for {
		r := n.call("READDIR", nfs3.ProcReaddir, func(w *xdr.Writer) { w.Opaque(dir); w.Uint64(cookie); w.Fixed(verf); w.Uint32(2048) })
		nfs3.SkipPostOp(r)
		verf = bytes.Clone(r.Fixed(8))
		for r.Bool() {
			r.Uint64()
			names = append(names, r.String(255))
			cookie = r.Uint64()
		}
		eof := r.Bool()
		mustOK(n.t, "decoding READDIR", r.Err())
		if eof {
			return names
		}
	}
}

// sattrNone is a sattr3 that sets nothing.
func sattrNone(w *xdr.Writer) {
	for range 4 {
		w.Bool(false)
	}
	w.Uint32(0)
	w.Uint32(0)
}
