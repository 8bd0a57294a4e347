package sdk

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/pki"
)

// Fabric TLS (Options.FabricTLS): the client reaches nodes over TLS and
// accepts a node only with a certificate of the cluster CA naming the
// node meta places at the address dialled — the node its layout named
// (layouts and the cluster map come from meta, over TLS). It presents
// no certificate: nodes authorise it per request by capabilities.

// nodeMap is the client's view of which node is at which fabric address,
// from meta's status, refreshed when an address is not in it (a node
// joined or moved) or its node failed verification.
type nodeMap struct {
	mu      sync.Mutex
	byAddr  map[string][]ids.NodeID
	fetched time.Time
	// status fetches the cluster map (Client.Status).
	status func(ctx context.Context) (map[string][]ids.NodeID, error)
}

// minRefresh bounds how often a miss fetches the map again.
const minRefresh = 200 * time.Millisecond

func (m *nodeMap) lookup(addr string) ([]ids.NodeID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if got := m.byAddr[addr]; len(got) > 0 {
		return got, nil
	}
	if time.Since(m.fetched) >= minRefresh {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		byAddr, err := m.status(ctx)
		if err != nil {
			return nil, fmt.Errorf("finding the node at %s: %w", addr, err)
		}
		m.byAddr, m.fetched = byAddr, time.Now()
	}
	if got := m.byAddr[addr]; len(got) > 0 {
		return got, nil
	}
	return nil, fmt.Errorf("no storage node at %s in the cluster map", addr)
}

func (m *nodeMap) forget(addr string) {
	m.mu.Lock()
	delete(m.byAddr, addr)
	m.mu.Unlock()
}

// dialTLS returns the fabric TLS configuration for a node at addr.
func (m *nodeMap) dialTLS(roots *x509.CertPool) func(addr string) (*tls.Config, error) {
	return func(addr string) (*tls.Config, error) {
		want, err := m.lookup(addr)
		if err != nil {
			return nil, err
		}
		cfg := pki.FabricDialConfig(roots, want...)
		verify := cfg.VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			err := verify(cs)
			if err != nil {
				m.forget(addr) // perhaps stale: look again next time
			}
			return err
		}
		return cfg, nil
	}
}

// statusMap is the status function of a client's nodeMap.
func (c *Client) statusMap(ctx context.Context) (map[string][]ids.NodeID, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]ids.NodeID, len(st.Nodes))
	for _, n := range st.Nodes {
		out[n.Addr] = append(out[n.Addr], n.ID)
	}
	return out, nil
}
