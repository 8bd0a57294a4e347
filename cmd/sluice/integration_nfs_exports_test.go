package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sluicefs/sluice/internal/fabricrpc"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/nfsclient"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// NFS export options as an attacker meets them: a real `sluice nfs`
// process over a real cluster, called from chosen source addresses and
// ports with whatever AUTH_SYS credential the caller likes.

// rawNFS makes raw NFS and MOUNT calls over one connection.
type rawNFS struct {
	t    *testing.T
	rpc  nfsclient.Caller
	cred *oncrpc.AuthSysCred
}

// soReuse lets a test bind a port whose last connection is in TIME_WAIT.
func soReuse(_, _ string, c syscall.RawConn) error {
	var serr error
	c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1) })
	return serr
}

// dialFrom connects to addr from ip:port; port 0 is a reserved port (512
// to 1023), as a root client binds. An unprivileged port in use (by some
// other connection on this machine) gives way to the next one up.
func dialFrom(ctx context.Context, network, addr, ip string, port int) (net.Conn, error) {
	low, high := 512, 1023
	if port != 0 {
		low, high = port, port+200
	}
	var err error
	for i := range high - low + 1 {
		p := high - i // reserved: from the top, as clients do
		if port != 0 {
			p = low + i
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip), Port: p}, Control: soReuse}
		var nc net.Conn
		if nc, err = d.DialContext(ctx, network, addr); err == nil {
			return nc, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) {
			break
		}
	}
	return nil, err
}

// rawFrom connects to the gateway's TCP port from ip:port as uid/gid.
func rawFrom(t *testing.T, addr, ip string, port int, uid, gid uint32) *rawNFS {
	t.Helper()
	if port == 0 && os.Geteuid() != 0 {
		t.Skip("binding a reserved port needs root")
	}
	nc, err := dialFrom(context.Background(), "tcp", addr, ip, port)
	if err != nil {
		t.Fatalf("dialing the gateway from %s:%d: %v", ip, port, err)
	}
	rc := oncrpc.NewClient(nc)
	t.Cleanup(func() { rc.Close() })
	return &rawNFS{t: t, rpc: nfsclient.TCP(rc), cred: &oncrpc.AuthSysCred{Machine: "attacker", UID: uid, GID: gid, GIDs: []uint32{gid}}}
}

// fabricFrom connects to the gateway's fabric transport from ip:port.
func fabricFrom(t *testing.T, addr, ip string, port int, uid, gid uint32) *rawNFS {
	t.Helper()
	dial := func(ctx context.Context, network, a string) (net.Conn, error) {
		return dialFrom(ctx, network, a, ip, port)
	}
	fc, err := fabricrpc.Dial(context.Background(), addr, fabricrpc.ClientOptions{Dial: dial})
	if err != nil {
		t.Fatalf("dialing the gateway's fabric transport from %s:%d: %v", ip, port, err)
	}
	t.Cleanup(func() { fc.Close() })
	return &rawNFS{t: t, rpc: fc, cred: &oncrpc.AuthSysCred{Machine: "attacker", UID: uid, GID: gid, GIDs: []uint32{gid}}}
}

func (n *rawNFS) callProg(prog, proc uint32, args func(w *xdr.Writer)) (uint32, *xdr.Reader) {
	n.t.Helper()
	var w xdr.Writer
	args(&w)
	r, err := n.rpc.Call(context.Background(), prog, nfs3.Version, proc, n.cred, &w, nil)
	if err != nil {
		n.t.Fatalf("prog %d proc %d: %v", prog, proc, err)
	}
	return r.Uint32(), r
}

// mnt returns MNT's status and, on success, the handle.
func (n *rawNFS) mnt(path string) (uint32, []byte) {
	n.t.Helper()
	st, r := n.callProg(nfs3.ProgMount, nfs3.MountMnt, func(w *xdr.Writer) { w.String(path) })
	if st != 0 {
		return st, nil
	}
	return st, append([]byte(nil), r.Opaque(64)...)
}

func (n *rawNFS) lookup(dir []byte, name string) (uint32, []byte) {
	n.t.Helper()
	st, r := n.callProg(nfs3.ProgNFS, nfs3.ProcLookup, func(w *xdr.Writer) { w.Opaque(dir); w.String(name) })
	if st != 0 {
		return st, nil
	}
	return st, append([]byte(nil), r.Opaque(64)...)
}

// read READs up to 64 KiB: status and data.
func (n *rawNFS) read(fh []byte) (uint32, []byte) {
	n.t.Helper()
	st, r := n.callProg(nfs3.ProgNFS, nfs3.ProcRead, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(0); w.Uint32(64 << 10) })
	if st != 0 {
		return st, nil
	}
	nfs3.SkipPostOp(r)
	r.Uint32()
	r.Bool()
	return st, append([]byte(nil), r.Opaque(64<<10)...)
}

