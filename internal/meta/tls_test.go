package meta

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/jointoken"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// tlsServer serves h over TLS as Serve does, with the fixture's
// certificate (its chain ends with the cluster CA).
func tlsServer(t testing.TB, f *fixture, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	tc, err := f.s.TLSConfig(srv.Listener.Addr())
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = tc
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// clientTLS trusts the CA srv's certificate chain ends with, as a
// client.conf's CA does.
func clientTLS(srv *httptest.Server) *tls.Config {
	chain := srv.TLS.Certificates[0].Certificate
	ca, err := x509.ParseCertificate(chain[len(chain)-1])
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}
}

func httpsClient(srv *httptest.Server) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS(srv)}}
}

func addrOf(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "https://") }

func newTLSFixture(t *testing.T) (*fixture, *httptest.Server) {
	f := newFixture(t)
	return f, tlsServer(t, f, f.s.Handler())
}

// joinToken has the fixture's meta create a join token.
func joinToken(t *testing.T, f *fixture, ttl time.Duration) string {
	t.Helper()
	tok, err := f.s.NewJoinToken(ttl, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok.Token
}

// joinOver joins a node over srv the way a new node does (the TLS
// connection verified against the token's pin).
func joinOver(t *testing.T, addr, token string) (metaapi.JoinResp, []byte, error) {
	t.Helper()
	return joinOverAs(t, addr, token, 0)
}

// joinOverAs is joinOver by a node that has id already (0: none).
func joinOverAs(t *testing.T, addr, token string, id ids.NodeID) (metaapi.JoinResp, []byte, error) {
	t.Helper()
	keyPEM, csr, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	pin := "sha256:" + strings.Repeat("0", 64)
	if tok, err := jointoken.Parse(token); err == nil {
		pin = tok.Pin
	}
	c := metaapi.NewClient(addr, "", pki.JoinConfig(pin))
	c.RetryFor = 0
	defer c.Close()
	var resp metaapi.JoinResp
	err = c.Call(context.Background(), metaapi.OpJoin, metaapi.JoinReq{Token: token, CSR: csr, ID: id}, &resp)
	return resp, keyPEM, err
}

// joinedClient joins a node and returns a meta client authenticating
// with its certificate.
func joinedClient(t *testing.T, f *fixture, srv *httptest.Server) (*metaapi.Client, ids.NodeID) {
	t.Helper()
	resp, keyPEM, err := joinOver(t, addrOf(srv), joinToken(t, f, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := pki.NodeConfig([]byte(resp.CA), []byte(resp.Cert), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c := metaapi.NewClient(addrOf(srv), "", tc)
	c.RetryFor = 0
	t.Cleanup(c.Close)
	return c, resp.ID
}

func TestJoin(t *testing.T) {
	f, srv := newTLSFixture(t)
	token := joinToken(t, f, time.Hour)
	resp, keyPEM, err := joinOver(t, addrOf(srv), token)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ID != 1 || resp.CA != string(f.s.CA().CertPEM) {
		t.Fatalf("join: id %v, CA given %v", resp.ID, resp.CA == string(f.s.CA().CertPEM))
	}
	cert, err := pki.ParseCert([]byte(resp.Cert))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.VerifyNode([]*x509.Certificate{cert}, f.s.CA().Pool(), x509.ExtKeyUsageClientAuth, 1); err != nil {
		t.Fatalf("joined node's certificate: %v", err)
	}
	if _, err := tls.X509KeyPair([]byte(resp.Cert), keyPEM); err != nil {
		t.Fatalf("certificate is not for the node's key: %v", err)
	}
	// The token is spent: a second use is refused and uses no id.
	_, _, err = joinOver(t, addrOf(srv), token)
	wantCode(t, err, metaapi.EAUTH)
	if !strings.Contains(err.Error(), "already used") {
		t.Errorf("reused token: %v", err)
	}
	if resp2, _, err := joinOver(t, addrOf(srv), joinToken(t, f, time.Hour)); err != nil || resp2.ID != 2 {
		t.Fatalf("next join: id %v, %v (a refused join used an id?)", resp2.ID, err)
	}
}

func TestJoinRefusals(t *testing.T) {
	f, srv := newTLSFixture(t)
	good := joinToken(t, f, time.Hour)
	tok, _ := jointoken.Parse(good)
	forged, _ := jointoken.New(tok.Pin)
	stolenID := forged
	stolenID.ID = tok.ID // the real token's id, a guessed secret
	other := newFixture(t)
	foreign := joinToken(t, other, time.Hour)
	_, csr, _ := pki.NewNodeKey()
	call := func(req metaapi.JoinReq) error {
		c := metaapi.NewClient(addrOf(srv), "", pki.JoinConfig(tok.Pin))
		c.RetryFor = 0
		defer c.Close()
		return c.Call(context.Background(), metaapi.OpJoin, req, nil)
	}
	for _, tc := range []struct {
		name string
		req  metaapi.JoinReq
		code metaapi.Code
		msg  string
	}{
		{"forged", metaapi.JoinReq{Token: forged.String(), CSR: csr}, metaapi.EAUTH, "not issued by this cluster"},
		{"guessed secret", metaapi.JoinReq{Token: stolenID.String(), CSR: csr}, metaapi.EAUTH, "not issued by this cluster"},
		{"another cluster's", metaapi.JoinReq{Token: foreign, CSR: csr}, metaapi.EAUTH, "another cluster"},
		{"not a token", metaapi.JoinReq{Token: "hello", CSR: csr}, metaapi.EAUTH, "not a join token"},
		{"no CSR", metaapi.JoinReq{Token: good}, metaapi.EINVAL, "certificate request"},
		{"garbage CSR", metaapi.JoinReq{Token: good, CSR: []byte("\x30\x03abc")}, metaapi.EINVAL, "certificate request"},
		{"huge CSR", metaapi.JoinReq{Token: good, CSR: make([]byte, 64<<10)}, metaapi.EINVAL, "bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := call(tc.req)
			wantCode(t, err, tc.code)
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
		})
	}
	// None of them spent the good token or an id.
	if resp, _, err := joinOver(t, addrOf(srv), good); err != nil || resp.ID != 1 {
		t.Fatalf("good token after refusals: id %v, %v", resp.ID, err)
	}
}

// TestRejoin: a token made for node 1 lets node 1 (which lost its
// credentials, or predates TLS) join again keeping its id, and no other:
// not a new node, not node 2; a token for a new node does not let a
// node claim an id.
func TestRejoin(t *testing.T) {
	f, srv := newTLSFixture(t)
	addr := addrOf(srv)
	if _, _, err := joinOver(t, addr, joinToken(t, f, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := joinOver(t, addr, joinToken(t, f, time.Hour)); err != nil {
		t.Fatal(err)
	}
	rejoin := func(node ids.NodeID) string {
		tok, err := f.s.NewJoinToken(time.Hour, node)
		if err != nil {
			t.Fatal(err)
		}
		return tok.Token
	}
	for _, tc := range []struct {
		name  string
		token string
		as    ids.NodeID
		msg   string
	}{
		{"new node's token claiming node 1", joinToken(t, f, time.Hour), 1, "admits a new node"},
		{"node 1's token used by a new node", rejoin(1), 0, "admits node n1 only"},
		{"node 2's token claiming node 1", rejoin(2), 1, "admits node n2 only"},
	} {
		_, _, err := joinOverAs(t, addr, tc.token, tc.as)
		wantCode(t, err, metaapi.EAUTH)
		if !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	resp, _, err := joinOverAs(t, addr, rejoin(1), 1)
	if err != nil || resp.ID != 1 {
		t.Fatalf("node 1 joining again: %v %v", resp.ID, err)
	}
	if resp, _, err := joinOver(t, addr, joinToken(t, f, time.Hour)); err != nil || resp.ID != 3 {
		t.Fatalf("next new node: %v %v (a rejoin or refusal took an id?)", resp.ID, err)
	}
	if _, err := f.s.NewJoinToken(time.Hour, 99); !metaapi.IsCode(err, metaapi.EINVAL) {
		t.Fatalf("token for a node never admitted: %v", err)
	}
}

func TestJoinTokenExpires(t *testing.T) {
	f, srv := newTLSFixture(t)
	token := joinToken(t, f, time.Minute)
	f.clk.Advance(time.Minute + time.Second)
	_, _, err := joinOver(t, addrOf(srv), token)
	wantCode(t, err, metaapi.EAUTH)
	if !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v", err)
	}
	if st, _ := f.s.Status(); len(st.Nodes) != 0 {
		t.Errorf("expired token admitted %d nodes", len(st.Nodes))
	}
	// At most MaxJoinTokens outstanding; expired ones make room.
	for range metaapi.MaxJoinTokens { // the expired one above counts no more
		joinToken(t, f, time.Minute)
	}
	if _, err := f.s.NewJoinToken(time.Minute, 0); !metaapi.IsCode(err, metaapi.EINVAL) {
		t.Fatalf("token %d: %v", metaapi.MaxJoinTokens+1, err)
	}
	f.clk.Advance(2 * time.Minute)
	joinToken(t, f, time.Minute)
	for _, ttl := range []time.Duration{-time.Second, 8 * 24 * time.Hour} {
		if _, err := f.s.NewJoinToken(ttl, 0); !metaapi.IsCode(err, metaapi.EINVAL) {
			t.Errorf("token for %s: %v", ttl, err)
		}
	}
}

func TestJoinTokenNeedsAClient(t *testing.T) {
	f, srv := newTLSFixture(t)
	nc, _ := joinedClient(t, f, srv)
	err := nc.Call(context.Background(), metaapi.OpJoinToken, metaapi.JoinTokenReq{}, nil)
	wantCode(t, err, metaapi.EAUTH)
	anon := metaapi.NewClient(addrOf(srv), "", clientTLS(srv))
	anon.RetryFor = 0
	defer anon.Close()
	wantCode(t, anon.Call(context.Background(), metaapi.OpJoinToken, metaapi.JoinTokenReq{}, nil), metaapi.EAUTH)
	// A principal that is not an admin may not admit nodes.
	bob, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	err = client(t, srv, metaapi.ClientAuth(uint64(bob.Principal.ID), bob.Credential)).Call(context.Background(), metaapi.OpJoinToken, metaapi.JoinTokenReq{}, nil)
	wantCode(t, err, metaapi.EPERM)
	var resp metaapi.JoinTokenResp
	cl := client(t, srv, metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)))
	if err := cl.Call(context.Background(), metaapi.OpJoinToken, metaapi.JoinTokenReq{TTL: int64(time.Minute)}, &resp); err != nil {
		t.Fatal(err)
	}
	if _, err := jointoken.Parse(resp.Token); err != nil {
		t.Fatalf("token %q: %v", resp.Token, err)
	}
}

// TestNodeCertIsOneNode: node 1's certificate cannot register,
// heartbeat or list an inventory as node 2, nor call client operations.
func TestNodeCertIsOneNode(t *testing.T) {
	f, srv := newTLSFixture(t)
	ctx := context.Background()
	n1, id1 := joinedClient(t, f, srv)
	n2, id2 := joinedClient(t, f, srv)
	if err := n2.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id2, Addr: "127.0.0.1:2"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := n1.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id1, Addr: "127.0.0.1:1"}, nil); err != nil {
		t.Fatal(err)
	}
	before, _ := f.s.Status()
	f.clk.Advance(time.Second)
	for _, tc := range []struct {
		op  string
		req any
	}{
		{metaapi.OpRegister, metaapi.RegisterReq{ID: id2, Addr: "10.9.9.9:1"}},
		{metaapi.OpRegister, metaapi.RegisterReq{Addr: "10.9.9.9:1"}},
		{metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id2, Addr: "10.9.9.9:1"}},
		{metaapi.OpInventory, metaapi.InventoryReq{Node: id2, Done: true}},
		{metaapi.OpGetAttr, metaapi.GetAttrReq{Ino: ids.RootIno}},
		{metaapi.OpLayout, metaapi.LayoutReq{Ino: ids.RootIno}},
	} {
		err := n1.Call(ctx, tc.op, tc.req, nil)
		wantCode(t, err, metaapi.EAUTH)
	}
	after, _ := f.s.Status()
	for i, n := range after.Nodes {
		if b := before.Nodes[i]; n.Addr != b.Addr || n.LastHeartbeat != b.LastHeartbeat {
			t.Errorf("node %v changed by another node's certificate: %+v -> %+v", n.ID, b, n)
		}
	}
	if after.Epoch != before.Epoch {
		t.Errorf("epoch %d -> %d", before.Epoch, after.Epoch)
	}
	if err := n1.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id1}, nil); err != nil {
		t.Fatalf("own heartbeat: %v", err)
	}
}

