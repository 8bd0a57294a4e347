package nfs3_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// The export options as an attacker meets them: real TCP connections to
// a gateway, from a chosen source address and port, with whatever
// AUTH_SYS credential the attacker likes.

// peer is a client connection from a chosen source address.
type peer struct {
	t    *testing.T
	rpc  *oncrpc.Client
	cred *oncrpc.AuthSysCred
}

// reuse lets a test bind a port whose last connection is in TIME_WAIT.
func reuse(_, _ string, c syscall.RawConn) error {
	var serr error
	c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
	return serr
}

// dialFrom connects to the gateway from ip:port (port 0: a reserved
// port, as root clients bind).
func (e *env) dialFrom(t *testing.T, ip string, port int, uid, gid uint32, gids ...uint32) *peer {
	t.Helper()
	if port == 0 && os.Geteuid() != 0 {
		t.Skip("binding a reserved port needs root")
	}
	// Reserved ports from the top, as clients bind them; an unprivileged
	// port in use (by another connection on this machine) gives way to
	// the next one up.
	low, high := 512, 1023
	if port != 0 {
		low, high = port, port+200
	}
	var nc net.Conn
	var err error
	for i := range high - low + 1 {
		p := high - i
		if port != 0 {
			p = low + i
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip), Port: p}, Control: reuse}
		if nc, err = d.DialContext(context.Background(), "tcp", e.addr); err == nil ||
			!errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			break
		}
	}
	if err != nil {
		t.Fatalf("dialing from %s:%d: %v", ip, port, err)
	}
	p := &peer{t: t, rpc: oncrpc.NewClient(nc), cred: &oncrpc.AuthSysCred{Machine: "attacker", UID: uid, GID: gid, GIDs: gids}}
	t.Cleanup(func() { p.rpc.Close() })
	return p
}

func (p *peer) mnt(path string) (uint32, []byte) {
	p.t.Helper()
	var w xdr.Writer
	w.String(path)
	res, err := p.rpc.Call(context.Background(), nfs3.ProgMount, nfs3.Version, nfs3.MountMnt, p.cred, w.B)
	if err != nil {
		p.t.Fatalf("MNT %s: %v", path, err)
	}
	r := xdr.NewReader(res)
	st := r.Uint32()
	if st != 0 {
		return st, nil
	}
	return st, append([]byte(nil), r.Opaque(64)...)
}

func (p *peer) call(proc uint32, args func(w *xdr.Writer)) (nfs3.Status, *xdr.Reader) {
	p.t.Helper()
	var w xdr.Writer
	args(&w)
	res, err := p.rpc.Call(context.Background(), nfs3.ProgNFS, nfs3.Version, proc, p.cred, w.B)
	if err != nil {
		p.t.Fatalf("proc %d: %v", proc, err)
	}
	r := xdr.NewReader(res)
	return nfs3.Status(r.Uint32()), r
}

// read READs a whole small file: its status and data.
func (p *peer) read(fh []byte) (nfs3.Status, []byte) {
	p.t.Helper()
	st, r := p.call(nfs3.ProcRead, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(1 << 16) })
	if st != nfs3.OK {
		return st, nil
	}
	nfs3.SkipPostOp(r)
	r.Uint32()
	r.Bool()
	return st, r.Opaque(1 << 16)
}

