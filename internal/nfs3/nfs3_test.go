package nfs3_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// env is a cluster, a gateway serving it on loopback, and an RPC client.
type env struct {
	cl   *sdk.Client
	conf config.ClientConf
	rpc  *oncrpc.Client
	cred *oncrpc.AuthSysCred
	opts nfs3.Options // the gateway's (Client is filled in)
	gw   *nfs3.Gateway
	addr string // the gateway's
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOpts(t, nfs3.Options{})
}

func newEnvOpts(t *testing.T, opts nfs3.Options) *env {
	t.Helper()
	cl, conf := nfs3.StartTestCluster(t, 3)
	if opts.Exports == nil {
		// These tests are about NFS semantics as root and as users: root
		// is not squashed. Calls come from a reserved port, as a root
		// client's do; a test run as another user cannot bind one.
		line := "/ 127.0.0.1(rw,no_root_squash)"
		if os.Geteuid() != 0 {
			line = "/ 127.0.0.1(rw,no_root_squash,insecure)"
		}
		exports, err := nfsexport.Parse("exports", line)
		if err != nil {
			t.Fatal(err)
		}
		opts.Exports = exports
	}
	if opts.HandleKey == nil {
		opts.HandleKey = []byte("the env's handle key") // handles outlive a restart (serve)
	}
	e := &env{cl: cl, conf: conf, opts: opts, cred: &oncrpc.AuthSysCred{Machine: "test", UID: 0, GID: 0}}
	e.serve(t)
	return e
}

// serve starts a new gateway (a restart: nothing of the last one's
// state) and connects e's RPC client to it.
func (e *env) serve(t *testing.T) {
	t.Helper()
	opts := e.opts
	opts.Client = e.cl
	g, err := nfs3.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	e.gw = g
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	srv := &oncrpc.Server{Programs: g.Programs(), MaxRecord: nfs3.MaxData + 64<<10}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	rc, err := oncrpc.DialResv(context.Background(), ln.Addr().String(), oncrpc.ResvAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rc.Close() })
	e.rpc = rc
}

// call makes an NFS call and returns its status and the reader after it.
func (e *env) call(t *testing.T, proc uint32, args func(w *xdr.Writer)) (nfs3.Status, *xdr.Reader) {
	t.Helper()
	var w xdr.Writer
	if args != nil {
		args(&w)
	}
	res, err := e.rpc.Call(context.Background(), nfs3.ProgNFS, nfs3.Version, proc, e.cred, w.B)
	if err != nil {
		t.Fatalf("proc %d: %v", proc, err)
	}
	r := xdr.NewReader(res)
	st := nfs3.Status(r.Uint32())
	if r.Err() != nil {
		t.Fatalf("proc %d: reply %x: %v", proc, res, r.Err())
	}
	return st, r
}

func (e *env) rootFH(t *testing.T) []byte {
	t.Helper()
	var w xdr.Writer
	w.String("/")
	res, err := e.rpc.Call(context.Background(), nfs3.ProgMount, nfs3.Version, nfs3.MountMnt, e.cred, w.B)
	if err != nil {
		t.Fatal(err)
	}
	r := xdr.NewReader(res)
	if st := r.Uint32(); st != 0 {
		t.Fatalf("MNT / status %d", st)
	}
	fh := r.Opaque(64)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	return append([]byte(nil), fh...)
}

func sattrEmpty(w *xdr.Writer) {
	for range 4 {
		w.Bool(false)
	}
	w.Uint32(0)
	w.Uint32(0)
}

// create makes name in dir with CREATE (how) and returns the status and
// the new handle.
func (e *env) create(t *testing.T, dir []byte, name string, how uint32) (nfs3.Status, []byte) {
	t.Helper()
	st, r := e.call(t, nfs3.ProcCreate, func(w *xdr.Writer) {
		w.Opaque(dir)
		w.String(name)
		w.Uint32(how)
		if how == 2 {
			w.Fixed([]byte("verifier"))
		} else {
			sattrEmpty(w)
		}
	})
	if st != nfs3.OK {
		return st, nil
	}
	if !r.Bool() {
		t.Fatal("CREATE returned no handle")
	}
	return st, append([]byte(nil), r.Opaque(64)...)
}