// TestForeignCertificates: a node certificate of another cluster is
// refused at the handshake; a client trusting another CA refuses meta.
func TestForeignCertificates(t *testing.T) {
	f, srv := newTLSFixture(t)
	other := newFixture(t)
	otherSrv := tlsServer(t, other, other.s.Handler())
	_, _ = joinedClient(t, f, srv) // node 1 of this cluster, so the id exists
	resp, keyPEM, err := joinOver(t, addrOf(otherSrv), joinToken(t, other, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The foreign node certificate, with this cluster's CA to trust meta.
	tc, err := pki.NodeConfig(f.s.CA().CertPEM, []byte(resp.Cert), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c := metaapi.NewClient(addrOf(srv), "", tc)
	c.RetryFor = time.Minute // not retried even so: it cannot succeed
	defer c.Close()
	start := time.Now()
	err = c.Call(context.Background(), metaapi.OpRegister, metaapi.RegisterReq{ID: resp.ID, Addr: "127.0.0.1:1"}, nil)
	var te *metaapi.TLSError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "refused the TLS handshake") {
		t.Fatalf("foreign node certificate: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("a TLS refusal was retried for %s", d)
	}
	if st, _ := f.s.Status(); len(st.Nodes) != 0 {
		t.Errorf("foreign certificate registered a node: %+v", st.Nodes)
	}
	// A client with another cluster's CA (a client.conf of another
	// cluster) does not trust this meta, and says so.
	wrong := metaapi.NewClient(addrOf(srv), metaapi.ClientAuth(1, f.s.credKey.ClientCredential(1)), clientTLS(otherSrv))
	defer wrong.Close()
	err = wrong.Call(context.Background(), metaapi.OpStatus, struct{}{}, nil)
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "not signed by the cluster CA") {
		t.Fatalf("client with the wrong CA: %v", err)
	}
	// A node joining with a token pinning this CA refuses the other meta
	// before it sends the token.
	token := joinToken(t, f, time.Hour)
	_, _, err = joinOver(t, addrOf(otherSrv), token)
	if !errors.Is(err, pki.ErrPin) && !strings.Contains(err.Error(), pki.ErrPin.Error()) {
		t.Fatalf("join with an impostor meta: %v", err)
	}
	if _, _, err := joinOver(t, addrOf(srv), token); err != nil {
		t.Fatalf("the token reached the impostor: %v", err)
	}
}

// serveReal runs Serve on a loopback listener, as `sluice meta` does.
func serveReal(t *testing.T, f *fixture) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.s.Shutdown(ctx)
		<-done
	})
	return ln.Addr().String()
}