func (p *peer) lookup(dir []byte, name string) (nfs3.Status, []byte) {
	p.t.Helper()
	st, r := p.call(nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
	if st != nfs3.OK {
		return st, nil
	}
	return st, append([]byte(nil), r.Opaque(64)...)
}

// exportsEnv is a gateway with exports (one line each) over a cluster
// holding root's 0600 file /secret, a public 0644 file /pub, and a
// directory /proj owned by uid 1000 with its own 0600 file.
func exportsEnv(t *testing.T, lines string) *env {
	t.Helper()
	exports, err := nfsexport.Parse("exports", lines)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvOpts(t, nfs3.Options{Exports: exports})
	ctx := context.Background()
	for _, f := range []struct {
		path string
		mode uint32
		uid  uint32
	}{{"/secret", 0o600, 0}, {"/pub", 0o644, 0}, {"/proj/own", 0o600, 1000}} {
		if f.path == "/proj/own" {
			if err := e.cl.Mkdir(ctx, "/proj", 0o755); err != nil {
				t.Fatal(err)
			}
			a, _ := e.cl.Stat(ctx, "/proj")
			if _, err := e.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: a.Ino, UID: &f.uid, GID: &f.uid}); err != nil {
				t.Fatal(err)
			}
		}
		fl, err := e.cl.Create(ctx, f.path, f.mode)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fl.WriteAtContext(ctx, []byte("contents of "+f.path), 0); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cl.SetAttr(ctx, metaapi.SetAttrReq{Ino: fl.Attr().Ino, UID: &f.uid, GID: &f.uid}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

func (e *env) ino(t *testing.T, p string) ids.Ino {
	t.Helper()
	a, err := e.cl.Stat(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return a.Ino
}

// TestExportSecureRootSquash: the check. With the default
// options (root_squash, secure), a process claiming uid 0 from port
// 40000 is refused at MOUNT and on every call, even with a valid handle
// of root's 0600 file; from a reserved port it is squashed to nobody and
// still cannot read it.
func TestExportSecureRootSquash(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1(rw)")
	secret := e.gw.Handle("/", e.ino(t, "/secret")) // as if stolen from a legitimate client
	evil := e.dialFrom(t, "127.0.0.1", 40000, 0, 0, 0)
	if st, _ := evil.mnt("/"); st != 13 {
		t.Fatalf("MNT from port 40000: status %d, want MNT3ERR_ACCES", st)
	}
	if st, data := evil.read(secret); st != nfs3.ErrPerm {
		t.Fatalf("READ of root's 0600 file as uid 0 from port 40000: status %d (%q), want NFS3ERR_PERM", st, data)
	}
	if st, _ := evil.call(nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque(secret) }); st != nfs3.ErrPerm {
		t.Fatalf("GETATTR from port 40000: %d", st)
	}

	root := e.dialFrom(t, "127.0.0.1", 0, 0, 0, 0)
	st, fh := root.mnt("/")
	if st != 0 {
		t.Fatalf("MNT from a reserved port: %d", st)
	}
	lst, sfh := root.lookup(fh, "secret")
	if lst != nfs3.OK {
		t.Fatalf("LOOKUP secret: %d", st)
	}
	if st, data := root.read(sfh); st != nfs3.ErrAcces {
		t.Fatalf("READ of root's 0600 file as squashed root: status %d (%q), want NFS3ERR_ACCES", st, data)
	}
	// Squashed, root reads what nobody may, and creates as nobody.
	if st, data := root.read(e.gw.Handle("/", e.ino(t, "/pub"))); st != nfs3.OK || string(data) != "contents of /pub" {
		t.Fatalf("READ of /pub as squashed root: %d %q", st, data)
	}
	if st, _ := root.call(nfs3.ProcMkdir, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.String("d")
		w.Bool(false)
		w.Bool(false)
		w.Bool(false)
		w.Bool(false)
		w.Uint32(0)
		w.Uint32(0)
	}); st != nfs3.ErrAcces {
		t.Fatalf("MKDIR in root's 0755 / as squashed root: %d", st)
	}
	// A user from a reserved port is who it says.
	user := e.dialFrom(t, "127.0.0.1", 0, 1000, 1000)
	if st, data := user.read(e.gw.Handle("/", e.ino(t, "/proj/own"))); st != nfs3.OK || string(data) != "contents of /proj/own" {
		t.Fatalf("READ of uid 1000's file as uid 1000: %d %q", st, data)
	}
}

// TestExportInsecure: an insecure export takes calls from port 40000,
// and root is squashed there all the same.
func TestExportInsecure(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1(rw,insecure)")
	if _, err := e.cl.SetAttr(context.Background(), metaapi.SetAttrReq{Ino: e.ino(t, "/secret"), Mode: ptr(uint32(0o640))}); err != nil {
		t.Fatal(err)
	}
	evil := e.dialFrom(t, "127.0.0.1", 40000, 0, 0, 0)
	st, fh := evil.mnt("/")
	if st != 0 {
		t.Fatalf("MNT: %d", st)
	}
	_, sfh := evil.lookup(fh, "secret")
	if st, data := evil.read(sfh); st != nfs3.ErrAcces {
		t.Fatalf("READ of root's 0600 file as uid 0 from port 40000: status %d (%q), want NFS3ERR_ACCES", st, data)
	}
	// Squashed by field: root's group 0 is gone too (the file's mode
	// lets group 0 read it).
	evil.cred = &oncrpc.AuthSysCred{UID: 5, GID: 0, GIDs: []uint32{0}}
	if st, _ := evil.read(sfh); st != nfs3.ErrAcces {
		t.Fatalf("READ of a 0640 root:root file as uid 5 in group 0: %d", st)
	}
}

func ptr[T any](v T) *T { return &v }

// TestExportNoRootSquash: root from a reserved port reads root's file.
func TestExportNoRootSquash(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1(rw,no_root_squash)")
	root := e.dialFrom(t, "127.0.0.1", 0, 0, 0)
	_, fh := root.mnt("/")
	_, sfh := root.lookup(fh, "secret")
	if st, data := root.read(sfh); st != nfs3.OK || string(data) != "contents of /secret" {
		t.Fatalf("READ as root with no_root_squash: %d %q", st, data)
	}
	// Still secure: not from port 40000.
	evil := e.dialFrom(t, "127.0.0.1", 40000, 0, 0)
	if st, _ := evil.read(sfh); st != nfs3.ErrPerm {
		t.Fatalf("READ from port 40000: %d", st)
	}
}

// TestExportAllSquash: every caller is anonuid/anongid: uid 1000 cannot
// read its own 0600 file, and what it creates belongs to the anonymous
// identity.
func TestExportAllSquash(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1(rw,all_squash,anonuid=2000,anongid=2000)")
	// Let the anonymous identity write in /proj.
	if _, err := e.cl.SetAttr(context.Background(), metaapi.SetAttrReq{Ino: e.ino(t, "/proj"), Mode: ptr(uint32(0o777))}); err != nil {
		t.Fatal(err)
	}
	user := e.dialFrom(t, "127.0.0.1", 0, 1000, 1000)
	_, fh := user.mnt("/proj")
	_, own := user.lookup(fh, "own")
	if st, _ := user.read(own); st != nfs3.ErrAcces {
		t.Fatalf("READ of uid 1000's 0600 file as uid 1000 under all_squash: %d", st)
	}
	st, _ := user.call(nfs3.ProcCreate, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.String("new")
		w.Uint32(1)
		sattrEmpty(w)
	})
	if st != nfs3.OK {
		t.Fatalf("CREATE: %d", st)
	}
	a, err := e.cl.Stat(context.Background(), "/proj/new")
	if err != nil || a.UID != 2000 || a.GID != 2000 {
		t.Fatalf("created under all_squash: %+v %v, want owner 2000:2000", a, err)
	}
}

