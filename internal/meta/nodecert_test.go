package meta

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/jointoken"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// nodeClientOf is a meta client presenting the certificate a join gave.
func nodeClientOf(t *testing.T, srv *httptest.Server, resp metaapi.JoinResp, keyPEM []byte) *metaapi.Client {
	t.Helper()
	tc, err := pki.NodeConfig([]byte(resp.CA), []byte(resp.Cert), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c := metaapi.NewClient(addrOf(srv), "", tc)
	c.RetryFor = 0
	t.Cleanup(c.Close)
	return c
}

// rejoinAs joins node id again with a token made for it.
func rejoinAs(t *testing.T, f *fixture, srv *httptest.Server, id ids.NodeID) *metaapi.Client {
	t.Helper()
	tok, err := f.s.NewJoinToken(time.Hour, id)
	if err != nil {
		t.Fatal(err)
	}
	resp, keyPEM, err := joinOverAs(t, addrOf(srv), tok.Token, id)
	if err != nil {
		t.Fatal(err)
	}
	return nodeClientOf(t, srv, resp, keyPEM)
}

func nodeAddr(t *testing.T, f *fixture, id ids.NodeID) string {
	t.Helper()
	st, err := f.s.Status()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range st.Nodes {
		if n.ID == id {
			return n.Addr
		}
	}
	t.Fatalf("no node %v", id)
	return ""
}

// TestRejoinRevokesOldCert: once node 1 joined again, the certificate
// it had no longer registers or heartbeats as node 1 (it cannot move
// its address), while the new one does.
func TestRejoinRevokesOldCert(t *testing.T) {
	f, srv := newTLSFixture(t)
	ctx := context.Background()
	old, id := joinedClient(t, f, srv)
	if err := old.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id, Addr: "127.0.0.1:1"}, nil); err != nil {
		t.Fatal(err)
	}
	cur := rejoinAs(t, f, srv, id)
	for _, tc := range []struct {
		op  string
		req any
	}{
		{metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id, Addr: "10.9.9.9:1"}},
		{metaapi.OpRegister, metaapi.RegisterReq{ID: id, Addr: "10.9.9.9:1"}},
		{metaapi.OpInventory, metaapi.InventoryReq{Node: id, Done: true}},
	} {
		err := old.Call(ctx, tc.op, tc.req, nil)
		wantCode(t, err, metaapi.EAUTH)
		if !strings.Contains(err.Error(), "certificate for node n1 was replaced at") || !strings.Contains(err.Error(), "this one is revoked") {
			t.Errorf("%s with the replaced certificate: %v", tc.op, err)
		}
	}
	if a := nodeAddr(t, f, id); a != "127.0.0.1:1" {
		t.Fatalf("the replaced certificate moved node 1 to %s", a)
	}
	if err := cur.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id, Addr: "127.0.0.1:2"}, nil); err != nil {
		t.Fatalf("heartbeat with the new certificate: %v", err)
	}
	// Durable: a meta reopened on the same database refuses it too.
	f.s.Close()
	s2, err := Open(f.opt)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if len(s2.nodeCerts) != 1 || s2.nodeCerts[id].Fingerprint != f.s.nodeCerts[id].Fingerprint {
		t.Fatalf("after reopening: %+v, want %+v", s2.nodeCerts, f.s.nodeCerts)
	}
}

