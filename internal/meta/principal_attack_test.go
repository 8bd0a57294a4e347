package meta

// Attacker tests from the security review of principals (issue 16):
// each TestAttack* failed before its fix; TestSound* document what was
// checked and found sound.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// rawCall sends body to /v1/op with the credential through s.Handler(),
// without TLS (authenticateNode sees no certificate).
func rawCall(t *testing.T, s *Service, op, auth string, body io.Reader, resp any) (int, error) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/"+op, body)
	req.Header.Set("Authorization", auth)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		var me metaapi.Error
		json.Unmarshal(rec.Body.Bytes(), &me)
		return rec.Code, &me
	}
	if resp != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), resp); err != nil {
			t.Fatal(err)
		}
	}
	return rec.Code, nil
}

func jsonBody(v any) io.Reader {
	raw, _ := json.Marshal(v)
	return strings.NewReader(string(raw))
}

// hookReader runs hook before yielding its body: the request's headers
// (and credential) arrived first, the body later (a slow client).
type hookReader struct {
	hook func()
	r    io.Reader
	done bool
}

func (h *hookReader) Read(p []byte) (int, error) {
	if !h.done {
		h.done = true
		h.hook()
	}
	return h.r.Read(p)
}

func addP(t *testing.T, f *fixture, name string, r metaapi.Rights) (string, metaapi.AuthCredResp) {
	t.Helper()
	resp, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: name, Rights: r})
	if err != nil {
		t.Fatal(err)
	}
	return metaapi.ClientAuth(uint64(resp.Principal.ID), resp.Credential), resp
}

// Finding 1: a request is authenticated from its headers before its body
// is read, and the principal pointer is used afterwards. A client that
// sends its headers, then its body after `sluice auth rm` (meta's server
// allows a minute: ReadTimeout), is served as the removed principal: it
// changes the namespace and is minted capabilities issued after the
// revocation, which nodes accept for the capability lifetime (10 min).
func TestAttackRevokedPrincipalMidRequest(t *testing.T) {
	f := capKeysFixture(t)
	nodes := f.addNodes(3)
	f.tree("/f")
	auth, _ := addP(t, f, "mallory", metaapi.Rights{})
	f.clk.Advance(time.Second)

	// Layout: the body arrives after the principal is removed.
	var lay metaapi.LayoutResp
	body := &hookReader{r: jsonBody(metaapi.LayoutReq{Ino: f.ino("/f"), Len: 1, Write: true, Who: root}), hook: func() {
		if err := f.s.RemovePrincipal("mallory"); err != nil {
			t.Fatal(err)
		}
		f.clk.Advance(time.Second) // time passes while the body trickles in
	}}
	code, err := rawCall(t, f.s, metaapi.OpLayout, auth, body, &lay)
	// Another op after removal, same trick: a create.
	body2 := &hookReader{r: jsonBody(metaapi.CreateReq{Parent: ids.RootIno, Name: "after-rm", Type: metaapi.TypeFile, Mode: 0o644, Who: root}), hook: func() {}}
	// (the principal is already gone: a fresh request is refused, as it should be)
	if c, err := rawCall(t, f.s, metaapi.OpCreate, auth, body2, nil); err == nil {
		t.Fatalf("fresh request after rm served (%d)", c)
	}
	if err == nil {
		ring := f.nodeRing(f.heartbeat(nodes[0]))
		c, cerr := f.capOf(ring, lay)
		t.Errorf("removed principal was served Layout (HTTP %d); capability for client %v opens on a node after revocation: err=%v", code, c.Client, cerr)
	}
}

