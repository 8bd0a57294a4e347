package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/sluicefs/sluice/internal/ids"
)

// TLS configurations. Every one is TLS 1.3 only and trusts the cluster
// CA alone, never the system roots.

// ServerConfig is meta's: its certificate (sent with the CA, so a
// joining node can match the CA against its token's pin), and client
// certificates verified against the CA when one is given: storage
// nodes present theirs, clients none (they authenticate per request).
func (ca *CA) ServerConfig(certPEM, keyPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("meta's TLS certificate: %w", err)
	}
	cert.Certificate = append(cert.Certificate, ca.Cert.Raw)
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.Pool(),
	}, nil
}

// PoolFromPEM returns a pool of the certificates in caPEM (at least one).
func PoolFromPEM(caPEM []byte) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no PEM certificate in the cluster CA")
	}
	return p, nil
}

// ClientConfig is a client's: meta must present a certificate from the
// CA in caPEM for the address dialled.
func ClientConfig(caPEM []byte) (*tls.Config, error) {
	pool, err := PoolFromPEM(caPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool}, nil
}

// NodeConfig is a joined storage node's towards meta: ClientConfig plus
// the node's own certificate.
func NodeConfig(caPEM, certPEM, keyPEM []byte) (*tls.Config, error) {
	c, err := ClientConfig(caPEM)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	c.Certificates = []tls.Certificate{cert}
	return c, nil
}

// ErrPin is returned when the server does not present the CA a join
// token pins.
var ErrPin = errors.New("meta does not present the cluster CA the join token pins (wrong --meta address, a token of another cluster, or an impostor)")

// JoinConfig is a new node's before it has the CA: the server's chain
// must carry a CA whose fingerprint is pin, and the server certificate
// must be valid under it for the address dialled. Standard verification
// is replaced (InsecureSkipVerify) only because the trusted CA comes
// from the pin rather than a pool; VerifyConnection does all of it.
func JoinConfig(pin string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			var ca *x509.Certificate
			for _, c := range cs.PeerCertificates {
				if Fingerprint(c) == pin {
					ca = c
				}
			}
			if ca == nil || len(cs.PeerCertificates) == 0 {
				return ErrPin
			}
			roots := x509.NewCertPool()
			roots.AddCert(ca)
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, DNSName: cs.ServerName})
			if err != nil {
				return fmt.Errorf("meta's certificate under the pinned CA: %w", err)
			}
			return nil
		},
	}
}

// FabricServerConfig is a storage node's on the fabric (--fabric-tls):
// it presents its node certificate; peers present none (clients are
// authorised per request by capabilities, forwarding nodes by the seal
// on what they forward).
func FabricServerConfig(certPEM, keyPEM []byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("node certificate: %w", err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}, nil
}

// FabricDialConfig accepts a peer only with a node certificate from the
// CA in roots naming one of want: the node the dialler meant to reach
// (a node's certificate names no address, so the usual host name check
// is replaced by this one).
func FabricDialConfig(roots *x509.CertPool, want ...ids.NodeID) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := VerifyNode(cs.PeerCertificates, roots, x509.ExtKeyUsageServerAuth, 0)
			if err != nil {
				return err
			}
			if !slices.Contains(want, id) {
				return fmt.Errorf("the peer is node %v, not %v", id, want)
			}
			return nil
		},
	}
}