// TestRevokeNode: an admin retires node 1's identity; its certificate
// is refused from then on and it is down at once; a non-admin or a node
// may not; joining again with a token for node 1 brings it back.
func TestRevokeNode(t *testing.T) {
	f, srv := newTLSFixture(t)
	ctx := context.Background()
	n1, id := joinedClient(t, f, srv)
	n2, id2 := joinedClient(t, f, srv)
	for i, c := range []*metaapi.Client{n1, n2} {
		if err := c.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: ids.NodeID(i + 1), Addr: "127.0.0.1:" + string(rune('1'+i))}, nil); err != nil {
			t.Fatal(err)
		}
	}
	bob, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	req := metaapi.RevokeNodeReq{Node: id}
	wantCode(t, client(t, srv, metaapi.ClientAuth(uint64(bob.Principal.ID), bob.Credential)).Call(ctx, metaapi.OpRevokeNode, req, nil), metaapi.EPERM)
	wantCode(t, n2.Call(ctx, metaapi.OpRevokeNode, req, nil), metaapi.EAUTH)
	if err := n1.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id}, nil); err != nil {
		t.Fatalf("refused revocations revoked: %v", err)
	}
	before, _ := f.s.Status()
	admin := client(t, srv, metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)))
	if err := admin.Call(ctx, metaapi.OpRevokeNode, req, nil); err != nil {
		t.Fatal(err)
	}
	wantCode(t, admin.Call(ctx, metaapi.OpRevokeNode, metaapi.RevokeNodeReq{Node: 9}, nil), metaapi.ENOENT)
	err = n1.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id}, nil)
	wantCode(t, err, metaapi.EAUTH)
	if !strings.Contains(err.Error(), "identity was revoked") {
		t.Errorf("heartbeat of a revoked node: %v", err)
	}
	after, _ := f.s.Status()
	if after.Nodes[0].State != metaapi.NodeDown || after.Epoch <= before.Epoch {
		t.Errorf("revoked node: %s at epoch %d (was %d)", after.Nodes[0].State, after.Epoch, before.Epoch)
	}
	if err := n2.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id2}, nil); err != nil {
		t.Fatalf("node 2 after node 1's revocation: %v", err)
	}
	back := rejoinAs(t, f, srv, id)
	if err := back.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id}, nil); err != nil {
		t.Fatalf("node 1 joined again: %v", err)
	}
	wantCode(t, n1.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id}, nil), metaapi.EAUTH)
}

// TestNodeCertFirstSeen: a node id meta holds no certificate record for
// (joined before records were kept) has the first certificate it
// presents recorded, and another one refused.
func TestNodeCertFirstSeen(t *testing.T) {
	f, srv := newTLSFixture(t)
	ctx := context.Background()
	_, id := joinedClient(t, f, srv)
	second := rejoinAs(t, f, srv, id)
	first := rejoinAs(t, f, srv, id)
	if err := f.s.update(func(tx *txn) error { // as a database from before
		tx.after = append(tx.after, func() { delete(f.s.nodeCerts, id) })
		return tx.b.Delete(nodeCertKey(id), nil)
	}); err != nil {
		t.Fatal(err)
	}
	if err := second.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id, Addr: "127.0.0.1:1"}, nil); err != nil {
		t.Fatalf("first certificate seen: %v", err)
	}
	wantCode(t, first.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id}, nil), metaapi.EAUTH)
	if err := second.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestAddrInUse: a node may not take the address of another node that
// is up; it may take a down one's, and keep its own.
func TestAddrInUse(t *testing.T) {
	up := func(m *member) bool { return m.state == metaapi.NodeUp }
	nodes := map[ids.NodeID]*member{
		1: {rec: nodeRec{ID: 1, Addr: "10.0.0.1:7701"}, state: metaapi.NodeUp},
		2: {rec: nodeRec{ID: 2, Addr: "10.0.0.2:7701"}, state: metaapi.NodeDown},
	}
	err := addrInUse(nodes, 3, "10.0.0.1:7701", up)
	wantCode(t, err, metaapi.EEXIST)
	if !strings.Contains(err.Error(), "node n1's") {
		t.Errorf("error does not name the holder: %v", err)
	}
	for _, c := range []struct {
		id   ids.NodeID
		addr string
	}{{1, "10.0.0.1:7701"}, {3, "10.0.0.2:7701"}, {3, "10.0.0.3:7701"}, {2, "10.0.0.2:7701"}} {
		if err := addrInUse(nodes, c.id, c.addr, up); err != nil {
			t.Errorf("node %v at %s: %v", c.id, c.addr, err)
		}
	}
	if err := addrInUse(nodes, 3, "10.0.0.1:7701", func(*member) bool { return false }); err != nil {
		t.Errorf("node 1 not up: %v", err)
	}
}