// Finding 2: Release is not a write op: a read-only principal frees
// (deletes the data of) an orphan another principal holds open.
func TestAttackReadOnlyReleaseFreesOrphan(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/proj/")
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/proj"), Mode: ptr[uint32](0o777), Who: root}); err != nil {
		t.Fatal(err)
	}
	f.mk("/proj", "open", metaapi.TypeFile, 0o644, bob)
	ino := f.ino("/proj/open")
	// bob's mount holds it open and unlinks it.
	if err := f.s.Remove(metaapi.RemoveReq{Parent: f.ino("/proj"), Name: "open", Keep: true, Who: bob}); err != nil {
		t.Fatal(err)
	}
	ro, _ := addP(t, f, "reader", metaapi.Rights{ReadOnly: true, Path: "/proj", UIDs: metaapi.IDRanges{{Lo: 1000, Hi: 1000}}})
	if _, err := rawCall(t, f.s, metaapi.OpRelease, ro, jsonBody(metaapi.ReleaseReq{Ino: ino, Who: alice}), nil); err == nil {
		if _, gerr := f.s.GetAttr(metaapi.GetAttrReq{Ino: ino}); gerr != nil {
			t.Errorf("read-only principal released bob's open orphan: it is gone (%v)", gerr)
		}
	}
	// Renew is also a write (it keeps the space allocated indefinitely).
}

// Finding 2b: other state-changing ops a read-only principal may call:
// Lock (a write lock blocking every writer), Reconcile (forces repair
// work, with Rebuild even whole-member rebuilds).
func TestAttackReadOnlyLockReconcile(t *testing.T) {
	f := newFixture(t)
	f.addNodes(3)
	f.tree("/f")
	if _, err := f.s.SetAttr(metaapi.SetAttrReq{Ino: f.ino("/f"), Mode: ptr[uint32](0o666), Who: root}); err != nil {
		t.Fatal(err)
	}
	ro, _ := addP(t, f, "reader", metaapi.Rights{ReadOnly: true})
	if _, err := rawCall(t, f.s, metaapi.OpLock, ro, jsonBody(metaapi.LockReq{Ino: f.ino("/f"), Session: 42, Owner: 1, Type: metaapi.LockWrite, End: ^uint64(0), Who: alice}), nil); err == nil {
		t.Errorf("read-only principal took a write lock on /f")
	}
	_, err := rawCall(t, f.s, metaapi.OpReconcile, ro, jsonBody(metaapi.ReconcileReq{Ino: f.ino("/f"), Who: alice}), nil)
	if !metaapi.IsCode(err, metaapi.EROFS) {
		t.Errorf("read-only Reconcile got past the guard: %v (want EROFS)", err)
	}
}