// TestExportNetworks: a client outside the export's networks is refused
// at MOUNT and on a handle it guessed or stole (a valid one).
func TestExportNetworks(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1/32(rw,no_root_squash,insecure)")
	pub := e.gw.Handle("/", e.ino(t, "/pub"))
	other := e.dialFrom(t, "127.0.0.2", 40000, 1000, 1000)
	if st, _ := other.mnt("/"); st != 13 {
		t.Fatalf("MNT from 127.0.0.2: %d", st)
	}
	if st, data := other.read(pub); st != nfs3.ErrAcces {
		t.Fatalf("READ from 127.0.0.2 with a valid handle: %d %q", st, data)
	}
	// Every procedure that takes a handle, with well-formed arguments:
	// each re-checks the caller.
	dir := e.gw.Handle("/", ids.RootIno)
	for proc, args := range everyProc(dir, pub) {
		if st, _ := other.call(proc, args); st != nfs3.ErrAcces {
			t.Errorf("proc %d from 127.0.0.2 with valid handles: %d, want NFS3ERR_ACCES", proc, st)
		}
	}
	e2 := exportsEnv(t, "/ 127.0.0.1/32(rw,no_root_squash)") // secure
	evil := e2.dialFrom(t, "127.0.0.1", 40000, 0, 0)
	for proc, args := range everyProc(e2.gw.Handle("/", ids.RootIno), e2.gw.Handle("/", e2.ino(t, "/pub"))) {
		if st, _ := evil.call(proc, args); st != nfs3.ErrPerm {
			t.Errorf("proc %d from port 40000 to a secure export: %d, want NFS3ERR_PERM", proc, st)
		}
	}
	// The same from the allowed address works.
	ok := e.dialFrom(t, "127.0.0.1", 40000, 1000, 1000)
	if st, data := ok.read(pub); st != nfs3.OK || string(data) != "contents of /pub" {
		t.Fatalf("READ from 127.0.0.1: %d %q", st, data)
	}
}