func TestGatewaySemantics(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	// CREATE: unchecked, guarded over it (EXIST), exclusive twice (the
	// retransmission finds its own file), exclusive over another (EXIST).
	st, fh := e.create(t, root, "f", 0)
	if st != nfs3.OK {
		t.Fatalf("CREATE: %d", st)
	}
	if st, _ := e.create(t, root, "f", 1); st != nfs3.ErrExist {
		t.Fatalf("GUARDED over an existing file: %d", st)
	}
	st1, x1 := e.create(t, root, "x", 2)
	st2, x2 := e.create(t, root, "x", 2)
	if st1 != nfs3.OK || st2 != nfs3.OK || !bytes.Equal(x1, x2) {
		t.Fatalf("EXCLUSIVE retransmitted: %d %d, handles %x %x", st1, st2, x1, x2)
	}
	if st, _ := e.create(t, root, "f", 2); st != nfs3.ErrExist {
		t.Fatalf("EXCLUSIVE over another file: %d", st)
	}
	// WRITE then READ, with EOF.
	data := bytes.Repeat([]byte("sluice"), 50000)
	st, r := e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(0)
		w.Uint32(uint32(len(data)))
		w.Uint32(nfs3.Unstable)
		w.Opaque(data)
	})
	if st != nfs3.OK {
		t.Fatalf("WRITE: %d", st)
	}
	nfs3.SkipWcc(r)
	if n, committed := r.Uint32(), r.Uint32(); n != uint32(len(data)) || committed != nfs3.FileSync {
		t.Fatalf("WRITE: count %d committed %d", n, committed)
	}
	st, r = e.call(t, nfs3.ProcRead, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(100)
		w.Uint32(1 << 20)
	})
	if st != nfs3.OK {
		t.Fatalf("READ: %d", st)
	}
	nfs3.SkipPostOp(r)
	n, eof, got := r.Uint32(), r.Bool(), r.Opaque(1<<20)
	if r.Err() != nil || int(n) != len(data)-100 || !eof || !bytes.Equal(got, data[100:]) {
		t.Fatalf("READ: %d bytes eof %v err %v", n, eof, r.Err())
	}
	// Bad and stale handles.
	if st, _ := e.call(t, nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque([]byte("garbage")) }); st != nfs3.ErrBadhandle {
		t.Fatalf("GETATTR of a garbage handle: %d", st)
	}
	if st, _ := e.call(t, nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque(e.gw.Handle("/", ids.Ino(1<<40))) }); st != nfs3.ErrStale {
		t.Fatalf("GETATTR of a handle of no inode: %d", st)
	}
	// REMOVE makes the handle stale.
	if st, _ := e.call(t, nfs3.ProcRemove, func(w *xdr.Writer) { w.Opaque(root); w.String("x") }); st != nfs3.OK {
		t.Fatalf("REMOVE: %d", st)
	}
	if st, _ := e.call(t, nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque(x1) }); st != nfs3.ErrStale {
		t.Fatalf("GETATTR of a removed file: %d", st)
	}
	// MKNOD: a FIFO works; a regular file is BADTYPE (devices and
	// sockets: TestGatewaySpecialFiles).
	if st, _ := e.call(t, nfs3.ProcMknod, func(w *xdr.Writer) { w.Opaque(root); w.String("p"); w.Uint32(7); sattrEmpty(w) }); st != nfs3.OK {
		t.Fatalf("MKNOD fifo: %d", st)
	}
	if st, _ := e.call(t, nfs3.ProcMknod, func(w *xdr.Writer) { w.Opaque(root); w.String("r"); w.Uint32(1) }); st != nfs3.ErrBadtype {
		t.Fatalf("MKNOD of a regular file: %d", st)
	}
	// RMDIR of a non-empty directory, LOOKUP of a missing name.
	if st, _ := e.call(t, nfs3.ProcMkdir, func(w *xdr.Writer) { w.Opaque(root); w.String("d"); sattrEmpty(w) }); st != nfs3.OK {
		t.Fatalf("MKDIR: %d", st)
	}
	if st, _ := e.call(t, nfs3.ProcRmdir, func(w *xdr.Writer) { w.Opaque(root); w.String("f") }); st != nfs3.ErrNotdir {
		t.Fatalf("RMDIR of a file: %d", st)
	}
	if st, _ := e.call(t, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(root); w.String("nope") }); st != nfs3.ErrNoent {
		t.Fatalf("LOOKUP of a missing name: %d", st)
	}
	long := strings.Repeat("n", 300)
	if st, _ := e.call(t, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(root); w.String(long) }); st != nfs3.ErrNametoolong {
		t.Fatalf("LOOKUP of a 300-byte name: %d", st)
	}
	if st, _ := e.create(t, root, long, 1); st != nfs3.ErrNametoolong {
		t.Fatalf("CREATE of a 300-byte name: %d", st)
	}
	// ".." walks up: from d to the root, and the root's is the root.
	st, r = e.call(t, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(root); w.String("d") })
	if st != nfs3.OK {
		t.Fatalf("LOOKUP d: %d", st)
	}
	d := append([]byte(nil), r.Opaque(64)...)
	for _, from := range [][]byte{d, root} {
		st, r = e.call(t, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(from); w.String("..") })
		if got := r.Opaque(64); st != nfs3.OK || !bytes.Equal(got, root) {
			t.Fatalf("LOOKUP .. : status %d, handle %x, want the root's %x", st, got, root)
		}
	}
	if st, _ := e.call(t, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(fh); w.String(".") }); st != nfs3.ErrNotdir {
		t.Fatalf("LOOKUP . in a file: %d", st)
	}
	// A zero-byte WRITE past the end changes nothing.
	st, _ = e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(5 << 20)
		w.Uint32(0)
		w.Uint32(nfs3.FileSync)
		w.Opaque(nil)
	})
	if st != nfs3.OK || e.size(t, fh) != int64(len(data)) {
		t.Fatalf("zero-byte WRITE: status %d, size %d (want %d)", st, e.size(t, fh), len(data))
	}
	// A private file and directory of root's, read and written first by
	// root (so the gateway's SDK holds capabilities for them).
	setMode := func(h []byte, mode uint32) {
		if st, _ := e.call(t, nfs3.ProcSetattr, func(w *xdr.Writer) {
			w.Opaque(h)
			w.Bool(true)
			w.Uint32(mode)
			for range 3 {
				w.Bool(false)
			}
			w.Uint32(0)
			w.Uint32(0)
			w.Bool(false)
		}); st != nfs3.OK {
			t.Fatalf("SETATTR mode: %d", st)
		}
	}
	setMode(fh, 0o600)
	readAll := func() (nfs3.Status, []byte) {
		st, r := e.call(t, nfs3.ProcRead, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(1 << 20) })
		if st != nfs3.OK {
			return st, nil
		}
		nfs3.SkipPostOp(r)
		r.Uint32()
		r.Bool()
		return st, append([]byte(nil), r.Opaque(1<<20)...)
	}
	if st, got := readAll(); st != nfs3.OK || !bytes.Equal(got, data) {
		t.Fatalf("root's READ: %d", st)
	}
	st, r = e.call(t, nfs3.ProcMkdir, func(w *xdr.Writer) { w.Opaque(root); w.String("private"); sattrEmpty(w) })
	if st != nfs3.OK || !r.Bool() {
		t.Fatalf("MKDIR private: %d", st)
	}
	priv := append([]byte(nil), r.Opaque(64)...)
	for i := range 40 {
		if st, _ := e.create(t, priv, fmt.Sprintf("secret-%02d", i), 0); st != nfs3.OK {
			t.Fatalf("CREATE in private: %d", st)
		}
	}
	setMode(priv, 0o700)
	// Root lists it in small replies (a listing with cookies).
	st, r = e.call(t, nfs3.ProcReaddir, func(w *xdr.Writer) { w.Opaque(priv); w.Uint64(0); w.Fixed(make([]byte, 8)); w.Uint32(512) })
	if st != nfs3.OK {
		t.Fatalf("root's READDIR: %d", st)
	}
	nfs3.SkipPostOp(r)
	verf := append([]byte(nil), r.Fixed(8)...)

	// Another user: no READ, no WRITE (and nothing written), no READDIR
	// even with root's cookie and verifier.
	e.cred = &oncrpc.AuthSysCred{Machine: "test", UID: 1000, GID: 1000}
	if st, _ := readAll(); st != nfs3.ErrAcces {
		t.Fatalf("READ of root's 0600 file as uid 1000: %d", st)
	}
	st, _ = e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(0)
		w.Uint32(6)
		w.Uint32(nfs3.FileSync)
		w.Opaque([]byte("HACKED"))
	})
	if st != nfs3.ErrAcces {
		t.Fatalf("WRITE as another user: %d", st)
	}
	st, _ = e.call(t, nfs3.ProcReaddir, func(w *xdr.Writer) { w.Opaque(priv); w.Uint64(2); w.Fixed(verf); w.Uint32(4096) })
	if st != nfs3.ErrAcces {
		t.Fatalf("READDIR of root's 0700 directory with root's cookie, as uid 1000: %d", st)
	}
	e.cred = &oncrpc.AuthSysCred{Machine: "test"}
	if st, got := readAll(); st != nfs3.OK || !bytes.Equal(got, data) {
		t.Fatalf("the refused WRITE changed the file (status %d)", st)
	}
}