// Finding 4: past 256 distinct directories, a confined
// principal is locked out of its own file (another principal who can
// reach the file elsewhere makes 256 names in low-numbered directories).
func TestAttackScopeLinkLockout(t *testing.T) {
	f := newFixture(t)
	for i := range 256 {
		f.tree(fmt.Sprintf("/d%03d/", i))
	}
	f.tree("/proj/", "/proj/f")
	for i := range 256 {
		if _, err := f.s.Link(metaapi.LinkReq{Ino: f.ino("/proj/f"), NewParent: f.ino(fmt.Sprintf("/d%03d", i)), NewName: "x", Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := addP(t, f, "alice", metaapi.Rights{Path: "/proj"})
	if _, err := rawCall(t, f.s, metaapi.OpGetAttr, a, jsonBody(metaapi.GetAttrReq{Ino: f.ino("/proj/f")}), nil); err != nil {
		t.Errorf("alice cannot reach /proj/f, named in her own directory: %v", err)
	}
}

// Finding 6: renaming a file over another leaves a last-parent record
// ('q') for the freed target: free() deletes it, then setEntry's
// unindex writes it again. One leaked key per rename-over, never
// collected, not reported by check.
func TestAttackLastParentLeak(t *testing.T) {
	f := newFixture(t)
	f.tree("/d/")
	before := f.countKeys(pLastParent)
	for i := range 100 {
		f.tree(fmt.Sprintf("/d/a%d", i), fmt.Sprintf("/d/b%d", i))
		if err := f.s.Rename(metaapi.RenameReq{OldParent: f.ino("/d"), OldName: metaapi.ByteString(fmt.Sprintf("a%d", i)), NewParent: f.ino("/d"), NewName: metaapi.ByteString(fmt.Sprintf("b%d", i)), Who: root}); err != nil {
			t.Fatal(err)
		}
	}
	leaked := 0
	f.s.read(func(v view) error {
		return scan(v.r, []byte{pLastParent}, []byte{pLastParent + 1}, func(k, _ []byte) (bool, error) {
			if _, err := v.inode(ids.Ino(beUint64(k[1:]))); err != nil {
				leaked++
			}
			return true, nil
		})
	})
	if leaked > 0 {
		t.Errorf("%d last-parent records of freed inodes after 100 renames over a file (%d before)", leaked, before)
	}
	if err := f.s.Check(); err != nil {
		t.Logf("check: %v", err)
	}
}

// Sound: JSON cannot set the server-only Root (tag "-" is never matched,
// case-insensitively or otherwise), and a duplicate "who" is mapped (the
// last one wins, then the guard maps it).
func TestSoundJSON(t *testing.T) {
	f := newFixture(t)
	f.tree("/proj/", "/other/", "/other/secret")
	a, _ := addP(t, f, "alice", metaapi.Rights{Path: "/proj", UIDs: metaapi.IDRanges{{Lo: 1000, Hi: 1000}}})
	for _, body := range []string{
		`{"path":"/","Root":1,"root":1,"ROOT":1,"-":1}`,
		`{"path":"/other/secret","Root":1}`,
	} {
		var r metaapi.AttrResp
		_, err := rawCall(t, f.s, metaapi.OpResolve, a, strings.NewReader(body), &r)
		if err == nil && r.Attr.Ino != f.ino("/proj") {
			t.Errorf("%s: resolved to %d", body, r.Attr.Ino)
		}
	}
	_, err := rawCall(t, f.s, metaapi.OpCreate, a, strings.NewReader(fmt.Sprintf(`{"parent":%d,"name":"x","type":"file","mode":420,"who":{"uid":1000,"gid":1000},"WHO":{"uid":0,"gid":0}}`, f.ino("/proj"))), nil)
	wantCode(t, err, metaapi.EPERM)
	// Lookup ".." of alice's root and of a child stays inside.
	var r metaapi.AttrResp
	_, err = rawCall(t, f.s, metaapi.OpLookup, a, jsonBody(metaapi.LookupReq{Parent: f.ino("/proj"), Name: "..", Who: metaapi.Who{UID: 1000, GID: 1000}}), &r)
	if err != nil || r.Attr.Ino != f.ino("/proj") {
		t.Errorf("lookup .. of root: %d %v", r.Attr.Ino, err)
	}
	// Symlink with ../.. and absolute targets resolve inside.
	f.mk("/proj", "up->../../other/secret", metaapi.TypeSymlink, 0o777, root)
	f.mk("/proj", "abs->/other/secret", metaapi.TypeSymlink, 0o777, root)
	for _, p := range []string{"/up", "/abs", "/up/", "/../other"} {
		_, err = rawCall(t, f.s, metaapi.OpResolve, a, jsonBody(metaapi.ResolveReq{Path: metaapi.ByteString(p), Follow: true}), &r)
		if err == nil {
			t.Errorf("resolve %s: %d", p, r.Attr.Ino)
		}
	}
}

// GetPolicy's From named a directory outside the principal's path: it
// names the principal's root instead.
func TestAttackGetPolicyFrom(t *testing.T) {
	f := newFixture(t)
	f.tree("/proj/")
	a, _ := addP(t, f, "alice", metaapi.Rights{Path: "/proj"})
	var r metaapi.PolicyResp
	if _, err := rawCall(t, f.s, metaapi.OpGetPolicy, a, jsonBody(metaapi.GetPolicyReq{Ino: f.ino("/proj")}), &r); err != nil {
		t.Fatal(err)
	}
	if r.From != f.ino("/proj") {
		t.Errorf("GetPolicy From = %d (outside alice's path; her root is %d)", r.From, f.ino("/proj"))
	}
}

// Finding 7: AddPrincipal resolves --path following symbolic links (and
// ".."), and records the inode it lands on while listing the path as
// given. Whoever controls a component of the path (a user inside
// /home/alice) decides the new principal's root: a symlink to "/" makes
// it unconfined, though `auth ls` shows path /home/alice/share.
func TestAttackAddPrincipalFollowsSymlink(t *testing.T) {
	f := newFixture(t)
	f.tree("/home/", "/home/alice/")
	f.mk("/home/alice", "share->/", metaapi.TypeSymlink, 0o777, root) // made by alice in her own directory
	resp, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "guest", Rights: metaapi.Rights{Path: "/home/alice/share"}})
	if err == nil {
		t.Errorf("principal for path %q made with root inode %d: a path through a symlink must be refused", resp.Principal.Rights.Path, resp.Principal.Root)
	}
	wantCode(t, err, metaapi.EINVAL)
	_, err = f.s.AddPrincipal(metaapi.AuthAddReq{Name: "guest", Rights: metaapi.Rights{Path: "/home/alice/../alice"}})
	wantCode(t, err, metaapi.EINVAL)
}

// Finding 8: an admin confined to a path can add an unconfined principal
// (or rotate the operator's): --admin and --path together confine nothing.
func TestAttackConfinedAdminEscapes(t *testing.T) {
	f := newFixture(t)
	f.tree("/proj/", "/secret")
	_, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "projadmin", Rights: metaapi.Rights{Path: "/proj", Admin: true}})
	wantCode(t, err, metaapi.EINVAL)
	// Were one made anyway (an older database), it could not widen itself.
	rec := principalRec{Principal: metaapi.Principal{ID: 99, Name: "projadmin", Rights: metaapi.Rights{Path: "/proj", Admin: true}, Root: f.ino("/proj")}, Hash: hashCredential("c")}
	p, err := newPrincipal(rec)
	if err != nil {
		t.Fatal(err)
	}
	f.s.publishPrincipal(99, p)
	a := metaapi.ClientAuth(99, "c")
	var out metaapi.AuthCredResp
	if _, err := rawCall(t, f.s, metaapi.OpAuthAdd, a, jsonBody(metaapi.AuthAddReq{Name: "escape", Rights: metaapi.Rights{Path: "/"}}), &out); err == nil {
		esc := metaapi.ClientAuth(uint64(out.Principal.ID), out.Credential)
		if _, err := rawCall(t, f.s, metaapi.OpGetAttr, esc, jsonBody(metaapi.GetAttrReq{Ino: f.ino("/secret")}), nil); err == nil {
			t.Errorf("admin confined to /proj made principal %q and reached /secret through it", out.Principal.Name)
		}
	}
}