// NFS3 and MOUNT statuses these tests expect.
const (
	nfsPerm  = 1
	nfsAcces = 13
	nfsRofs  = 30
	mntAcces = 13
)

// putSecret stores data at path as root's 0600 file.
func putSecret(t *testing.T, conf, path string, data []byte) {
	t.Helper()
	mustRun(t, conf, bytes.NewReader(data), "put", "-", path)
	chmodPath(t, conf, path, 0o600)
	var r metaapi.AttrResp
	if err := metaClient(t, conf).Call(context.Background(), metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(path)}, &r); err != nil || r.Attr.UID != 0 || r.Attr.Mode != 0o600 {
		t.Fatalf("%s: %+v %v, want root's 0600 file", path, r.Attr, err)
	}
}

// TestNFSRootFromUnprivilegedPort is the issue's check: against `sluice
// nfs` with its default export, an NFS READ of root's 0600 file as
// AUTH_SYS uid 0 from source port 40000 does not get its data, even with
// the file's handle in hand (taken from a legitimate client); root's own
// client (a reserved port) is squashed to nobody and does not get it
// either.
func TestNFSRootFromUnprivilegedPort(t *testing.T) {
	c := startUp(t, filepath.Join(baseDir(t), "data"), 1)
	secret := []byte("root's secret")
	putSecret(t, c.conf, "/secret", secret)
	addr, _ := nfsGateway(t, c.conf)

	root := rawFrom(t, addr, "127.0.0.1", 0, 0, 0)
	st, fh := root.mnt("/")
	if st != 0 {
		t.Fatalf("MNT / from a reserved port: %d", st)
	}
	st, sfh := root.lookup(fh, "secret")
	if st != 0 {
		t.Fatalf("LOOKUP secret: %d", st)
	}
	evil := rawFrom(t, addr, "127.0.0.1", 40000, 0, 0)
	if st, data := evil.read(sfh); st == 0 || bytes.Contains(data, secret) {
		t.Fatalf("READ of root's 0600 file as uid 0 from port 40000: status %d, %q", st, data)
	} else if st != nfsPerm {
		t.Fatalf("READ from port 40000: status %d, want NFS3ERR_PERM", st)
	}
	if st, _ := evil.mnt("/"); st != mntAcces {
		t.Fatalf("MNT / from port 40000: %d, want MNT3ERR_ACCES", st)
	}
	if st, data := root.read(sfh); st != nfsAcces {
		t.Fatalf("READ of root's 0600 file as squashed root: status %d, %q; want NFS3ERR_ACCES", st, data)
	}
}

