package nfs3_test

import (
	"bytes"
	"testing"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// fattr is what these tests read of a fattr3.
type fattr struct {
	typ, mode, uid     uint32
	size               uint64
	rdevMajor, rdevMin uint32
}

func readFattr(r *xdr.Reader) fattr {
	var a fattr
	a.typ, a.mode = r.Uint32(), r.Uint32()
	r.Uint32() // nlink
	a.uid = r.Uint32()
	r.Uint32() // gid
	a.size = r.Uint64()
	r.Uint64() // used
	a.rdevMajor, a.rdevMin = r.Uint32(), r.Uint32()
	r.Fixed(8 + 8 + 3*8) // fsid, fileid, times
	return a
}

func (e *env) getattr(t *testing.T, fh []byte) fattr {
	t.Helper()
	st, r := e.call(t, nfs3.ProcGetattr, func(w *xdr.Writer) { w.Opaque(fh) })
	if st != nfs3.OK {
		t.Fatalf("GETATTR: %d", st)
	}
	a := readFattr(r)
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	return a
}

// mknod makes name in dir with MKNOD (ftype3 typ, device major:minor)
// and returns the status, the new handle and its attributes.
func (e *env) mknod(t *testing.T, dir []byte, name string, typ, major, minor uint32) (nfs3.Status, []byte, fattr) {
	t.Helper()
	st, r := e.call(t, nfs3.ProcMknod, func(w *xdr.Writer) {
		w.Opaque(dir)
		w.String(name)
		w.Uint32(typ)
		w.Bool(true) // mode
		w.Uint32(0o640)
		for range 3 {
			w.Bool(false)
		}
		w.Uint32(0)
		w.Uint32(0)
		if typ == 3 || typ == 4 {
			w.Uint32(major)
			w.Uint32(minor)
		}
	})
	if st != nfs3.OK {
		return st, nil, fattr{}
	}
	if !r.Bool() {
		t.Fatal("MKNOD returned no handle")
	}
	fh := append([]byte(nil), r.Opaque(64)...)
	if !r.Bool() {
		t.Fatal("MKNOD returned no attributes")
	}
	return st, fh, readFattr(r)
}

func (e *env) setattrMode(t *testing.T, fh []byte, mode uint32) {
	t.Helper()
	st, _ := e.call(t, nfs3.ProcSetattr, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Bool(true)
		w.Uint32(mode)
		for range 3 {
			w.Bool(false)
		}
		w.Uint32(0)
		w.Uint32(0)
		w.Bool(false)
	})
	if st != nfs3.OK {
		t.Fatalf("SETATTR mode %o: %d", mode, st)
	}
}

func (e *env) write(t *testing.T, fh []byte, off uint64, p []byte) nfs3.Status {
	t.Helper()
	st, _ := e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Uint64(off)
		w.Uint32(uint32(len(p)))
		w.Uint32(nfs3.FileSync)
		w.Opaque(p)
	})
	return st
}

func (e *env) as(uid, gid uint32) {
	e.cred = &oncrpc.AuthSysCred{Machine: "test", UID: uid, GID: gid}
}

