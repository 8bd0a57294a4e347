// Package pki is the cluster's certificate authority: meta creates an
// ECDSA P-256 CA on first start (ca.crt and ca.key, 0600, in its data
// directory), issues its own TLS server certificate from it at every
// start, and signs storage nodes' certificates when they join. A node
// certificate names its node id as the URI SAN sluice://node/<id>;
// VerifyNode checks both the chain to the cluster CA and that id, so a
// certificate of one node never passes for another.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/privfs"
)

// File names of the CA inside meta's data directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// Lifetimes. The CA outlives everything it signs; a node certificate
// lasts as long as a node is expected to (rejoining gives a new one);
// meta's server certificate is issued anew at every start.
const (
	caLifetime     = 20 * 365 * 24 * time.Hour
	nodeLifetime   = 10 * 365 * 24 * time.Hour
	serverLifetime = 365 * 24 * time.Hour
	// backdate covers clocks a little behind the issuer's.
	backdate = time.Hour
)

// nodeURIPrefix starts the URI SAN naming a node: sluice://node/<id>.
const nodeURIPrefix = "sluice://node/"

// CA is the cluster's certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// LoadOrCreateCA loads the CA from dir, creating it on first start.
func LoadOrCreateCA(dir string) (*CA, error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	switch {
	case cerr == nil && kerr == nil:
		ca, err := parseCA(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("loading cluster CA from %s: %w", dir, err)
		}
		return ca, nil
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
	case cerr != nil && !errors.Is(cerr, fs.ErrNotExist):
		return nil, fmt.Errorf("reading cluster CA: %w", cerr)
	case kerr != nil && !errors.Is(kerr, fs.ErrNotExist):
		return nil, fmt.Errorf("reading cluster CA key: %w", kerr)
	default:
		// One without the other: never silently replace a CA nodes trust.
		return nil, fmt.Errorf("cluster CA in %s is incomplete (%s and %s must both exist)", dir, CACertFile, CAKeyFile)
	}
	ca, keyPEM, err := newCA()
	if err != nil {
		return nil, err
	}
	// The key first: a crash in between leaves "incomplete", not a
	// certificate without its key that looks whole.
	if err := privfs.WriteFile(keyPath, keyPEM); err != nil {
		return nil, fmt.Errorf("writing cluster CA key: %w", err)
	}
	if err := privfs.WriteFile(certPath, ca.CertPEM); err != nil {
		return nil, fmt.Errorf("writing cluster CA: %w", err)
	}
	return ca, nil
}

func newCA() (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "sluice cluster CA"},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}
	return ca, pemBlock("EC PRIVATE KEY", keyDER), nil
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCert(certPEM)
	if err != nil {
		return nil, err
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, errors.New("CA key is not PEM")
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate is not a CA")
	}
	return &CA{Cert: cert, CertPEM: certPEM, key: key}, nil
}

// ParseCert decodes one PEM certificate.
func ParseCert(certPEM []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("not a PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// Pool returns a pool holding only the CA: peers are checked against
// the cluster's CA, never the system roots.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Fingerprint is "sha256:<hex>" of a certificate's DER: what a join
// token pins so a new node can tell the cluster's meta from another.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ServerCert issues meta's TLS server certificate for hosts (names or
// IP addresses), with a fresh key. It is valid for serverLifetime and
// issued again at every start, so it is not kept on disk.
func (ca *CA) ServerCert(hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating meta's TLS key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "sluice meta"},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(serverLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing meta's TLS certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

// NewNodeKey returns a new node key (PEM) and a certificate request for
// it (DER), which the node sends with its join token.
func NewNodeKey() (keyPEM, csrDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating node key: %w", err)
	}
	csrDER, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "sluice node"}}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating certificate request: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("EC PRIVATE KEY", keyDER), csrDER, nil
}

// CheckCSR parses a certificate request and checks its signature (the
// requester holds the key). Only P-256 keys are accepted.
func CheckCSR(csrDER []byte) (*x509.CertificateRequest, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("certificate request: %w", err)
	}
	if k, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		return nil, errors.New("certificate request: key is not ECDSA P-256")
	}
	return csr, nil
}

// SignNode issues the certificate naming node id for a checked
// certificate request. Whatever else the request asks for is ignored:
// the certificate carries only the node's URI and the usages a node
// needs (client to meta and peers, server on the fabric).
func (ca *CA) SignNode(csr *x509.CertificateRequest, id ids.NodeID) ([]byte, error) {
	if id == 0 {
		return nil, errors.New("signing a node certificate: no node id")
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "sluice node " + id.String()},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(nodeLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:         []*url.URL{NodeURI(id)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate of node %v: %w", id, err)
	}
	return pemBlock("CERTIFICATE", der), nil
}

// NodeURI is the URI SAN naming node id.
func NodeURI(id ids.NodeID) *url.URL {
	u, _ := url.Parse(nodeURIPrefix + strconv.FormatUint(uint64(id), 10))
	return u
}

// NodeID returns the node id a certificate names; it fails unless the
// certificate names exactly one node.
func NodeID(cert *x509.Certificate) (ids.NodeID, error) {
	var id ids.NodeID
	for _, u := range cert.URIs {
		if u.Scheme != "sluice" || u.Host != "node" {
			continue
		}
		n, err := strconv.ParseUint(u.Path[min(1, len(u.Path)):], 10, 32)
		if err != nil || n == 0 || u.Path == "" || u.Path[0] != '/' {
			return 0, fmt.Errorf("certificate names a malformed node %q", u.String())
		}
		if id != 0 {
			return 0, errors.New("certificate names more than one node")
		}
		id = ids.NodeID(n)
	}
	if id == 0 {
		return 0, errors.New("certificate names no storage node")
	}
	return id, nil
}

// VerifyNode checks that chain[0] is signed by the CA in roots, is
// valid now for usage, and names node want (0: any node). It returns
// the node id the certificate names.
func VerifyNode(chain []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, want ids.NodeID) (ids.NodeID, error) {
	if len(chain) == 0 {
		return 0, errors.New("no certificate presented")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return 0, fmt.Errorf("node certificate: %w", err)
	}
	id, err := NodeID(chain[0])
	if err != nil {
		return 0, err
	}
	if want != 0 && id != want {
		return id, fmt.Errorf("certificate is node %v's, not node %v's", id, want)
	}
	return id, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("crypto/rand failed: " + err.Error()) // crypto/rand does not fail on supported systems
	}
	return n.Add(n, big.NewInt(1))
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
