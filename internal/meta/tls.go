package meta

import (
	"crypto/tls"
	"net"
	"os"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// TLS on the control plane: meta serves only TLS 1.3, with a
// certificate from the cluster CA (pki) issued at every start for the
// names it can be reached by. Storage nodes present certificates naming
// their node id (given when they joined, join.go); a node may act only
// as the node its certificate names. Clients present none: they
// authenticate per request (authenticate).

// CA is the cluster's certificate authority.
func (s *Service) CA() *pki.CA { return s.ca }

// TLSConfig returns the server TLS configuration for a listener at
// addr: its certificate names loopback, this host's name, addr's host
// (every local address when addr's is unspecified), the reported meta
// address and Options.TLSNames.
func (s *Service) TLSConfig(addr net.Addr) (*tls.Config, error) {
	s.mu.RLock()
	hosts := s.serverNames(addr, s.metaAddr)
	s.mu.RUnlock()
	certPEM, keyPEM, err := s.ca.ServerCert(hosts)
	if err != nil {
		return nil, err
	}
	return s.ca.ServerConfig(certPEM, keyPEM)
}

func (s *Service) serverNames(addr net.Addr, metaAddr string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil {
		hosts = append(hosts, h)
	}
	if h, _, err := net.SplitHostPort(metaAddr); err == nil {
		hosts = append(hosts, h)
	}
	if ta, ok := addr.(*net.TCPAddr); ok {
		if !ta.IP.IsUnspecified() {
			hosts = append(hosts, ta.IP.String())
		} else if as, err := net.InterfaceAddrs(); err == nil {
			for _, a := range as {
				if ipn, ok := a.(*net.IPNet); ok {
					hosts = append(hosts, ipn.IP.String())
				}
			}
		}
	}
	return append(hosts, s.opts.TLSNames...)
}

// authenticateNode identifies a storage node by the certificate it
// presented on the connection, which the TLS layer verified against the
// cluster CA; callerNone if it presented none. A certificate that is not
// its node's current one (nodecert.go) is refused.
func (s *Service) authenticateNode(cs *tls.ConnectionState) (caller, error) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return caller{}, nil
	}
	cert := cs.VerifiedChains[0][0]
	id, err := pki.NodeID(cert)
	if err != nil {
		// Signed by the CA but no node's: meta's own certificate, say.
		s.log.Warn("refusing a certificate that names no node", "err", err)
		return caller{}, nil
	}
	if err := s.checkNodeCert(id, cert); err != nil {
		return caller{}, err
	}
	return caller{kind: callerNode, node: id}, nil
}

// actsAs refuses a node acting as another than its certificate names.
func actsAs(c caller, id ids.NodeID) error {
	if c.kind != callerNode || c.node != id {
		return metaapi.Errorf(metaapi.EAUTH, "this certificate is node %v's: it may not act as node %v", c.node, id)
	}
	return nil
}