// TestPlainAndGarbageRefused: plain HTTP to meta's port gets a clear
// refusal, garbage a closed connection, and meta serves on unchanged;
// a client talking to a server without TLS says so.
func TestPlainAndGarbageRefused(t *testing.T) {
	f := newFixture(t)
	addr := serveReal(t, f)
	before, _ := f.s.Status()
	resp, err := http.Post("http://"+addr+"/v1/Join", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTP request to an HTTPS server") {
		t.Fatalf("plain HTTP: %d %q", resp.StatusCode, body)
	}
	for _, garbage := range [][]byte{
		[]byte("\x00\x01\x02\x03 garbage \xff\xfe"),
		{0x16, 0x03, 0x01, 0x40, 0x00, 0x01, 0x00}, // a handshake record announcing 16 KiB, cut short
		{0x16, 0x03, 0x03, 0x00, 0x05, 0x01, 0xff, 0xff, 0xff, 0xff},
		make([]byte, 100000),
	} {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(garbage)
		nc.(*net.TCPConn).CloseWrite()
		nc.SetReadDeadline(time.Now().Add(15 * time.Second))
		got, err := io.ReadAll(nc)
		nc.Close()
		if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Errorf("garbage %.10q: connection not closed: %v", garbage, err)
		}
		if len(got) > 0 && got[0] != 0x15 && got[0] != 'H' { // a TLS alert or the HTTP refusal
			t.Errorf("garbage %.10q answered %q", garbage, got)
		}
	}
	conf := f.s.ClientConf(addr)
	tc, err := pki.ClientConfig([]byte(conf.CA))
	if err != nil {
		t.Fatal(err)
	}
	c := metaapi.NewClient(addr, metaapi.ClientAuth(conf.ClientID, conf.Credential), tc)
	defer c.Close()
	var after metaapi.StatusResp
	if err := c.Call(context.Background(), metaapi.OpStatus, struct{}{}, &after); err != nil {
		t.Fatalf("meta after garbage: %v", err)
	}
	if after.Epoch != before.Epoch || len(after.Nodes) != len(before.Nodes) || after.Dirs != before.Dirs {
		t.Errorf("garbage changed meta: %+v -> %+v", before, after)
	}
	// A plain HTTP server posing as meta: the client does not fall back.
	plain := httptest.NewServer(f.s.Handler())
	defer plain.Close()
	pc := metaapi.NewClient(strings.TrimPrefix(plain.URL, "http://"), metaapi.ClientAuth(conf.ClientID, conf.Credential), tc)
	defer pc.Close()
	err = pc.Call(context.Background(), metaapi.OpStatus, struct{}{}, nil)
	var te *metaapi.TLSError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "does not speak TLS") {
		t.Fatalf("client to a plain HTTP server: %v", err)
	}
}