func (e *env) size(t *testing.T, fh []byte) int64 {
	t.Helper()
	st, r := e.call(t, nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque(fh) })
	if st != nfs3.OK {
		t.Fatalf("GETATTR: %d", st)
	}
	r.Fixed(20)
	return int64(r.Uint64())
}

// TestGatewayBadCalls: unknown procedures, truncated arguments and a
// bad directory cookie are answered with the right error, and the
// connection goes on serving.
func TestGatewayBadCalls(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	_, err := e.rpc.Call(context.Background(), nfs3.ProgNFS, nfs3.Version, 99, e.cred, nil)
	var ae *oncrpc.AcceptError
	if !errors.As(err, &ae) || ae.Stat != oncrpc.ProcUnavail {
		t.Fatalf("procedure 99: %v", err)
	}
	_, err = e.rpc.Call(context.Background(), nfs3.ProgNFS, 4, nfs3.ProcNull, e.cred, nil)
	if !errors.As(err, &ae) || ae.Stat != oncrpc.ProgMismatch || ae.Low != 3 || ae.High != 3 {
		t.Fatalf("version 4: %v", err)
	}
	// WRITE cut short inside its data.
	var w xdr.Writer
	w.Opaque(root)
	w.Uint64(0)
	w.Uint32(100)
	w.Uint32(0)
	w.Uint32(100)
	w.B = append(w.B, 1, 2, 3)
	_, err = e.rpc.Call(context.Background(), nfs3.ProgNFS, nfs3.Version, nfs3.ProcWrite, e.cred, w.B)
	if !errors.As(err, &ae) || ae.Stat != oncrpc.GarbageArgs {
		t.Fatalf("truncated WRITE: %v", err)
	}
	// A cookie from a listing the gateway never made.
	st, _ := e.call(t, nfs3.ProcReaddir, func(w *xdr.Writer) {
		w.Opaque(root)
		w.Uint64(5)
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], 12345)
		w.Fixed(v[:])
		w.Uint32(4096)
	})
	if st != nfs3.ErrBadCookie {
		t.Fatalf("READDIR with an unknown cookie verifier: %d", st)
	}
	// Still serving.
	if st, _ := e.call(t, nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque(root) }); st != nfs3.OK {
		t.Fatalf("GETATTR after bad calls: %d", st)
	}
}

