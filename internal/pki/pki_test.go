package pki

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

func nodeCert(t *testing.T, ca *CA, id ids.NodeID) *x509.Certificate {
	t.Helper()
	_, csrDER, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := CheckCSR(csrDER)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignNode(csr, id)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ParseCert(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func TestCAFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CACertFile, CAKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", f, fi, err)
		}
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(again.Cert) != Fingerprint(ca.Cert) {
		t.Fatal("the CA changed across a restart")
	}
	// A missing key is an error, never a new CA nodes do not trust.
	os.Remove(filepath.Join(dir, CAKeyFile))
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("CA without its key: %v", err)
	}
	// A key of another CA.
	other := t.TempDir()
	if _, err := LoadOrCreateCA(other); err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(filepath.Join(other, CAKeyFile))
	os.WriteFile(filepath.Join(dir, CAKeyFile), key, 0o600)
	if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("CA with another's key: %v", err)
	}
}

func TestVerifyNode(t *testing.T) {
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c2 := nodeCert(t, ca, 2)
	if id, err := VerifyNode([]*x509.Certificate{c2}, ca.Pool(), x509.ExtKeyUsageClientAuth, 2); err != nil || id != 2 {
		t.Fatalf("node 2 as node 2: %v %v", id, err)
	}
	if id, err := VerifyNode([]*x509.Certificate{c2}, ca.Pool(), x509.ExtKeyUsageServerAuth, 0); err != nil || id != 2 {
		t.Fatalf("node 2 as any node, server usage: %v %v", id, err)
	}
	if _, err := VerifyNode([]*x509.Certificate{c2}, ca.Pool(), x509.ExtKeyUsageClientAuth, 3); err == nil || !strings.Contains(err.Error(), "not node n3's") {
		t.Fatalf("node 2's certificate passed for node 3: %v", err)
	}
	if _, err := VerifyNode([]*x509.Certificate{nodeCert(t, other, 2)}, ca.Pool(), x509.ExtKeyUsageClientAuth, 2); err == nil {
		t.Fatal("another CA's node 2 passed")
	}
	if _, err := VerifyNode(nil, ca.Pool(), x509.ExtKeyUsageClientAuth, 2); err == nil {
		t.Fatal("no certificate passed")
	}
	// Meta's server certificate is signed by the CA but names no node.
	certPEM, keyPEM, err := ca.ServerCert([]string{"127.0.0.1", "meta.example"})
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ParseCert(certPEM)
	if _, err := VerifyNode([]*x509.Certificate{srv}, ca.Pool(), x509.ExtKeyUsageServerAuth, 0); err == nil {
		t.Fatal("meta's certificate passed as a node's")
	}
	if _, err := srv.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "meta.example"}); err != nil {
		t.Fatalf("server certificate: %v", err)
	}
	if _, err := ca.ServerConfig(certPEM, keyPEM); err != nil {
		t.Fatal(err)
	}
}

func TestNodeID(t *testing.T) {
	for _, tc := range []struct {
		uris []string
		want ids.NodeID
		err  string
	}{
		{[]string{"sluice://node/7"}, 7, ""},
		{[]string{"https://example.com", "sluice://node/7"}, 7, ""},
		{nil, 0, "names no storage node"},
		{[]string{"sluice://node/0"}, 0, "malformed"},
		{[]string{"sluice://node/x"}, 0, "malformed"},
		{[]string{"sluice://node/99999999999"}, 0, "malformed"},
		{[]string{"sluice://node/1", "sluice://node/2"}, 0, "more than one"},
	} {
		c := &x509.Certificate{}
		for _, u := range tc.uris {
			p, _ := url.Parse(u)
			c.URIs = append(c.URIs, p)
		}
		id, err := NodeID(c)
		if id != tc.want || (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: %v %v", tc.uris, id, err)
		}
	}
}

func TestCSR(t *testing.T) {
	_, csrDER, err := NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), csrDER...)
	bad[len(bad)-5] ^= 1 // the signature
	if _, err := CheckCSR(bad); err == nil {
		t.Fatal("a CSR with a broken signature passed")
	}
	if _, err := CheckCSR([]byte("junk")); err == nil {
		t.Fatal("junk passed as a CSR")
	}
	ca, _ := LoadOrCreateCA(t.TempDir())
	if _, err := ca.SignNode(&x509.CertificateRequest{}, 0); err == nil {
		t.Fatal("signed a certificate for node 0")
	}
}

func TestJoinConfigPin(t *testing.T) {
	ca, _ := LoadOrCreateCA(t.TempDir())
	other, _ := LoadOrCreateCA(t.TempDir())
	certPEM, keyPEM, _ := ca.ServerCert([]string{"127.0.0.1"})
	sc, _ := ca.ServerConfig(certPEM, keyPEM)
	chain := make([]*x509.Certificate, 0, 2)
	for _, der := range sc.Certificates[0].Certificate {
		c, _ := x509.ParseCertificate(der)
		chain = append(chain, c)
	}
	verify := func(pin, host string) error {
		return JoinConfig(pin).VerifyConnection(tls.ConnectionState{PeerCertificates: chain, ServerName: host})
	}
	if err := verify(Fingerprint(ca.Cert), "127.0.0.1"); err != nil {
		t.Fatalf("right pin: %v", err)
	}
	if err := verify(Fingerprint(other.Cert), "127.0.0.1"); err != ErrPin {
		t.Fatalf("another CA's pin: %v", err)
	}
	if err := verify(Fingerprint(ca.Cert), "10.0.0.1"); err == nil {
		t.Fatal("a certificate for another address passed")
	}
	// A chain that carries the pinned CA but whose leaf it did not sign.
	oc, _, _ := other.ServerCert([]string{"127.0.0.1"})
	leaf, _ := ParseCert(oc)
	if err := JoinConfig(Fingerprint(ca.Cert)).VerifyConnection(tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf, ca.Cert}, ServerName: "127.0.0.1"}); err == nil {
		t.Fatal("a leaf of another CA passed with the pinned CA appended")
	}
}