// everyProc is well-formed arguments for every NFS procedure but NULL,
// on directory dir and file f.
func everyProc(dir, f []byte) map[uint32]func(w *xdr.Writer) {
	m := modifying(dir, f)
	for proc, args := range map[uint32]func(w *xdr.Writer){
		nfs3.ProcGetattr:     func(w *xdr.Writer) { w.Opaque(f) },
		nfs3.ProcLookup:      func(w *xdr.Writer) { w.Opaque(dir); w.String("pub") },
		nfs3.ProcAccess:      func(w *xdr.Writer) { w.Opaque(f); w.Uint32(0x3f) },
		nfs3.ProcReadlink:    func(w *xdr.Writer) { w.Opaque(f) },
		nfs3.ProcRead:        func(w *xdr.Writer) { w.Opaque(f); w.Uint64(0); w.Uint32(100) },
		nfs3.ProcReaddir:     func(w *xdr.Writer) { w.Opaque(dir); w.Uint64(0); w.Uint64(0); w.Uint32(4096) },
		nfs3.ProcReaddirplus: func(w *xdr.Writer) { w.Opaque(dir); w.Uint64(0); w.Uint64(0); w.Uint32(4096); w.Uint32(8192) },
		nfs3.ProcFsstat:      func(w *xdr.Writer) { w.Opaque(dir) },
		nfs3.ProcFsinfo:      func(w *xdr.Writer) { w.Opaque(dir) },
		nfs3.ProcPathconf:    func(w *xdr.Writer) { w.Opaque(dir) },
		nfs3.ProcCommit:      func(w *xdr.Writer) { w.Opaque(f); w.Uint64(0); w.Uint32(0) },
	} {
		m[proc] = args
	}
	return m
}

// modifying is well-formed arguments for every procedure that changes
// something, on directory dir (holding a file pub and a directory proj)
// and file f.
func modifying(dir, f []byte) map[uint32]func(w *xdr.Writer) {
	sattr := func(w *xdr.Writer) { sattrEmpty(w) }
	return map[uint32]func(w *xdr.Writer){
		nfs3.ProcSetattr: func(w *xdr.Writer) {
			w.Opaque(f)
			w.Bool(true)
			w.Uint32(0o777)
			w.Bool(false)
			w.Bool(false)
			w.Bool(false)
			w.Uint32(0)
			w.Uint32(0)
			w.Bool(false)
		},
		nfs3.ProcWrite:   func(w *xdr.Writer) { w.Opaque(f); w.Uint64(0); w.Uint32(1); w.Uint32(2); w.Opaque([]byte("x")) },
		nfs3.ProcCreate:  func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); w.Uint32(0); sattr(w) },
		nfs3.ProcMkdir:   func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); sattr(w) },
		nfs3.ProcSymlink: func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); sattr(w); w.String("pub") },
		nfs3.ProcMknod:   func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); w.Uint32(7); sattr(w) },
		nfs3.ProcRemove:  func(w *xdr.Writer) { w.Opaque(dir); w.String("pub") },
		nfs3.ProcRmdir:   func(w *xdr.Writer) { w.Opaque(dir); w.String("proj") },
		nfs3.ProcRename:  func(w *xdr.Writer) { w.Opaque(dir); w.String("pub"); w.Opaque(dir); w.String("moved") },
		nfs3.ProcLink:    func(w *xdr.Writer) { w.Opaque(f); w.Opaque(dir); w.String("l") },
	}
}

// TestExportReadOnly: a ro export refuses every modifying procedure with
// NFS3ERR_ROFS (root not squashed: the export, not the mode, refuses),
// reads, and reports no modify rights in ACCESS.
func TestExportReadOnly(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1(ro,no_root_squash)")
	root := e.dialFrom(t, "127.0.0.1", 0, 0, 0)
	st, fh := root.mnt("/")
	if st != 0 {
		t.Fatalf("MNT: %d", st)
	}
	_, pub := root.lookup(fh, "pub")
	for proc, args := range modifying(fh, pub) {
		if st, _ := root.call(proc, args); st != nfs3.ErrRofs {
			t.Errorf("proc %d on a ro export: %d, want NFS3ERR_ROFS", proc, st)
		}
	}
	if st, data := root.read(pub); st != nfs3.OK || string(data) != "contents of /pub" {
		t.Fatalf("READ on a ro export: %d %q", st, data)
	}
	ast, r := root.call(nfs3.ProcAccess, func(w *xdr.Writer) { w.Opaque(fh); w.Uint32(0x3f) })
	nfs3.SkipPostOp(r)
	if got := r.Uint32(); ast != nfs3.OK || got != 0x03 {
		t.Fatalf("ACCESS of / as root on a ro export: %d %#x, want READ|LOOKUP", ast, got)
	}
	// Nothing changed.
	if a, err := e.cl.Stat(context.Background(), "/pub"); err != nil || a.Mode != 0o644 || a.Size != int64(len("contents of /pub")) {
		t.Fatalf("/pub after the refused calls: %+v %v", a, err)
	}
}