// Finding 1b: the same, for a compromised admin credential being rotated:
// a request whose headers were sent before the rotation adds a new admin
// principal after it. Keeping one such request pending at all times (a
// new one every ReadTimeout) defeats `sluice auth rotate/rm` for good.
func TestAttackRotatedAdminPersists(t *testing.T) {
	f := newFixture(t)
	auth, _ := addP(t, f, "ops", metaapi.Rights{Admin: true})
	var out metaapi.AuthCredResp
	body := &hookReader{r: jsonBody(metaapi.AuthAddReq{Name: "backdoor", Rights: metaapi.Rights{Admin: true}}), hook: func() {
		if _, err := f.s.RotatePrincipal("ops"); err != nil {
			t.Fatal(err)
		}
	}}
	if _, err := rawCall(t, f.s, metaapi.OpAuthAdd, auth, body, &out); err == nil {
		t.Errorf("old admin credential, rotated mid-request, added admin principal %q", out.Principal.Name)
	}
}

// Finding 1c: the same over meta's real server (s.Serve: TLS 1.3,
// ReadTimeout one minute): headers sent, principal rotated, body sent 3 s
// later.
func TestAttackRevokedOverWire(t *testing.T) {
	f := newFixture(t)
	auth, _ := addP(t, f, "ops", metaapi.Rights{Admin: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go f.s.Serve(ln)
	t.Cleanup(func() { f.s.Shutdown(context.Background()) })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(f.s.ClientConf(ln.Addr().String()).CA))
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body, _ := json.Marshal(metaapi.AuthAddReq{Name: "backdoor", Rights: metaapi.Rights{Admin: true}})
	fmt.Fprintf(conn, "POST /v1/AuthAdd HTTP/1.1\r\nHost: meta\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n", auth, len(body))
	time.Sleep(200 * time.Millisecond)
	if _, err := f.s.RotatePrincipal("ops"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	conn.Write(body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		t.Errorf("3 s after rotation, the old credential added an admin: %s", raw)
	}
}