// TestGatewaySpecialFiles: MKNOD makes device nodes (with their
// numbers), sockets and FIFOs, as the mount's mknod(2) does, and only
// root makes devices.
func TestGatewaySpecialFiles(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	for _, tc := range []struct {
		name         string
		typ          uint32
		major, minor uint32
	}{
		{"chr", 4, 1, 3},
		{"blk", 3, 8, 17},
		{"big", 4, 4095, 1<<20 - 1},
		{"sock", 6, 0, 0},
		{"fifo", 7, 0, 0},
	} {
		st, fh, a := e.mknod(t, root, tc.name, tc.typ, tc.major, tc.minor)
		if st != nfs3.OK {
			t.Fatalf("MKNOD %s: %d", tc.name, st)
		}
		if a.typ != tc.typ || a.mode != 0o640 || a.rdevMajor != tc.major || a.rdevMin != tc.minor || a.size != 0 {
			t.Errorf("MKNOD %s: %+v", tc.name, a)
		}
		if got := e.getattr(t, fh); got != a {
			t.Errorf("GETATTR %s: %+v, MKNOD said %+v", tc.name, got, a)
		}
	}
	if st, _, _ := e.mknod(t, root, "chr", 4, 1, 3); st != nfs3.ErrExist {
		t.Errorf("MKNOD over an existing name: %d", st)
	}
	if st, _, _ := e.mknod(t, root, "huge", 4, 4096, 0); st != nfs3.ErrInval {
		t.Errorf("MKNOD of major 4096: %d", st)
	}
	st, r := e.call(t, nfs3.ProcMkdir, func(w *xdr.Writer) {
		w.Opaque(root)
		w.String("pub")
		w.Bool(true)
		w.Uint32(0o777)
		for range 3 {
			w.Bool(false)
		}
		w.Uint32(0)
		w.Uint32(0)
	})
	if st != nfs3.OK || !r.Bool() {
		t.Fatalf("MKDIR: %d", st)
	}
	pub := append([]byte(nil), r.Opaque(64)...)
	e.as(1000, 1000)
	if st, _, _ := e.mknod(t, pub, "chr", 4, 1, 3); st != nfs3.ErrPerm {
		t.Errorf("MKNOD of a device as uid 1000: %d", st)
	}
	if st, _, a := e.mknod(t, pub, "sock", 6, 0, 0); st != nfs3.OK || a.uid != 1000 {
		t.Errorf("MKNOD of a socket as uid 1000: %d %+v", st, a)
	}
}

// TestGatewayOwnerWritesReadOnly: a file's owner writes it whatever its
// mode (a client writes a file it created read-only through the
// descriptor that created it), as knfsd lets it; others are held to the
// mode.
func TestGatewayOwnerWritesReadOnly(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	e.setattrMode(t, root, 0o777)

	e.as(1000, 1000)
	st, ro := e.create(t, root, "ro", 1)
	if st != nfs3.OK {
		t.Fatalf("CREATE: %d", st)
	}
	e.setattrMode(t, ro, 0o444)
	if st := e.write(t, ro, 0, []byte("mine")); st != nfs3.OK {
		t.Fatalf("owner's WRITE of its read-only file: %d", st)
	}
	if got, _ := e.readAt(t, ro, 0, 10); !bytes.Equal(got, []byte("mine")) {
		t.Fatalf("read back %q", got)
	}
	e.as(1001, 1001)
	if st := e.write(t, ro, 0, []byte("other")); st != nfs3.ErrAcces {
		t.Fatalf("another user's WRITE of a read-only file: %d", st)
	}
}

// TestGatewayWriteDropsSuidgid: a WRITE by anyone but root drops
// set-user-ID and group-executable set-group-ID bits, as write(2) does.
func TestGatewayWriteDropsSuidgid(t *testing.T) {
	e := newEnv(t)
	root := e.rootFH(t)
	for _, tc := range []struct {
		name       string
		uid        uint32
		mode, want uint32
	}{
		{"suid", 1000, 0o4777, 0o777},
		{"suid sgid", 1000, 0o6777, 0o777},
		{"sgid without group execute", 1000, 0o2767, 0o2767},
		{"root keeps them", 0, 0o6777, 0o6777},
	} {
		e.as(0, 0)
		st, fh := e.create(t, root, tc.name, 1)
		if st != nfs3.OK {
			t.Fatalf("CREATE: %d", st)
		}
		e.setattrMode(t, fh, tc.mode)
		e.as(tc.uid, tc.uid)
		if st := e.write(t, fh, 0, []byte("x")); st != nfs3.OK {
			t.Fatalf("%s: WRITE as uid %d: %d", tc.name, tc.uid, st)
		}
		if a := e.getattr(t, fh); a.mode != tc.want || a.size != 1 {
			t.Errorf("%s: after a WRITE as uid %d: mode %o size %d, want %o size 1", tc.name, tc.uid, a.mode, a.size, tc.want)
		}
	}
}