// TestRegisterTakenAddr: node 2 cannot register or heartbeat its way to
// the address node 1 holds while node 1 is up; once node 1 is down, it
// may.
func TestRegisterTakenAddr(t *testing.T) {
	f := newFixture(t)
	if _, err := f.s.Register(metaapi.RegisterReq{ID: 1, Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Register(metaapi.RegisterReq{ID: 2, Addr: "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.s.Register(metaapi.RegisterReq{ID: 2, Addr: "127.0.0.1:1"})
	wantCode(t, err, metaapi.EEXIST)
	_, err = f.s.Heartbeat(metaapi.HeartbeatReq{ID: 2, Addr: "127.0.0.1:1"})
	wantCode(t, err, metaapi.EEXIST)
	if a := nodeAddr(t, f, 2); a != "127.0.0.1:2" {
		t.Fatalf("node 2 moved to %s", a)
	}
	f.clk.Advance(f.s.opts.NodeTimeout + time.Second)
	if _, err := f.s.Heartbeat(metaapi.HeartbeatReq{ID: 2, Addr: "127.0.0.1:1"}); err != nil {
		t.Fatalf("taking a silent node's address: %v", err)
	}
}

// lineCounter counts the lines written through it.
type lineCounter struct {
	mu sync.Mutex
	n  int
	b  bytes.Buffer
}

func (c *lineCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += bytes.Count(p, []byte("\n"))
	c.b.Write(p)
	return len(p), nil
}

// TestRefusalsLogBounded: thousands of unauthenticated refusals (bad
// credentials, failed joins) log at most about one line a second.
func TestRefusalsLogBounded(t *testing.T) {
	var lines lineCounter
	f := newFixture(t, func(o *Options) {
		o.Logger = slog.New(slog.NewTextHandler(&lines, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	h := f.s.Handler()
	tok, _ := jointoken.New(pki.Fingerprint(f.s.CA().Cert)) // never issued
	_, csr, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	join, _ := json.Marshal(metaapi.JoinReq{Token: tok.String(), CSR: csr})
	lines.mu.Lock()
	lines.n = 0
	lines.mu.Unlock()
	start := time.Now()
	for i := range 4000 {
		var r *http.Request
		if i%2 == 0 {
			r = httptest.NewRequest("POST", "/v1/Status", strings.NewReader("{}"))
			r.Header.Set("Authorization", "Bearer 1:wrong")
		} else {
			r = httptest.NewRequest("POST", "/v1/Join", bytes.NewReader(join))
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusUnauthorized {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
	}
	secs := int(time.Since(start) / time.Second)
	lines.mu.Lock()
	defer lines.mu.Unlock()
	if lines.n > secs+2 {
		t.Fatalf("4000 refusals in %ds logged %d lines:\n%.2000s", secs, lines.n, lines.b.String())
	}
	if lines.n == 0 || !strings.Contains(lines.b.String(), "meta call refused") {
		t.Fatalf("refusals not logged at all: %q", lines.b.String())
	}
}

// TestBadJoinNoWriteLock: a join with a token meta does not hold is
// refused without the write lock (here held for reading by the test, so
// a writer would wait), and a large body is refused before it is read.
func TestBadJoinNoWriteLock(t *testing.T) {
	f := newFixture(t)
	tok, _ := jointoken.New(pki.Fingerprint(f.s.CA().Cert)) // never issued
	_, csr, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	f.s.mu.RLock()
	done := make(chan error, 1)
	go func() {
		_, err := f.s.Join(metaapi.JoinReq{Token: tok.String(), CSR: csr})
		done <- err
	}()
	select {
	case err := <-done:
		f.s.mu.RUnlock()
		wantCode(t, err, metaapi.EAUTH)
	case <-time.After(20 * time.Second):
		f.s.mu.RUnlock()
		<-done
		t.Fatal("a join with a bad token waited for the write lock")
	}
	body := `{"token":"` + tok.String() + `","csr":"` + strings.Repeat("A", 1<<20) + `"}`
	w := httptest.NewRecorder()
	f.s.Handler().ServeHTTP(w, httptest.NewRequest("POST", "/v1/Join", strings.NewReader(body)))
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "larger than 16384 bytes") {
		t.Fatalf("1 MiB join: %d %s", w.Code, w.Body)
	}
}