// TestNFSExportOptions: one gateway, an exports file, each export's
// options as an attacker meets them, over TCP and over the fabric.
func TestNFSExportOptions(t *testing.T) {
	c := startUp(t, filepath.Join(baseDir(t), "data"), 1)
	secret := []byte("root's secret")
	for _, d := range []string{"/sq", "/insec", "/nrs", "/all", "/ro"} {
		mustRun(t, c.conf, nil, "mkdir", d)
		putSecret(t, c.conf, d+"/secret", secret)
	}
	chmodPath(t, c.conf, "/all", 0o777)
	mustRun(t, c.conf, bytes.NewReader([]byte("public")), "put", "-", "/insec/pub")
	mustRun(t, c.conf, bytes.NewReader([]byte("public")), "put", "-", "/ro/pub")
	exports := filepath.Join(baseDir(t), "exports")
	if err := os.WriteFile(exports, []byte(`# the test's exports
/sq     127.0.0.1(rw)                     # the defaults: root_squash, secure
/insec  127.0.0.1(rw,insecure)
/nrs    127.0.0.1(rw,no_root_squash)
/all    127.0.0.1(rw,all_squash,anonuid=1234,anongid=1234)
/ro     127.0.0.1(ro,no_root_squash)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	addr, faddr := nfsGateway(t, c.conf, "--exports", exports)
	// handle returns the handle of dir/name as a legitimate root client
	// gets it (MNT dir, LOOKUP name).
	legit := rawFrom(t, addr, "127.0.0.1", 0, 0, 0)
	handle := func(dir, name string) []byte {
		t.Helper()
		st, fh := legit.mnt(dir)
		if st != 0 {
			t.Fatalf("MNT %s from a reserved port: %d", dir, st)
		}
		if name == "" {
			return fh
		}
		st, h := legit.lookup(fh, name)
		if st != 0 {
			t.Fatalf("LOOKUP %s/%s: %d", dir, name, st)
		}
		return h
	}

	t.Run("not exported", func(t *testing.T) {
		for _, p := range []string{"/", "/other", "/sqx"} {
			if st, _ := legit.mnt(p); st != mntAcces {
				t.Errorf("MNT %s: %d, want MNT3ERR_ACCES", p, st)
			}
		}
	})
	t.Run("secure", func(t *testing.T) {
		h := handle("/nrs", "secret")
		for name, evil := range map[string]*rawNFS{
			"tcp":    rawFrom(t, addr, "127.0.0.1", 40000, 0, 0),
			"fabric": fabricFrom(t, faddr, "127.0.0.1", 40001, 0, 0),
		} {
			if st, _ := evil.mnt("/nrs"); st != mntAcces {
				t.Errorf("%s: MNT from an unprivileged port: %d", name, st)
			}
			if st, data := evil.read(h); st != nfsPerm {
				t.Errorf("%s: READ of root's file as root from an unprivileged port: %d %q", name, st, data)
			}
		}
		// Sluice's own client binds a reserved port as root, over both
		// transports, and root is root on this export.
		for _, tr := range [][]string{{"--server", addr}, {"--transport", "fabric", "--server", faddr}} {
			if got := mustRun(t, c.conf, nil, append(append([]string{"nfs-get"}, tr...), "--mount", "/nrs", "/secret", "-")...).stdout; !bytes.Equal(got, secret) {
				t.Fatalf("nfs-get %v of /nrs/secret as root: %q", tr, got)
			}
			mustFail(t, c.conf, []string{"mount status 13"}, append(append([]string{"nfs-get", "--resvport", "no"}, tr...), "--mount", "/nrs", "/secret", "-")...)
		}
	})
	t.Run("insecure", func(t *testing.T) {
		evil := rawFrom(t, addr, "127.0.0.1", 40000, 0, 0)
		st, fh := evil.mnt("/insec")
		if st != 0 {
			t.Fatalf("MNT of an insecure export from port 40000: %d", st)
		}
		_, h := evil.lookup(fh, "secret")
		if st, data := evil.read(h); st != nfsAcces {
			t.Fatalf("READ of root's 0600 file as uid 0, squashed: %d %q, want NFS3ERR_ACCES", st, data)
		}
	})
	t.Run("root_squash", func(t *testing.T) {
		if st, data := legit.read(handle("/sq", "secret")); st != nfsAcces {
			t.Fatalf("READ of root's 0600 file by root from a reserved port: %d %q, want NFS3ERR_ACCES", st, data)
		}
		mustFail(t, c.conf, []string{"status 13"}, "nfs-get", "--server", addr, "--mount", "/sq", "/secret", "-")
	})
	t.Run("all_squash", func(t *testing.T) {
		local := filepath.Join(baseDir(t), "new")
		if err := os.WriteFile(local, []byte("made by nobody in particular"), 0o644); err != nil {
			t.Fatal(err)
		}
		mustRun(t, c.conf, nil, "nfs-put", "--server", addr, "--mount", "/all", local, "/new")
		var r metaapi.AttrResp
		if err := metaClient(t, c.conf).Call(context.Background(), metaapi.OpResolve, metaapi.ResolveReq{Path: "/all/new"}, &r); err != nil || r.Attr.UID != 1234 || r.Attr.GID != 1234 {
			t.Fatalf("a file root made on an all_squash export: %+v %v, want owner 1234:1234", r.Attr, err)
		}
		if st, _ := legit.read(handle("/all", "secret")); st != nfsAcces {
			t.Fatalf("READ of root's file on an all_squash export: %d", st)
		}
	})
	t.Run("networks", func(t *testing.T) {
		h := handle("/insec", "")
		for name, other := range map[string]*rawNFS{
			"tcp":    rawFrom(t, addr, "127.0.0.2", 40002, 0, 0),
			"fabric": fabricFrom(t, faddr, "127.0.0.2", 40003, 0, 0),
		} {
			if st, _ := other.mnt("/insec"); st != mntAcces {
				t.Errorf("%s: MNT from 127.0.0.2: %d, want MNT3ERR_ACCES", name, st)
			}
			if st, _ := other.lookup(h, "secret"); st != nfsAcces {
				t.Errorf("%s: LOOKUP from 127.0.0.2 with a valid handle: %d, want NFS3ERR_ACCES", name, st)
			}
		}
	})
	// libnfs, run as root, binds a reserved port (it tries 512-1023 on
	// every connect whenever it may); run as nobody it cannot, and only
	// an insecure export takes its calls.
	t.Run("libnfs", func(t *testing.T) {
		requireLibnfs(t)
		if _, err := exec.LookPath("setpriv"); err != nil || os.Geteuid() != 0 {
			t.Skip("needs root and setpriv")
		}
		if got := libnfs(t, "nfs-cat", nfsURL(addr, "/nrs/secret")); !bytes.Equal(got, secret) {
			t.Fatalf("nfs-cat of /nrs/secret as root: %q", got)
		}
		nobody := func(path string) ([]byte, error) {
			cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "nfs-cat", nfsURL(addr, path))
			return cmd.Output()
		}
		if out, err := nobody("/nrs/secret"); err == nil || bytes.Contains(out, secret) {
			t.Fatalf("nfs-cat as nobody (an unprivileged port) of a secure export: %q, %v", out, err)
		}
		if out, err := nobody("/insec/pub"); err != nil || string(out) != "public" {
			t.Fatalf("nfs-cat as nobody of an insecure export: %q, %v", out, err)
		}
	})
	t.Run("ro", func(t *testing.T) {
		dir, pub := handle("/ro", ""), handle("/ro", "pub")
		if st, data := legit.read(pub); st != 0 || string(data) != "public" {
			t.Fatalf("READ on a ro export: %d %q", st, data)
		}
		sattr := func(w *xdr.Writer) {
			for range 6 {
				w.Bool(false)
			}
		}
		for name, call := range map[string]struct {
			proc uint32
			args func(w *xdr.Writer)
		}{
			"SETATTR": {nfs3.ProcSetattr, func(w *xdr.Writer) { w.Opaque(pub); sattr(w); w.Bool(false) }},
			"WRITE":   {nfs3.ProcWrite, func(w *xdr.Writer) { w.Opaque(pub); w.Uint64(0); w.Uint32(1); w.Uint32(2); w.Opaque([]byte("x")) }},
			"CREATE":  {nfs3.ProcCreate, func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); w.Uint32(0); sattr(w) }},
			"MKDIR":   {nfs3.ProcMkdir, func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); sattr(w) }},
			"SYMLINK": {nfs3.ProcSymlink, func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); sattr(w); w.String("pub") }},
			"MKNOD":   {nfs3.ProcMknod, func(w *xdr.Writer) { w.Opaque(dir); w.String("n"); w.Uint32(7); sattr(w) }},
			"REMOVE":  {nfs3.ProcRemove, func(w *xdr.Writer) { w.Opaque(dir); w.String("pub") }},
			"RMDIR":   {nfs3.ProcRmdir, func(w *xdr.Writer) { w.Opaque(dir); w.String("pub") }},
			"RENAME":  {nfs3.ProcRename, func(w *xdr.Writer) { w.Opaque(dir); w.String("pub"); w.Opaque(dir); w.String("moved") }},
			"LINK":    {nfs3.ProcLink, func(w *xdr.Writer) { w.Opaque(pub); w.Opaque(dir); w.String("l") }},
		} {
			if st, _ := legit.callProg(nfs3.ProgNFS, call.proc, call.args); st != nfsRofs {
				t.Errorf("%s on a ro export: %d, want NFS3ERR_ROFS", name, st)
			}
		}
		local := filepath.Join(baseDir(t), "x")
		if err := os.WriteFile(local, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		mustFail(t, c.conf, []string{"status 30"}, "nfs-put", "--server", addr, "--mount", "/ro", local, "/x")
		if got := mustRun(t, c.conf, nil, "ls", "/ro").stdout; strings.TrimSpace(string(got)) != "pub\nsecret" {
			t.Fatalf("/ro after the refused calls: %q", got)
		}
	})
}

// TestNFSExportErrors: a bad export stops `sluice nfs` at once with a
// line naming the bad token.
func TestNFSExportErrors(t *testing.T) {
	c := startUp(t, filepath.Join(baseDir(t), "data"), 1)
	mustFail(t, c.conf, []string{`--export "/ host.example\(rw\)": "host.example\(rw\)": not an IP address.*host names`},
		"nfs", "--listen", "127.0.0.1:0", "--export", "/ host.example(rw)")
	mustFail(t, c.conf, []string{`"127.0.0.1\(rw,root_sqash\)": unknown option "root_sqash"`},
		"nfs", "--listen", "127.0.0.1:0", "--export", "/ 127.0.0.1(rw,root_sqash)")
	bad := filepath.Join(baseDir(t), "exports")
	if err := os.WriteFile(bad, []byte("/ 127.0.0.1(rw)\n\n/x 10.0.0.1/8\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustFail(t, c.conf, []string{`exports:3: "10.0.0.1/8": address bits set past the prefix length: did you mean 10.0.0.0/8\?`},
		"nfs", "--listen", "127.0.0.1:0", "--exports", bad)
}