// TestExportSubtree: a client of an export below the root cannot leave
// it: MOUNT of anything else is refused, the export's root is its own
// parent, a handle the client forges (another inode in its own handle)
// is stale, a handle of another export is stale, and a symbolic link in
// a MOUNT path out of the export is refused.
func TestExportSubtree(t *testing.T) {
	e := exportsEnv(t, "/proj 127.0.0.1(rw,no_root_squash)\n/pub-only 127.0.0.2(rw)")
	ctx := context.Background()
	if err := e.cl.Symlink(ctx, "/", "/proj/up"); err != nil {
		t.Fatal(err)
	}
	root := e.dialFrom(t, "127.0.0.1", 0, 0, 0)
	for _, p := range []string{"/", "/pub", "/projects", "/proj/../secret", "/proj/up"} {
		if st, _ := root.mnt(p); st != 13 {
			t.Errorf("MNT %s: %d, want MNT3ERR_ACCES", p, st)
		}
	}
	st, fh := root.mnt("/proj")
	if st != 0 {
		t.Fatalf("MNT /proj: %d", st)
	}
	lst, up := root.lookup(fh, "..")
	if lst != nfs3.OK || !bytes.Equal(up, fh) {
		t.Fatalf("LOOKUP .. at the export's root: %d %x, want its own handle %x", lst, up, fh)
	}
	// Forged: the handle of /secret made from the client's own by
	// changing the inode number.
	forged := append([]byte(nil), fh...)
	secret := e.ino(t, "/secret")
	for i := range 8 {
		forged[8+i] = byte(uint64(secret) >> (56 - 8*i))
	}
	if st, _ := root.read(forged); st != nfs3.ErrStale {
		t.Fatalf("READ of a forged handle: %d, want NFS3ERR_STALE", st)
	}
	// A handle from before exports (magic and inode) is stale.
	if st, _ := root.read(append([]byte("SLU1"), forged[8:16]...)); st != nfs3.ErrStale {
		t.Fatalf("READ of an old-format handle: %d", st)
	}
	// A handle of the root export, which is not in the table.
	if st, _ := root.read(e.gw.Handle("/", secret)); st != nfs3.ErrStale {
		t.Fatalf("READ of a handle of an unexported export: %d", st)
	}
	// Handles of two exports in one call.
	other := e.gw.Handle("/pub-only", ids.RootIno)
	if st, _ := root.call(nfs3.ProcRename, func(w *xdr.Writer) { w.Opaque(fh); w.String("own"); w.Opaque(other); w.String("x") }); st != nfs3.ErrXdev {
		t.Fatalf("RENAME across exports: %d", st)
	}
	// What the export holds is served.
	_, own := root.lookup(fh, "own")
	if st, data := root.read(own); st != nfs3.OK || string(data) != "contents of /proj/own" {
		t.Fatalf("READ in the export: %d %q", st, data)
	}
}

// TestExportHandleKey: handles outlive a restart under the same key and
// are stale under another.
func TestExportHandleKey(t *testing.T) {
	e := exportsEnv(t, "/ 127.0.0.1(rw,no_root_squash)")
	root := e.dialFrom(t, "127.0.0.1", 0, 0, 0)
	_, fh := root.mnt("/")
	_, pub := root.lookup(fh, "pub")
	e.serve(t) // a restart, same key
	root = e.dialFrom(t, "127.0.0.1", 0, 0, 0)
	if st, _ := root.read(pub); st != nfs3.OK {
		t.Fatalf("READ after a restart: %d", st)
	}
	e.opts.HandleKey = []byte("another key")
	e.serve(t)
	root = e.dialFrom(t, "127.0.0.1", 0, 0, 0)
	if st, _ := root.read(pub); st != nfs3.ErrStale {
		t.Fatalf("READ after a restart under another key: %d", st)
	}
}