// readdirNames lists dir from cookie with verifier verf, in replies of
// count bytes, to the end; it returns the names and the last verifier.
func (e *env) readdirNames(t *testing.T, dir []byte, cookie uint64, verf []byte, count uint32, max int) ([]string, uint64, []byte) {
	t.Helper()
	var names []string
	for len(names) < max {
		st, r := e.call(t, nfs3.ProcReaddir, func(w *xdr.Writer) { w.Opaque(dir); w.Uint64(cookie); w.Fixed(verf); w.Uint32(count) })
		if st != nfs3.OK {
			t.Fatalf("READDIR at cookie %d: %d", cookie, st)
		}
		nfs3.SkipPostOp(r)
		verf = append([]byte(nil), r.Fixed(8)...)
		for r.Bool() {
			r.Uint64()
			names = append(names, r.String(255))
			cookie = r.Uint64()
		}
		if r.Bool() || r.Err() != nil {
			break
		}
	}
	return names, cookie, verf
}

// TestReaddirAcrossRestart: a listing continues where it was after the
// gateway restarts (its cookies forgotten), every name exactly once.
func TestReaddirAcrossRestart(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	var want []string
	for i := range 300 {
		name := fmt.Sprintf("n%03d", i)
		want = append(want, name)
		if st, _ := e.create(t, root, name, 0); st != nfs3.OK {
			t.Fatalf("CREATE: %d", st)
		}
	}
	first, cookie, verf := e.readdirNames(t, root, 0, make([]byte, 8), 1024, 100)
	e.serve(t)
	rest, _, _ := e.readdirNames(t, root, cookie, verf, 1024, 1000)
	got := append(first, rest...)
	if !slices.Equal(got, want) {
		t.Fatalf("listed %d names across a restart (first %d before it), want the %d in order", len(got), len(first), len(want))
	}
}

// TestWriteRemovedElsewhere: a WRITE to a file another client removed
// answers STALE (the handle outlived its file), not NOENT or EIO.
func TestWriteRemovedElsewhere(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	st, fh := e.create(t, root, "f", 0)
	if st != nfs3.OK {
		t.Fatalf("CREATE: %d", st)
	}
	write := func() nfs3.Status {
		st, _ := e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
			w.Opaque(fh)
			w.Uint64(0)
			w.Uint32(4096)
			w.Uint32(nfs3.FileSync)
			w.Opaque(make([]byte, 4096))
		})
		return st
	}
	if st := write(); st != nfs3.OK {
		t.Fatalf("WRITE: %d", st)
	}
	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := other.Remove(context.Background(), "/f"); err != nil {
		t.Fatal(err)
	}
	if st := write(); st != nfs3.ErrStale {
		t.Fatalf("WRITE after another client removed the file: %d, want STALE (%d)", st, nfs3.ErrStale)
	}
}
