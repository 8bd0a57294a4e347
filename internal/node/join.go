package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/jointoken"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
	"github.com/sluicefs/sluice/internal/privfs"
)

// A node's credentials, in its data directory (0600): its key and the
// certificate naming its id, and the cluster CA. It gets them by joining with a one-time token (meta's join.go) and
// authenticates to meta with the certificate from then on; node.json,
// its id, is written last, so a node whose join did not complete is new.
const (
	keyFile  = "node.key"
	certFile = "node.crt"
	caFile   = "ca.crt"
)

// oldSecretFile is where an earlier version kept the cluster secret meta
// gave it at its join. A node needs it no more (its capability keys come
// from meta, docs/capkeys.md) and a copy on every node's disk is a copy
// to steal: removeOldSecret deletes it.
const oldSecretFile = "cluster.secret"

// credentials are what a joined node holds.
type credentials struct {
	id                     ids.NodeID
	keyPEM, certPEM, caPEM []byte
}

// tlsConfig is the node's TLS configuration towards meta.
func (c *credentials) tlsConfig() (*tls.Config, error) {
	return pki.NodeConfig(c.caPEM, c.certPEM, c.keyPEM)
}

// loadCredentials reads a joined node's credentials; ok is false for a
// node that has not joined, or has an id (node.json) but lost its
// credentials or predates them (it may join again, keeping its id).
func loadCredentials(dir string, id ids.NodeID) (c credentials, ok bool, err error) {
	read := func(name string) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = os.ReadFile(filepath.Join(dir, name))
		return b
	}
	c.keyPEM, c.certPEM, c.caPEM = read(keyFile), read(certFile), read(caFile)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return c, false, nil
	case err != nil:
		return c, false, fmt.Errorf("node: reading credentials: %w", err)
	case id == 0:
		return c, false, fmt.Errorf("node: %s has credentials but no %s: it did not finish joining; use a fresh data directory", dir, identityFile)
	}
	if err := c.check(id); err != nil {
		return c, false, fmt.Errorf("node: credentials in %s: %w", dir, err)
	}
	c.id = id
	return c, true, nil
}

// check verifies that the certificate belongs to the key, chains to the
// CA and names node id.
func (c *credentials) check(id ids.NodeID) error {
	if _, err := tls.X509KeyPair(c.certPEM, c.keyPEM); err != nil {
		return fmt.Errorf("certificate and key: %w", err)
	}
	cert, err := pki.ParseCert(c.certPEM)
	if err != nil {
		return fmt.Errorf("node certificate: %w", err)
	}
	pool, err := pki.PoolFromPEM(c.caPEM)
	if err != nil {
		return err
	}
	_, err = pki.VerifyNode([]*x509.Certificate{cert}, pool, x509.ExtKeyUsageClientAuth, id)
	return err
}

// join has meta admit this new node with a join token: over a TLS
// connection verified against the CA the token pins, it sends a
// certificate request and gets its id, certificate and the CA, which it
// saves. It retries while meta cannot be
// reached, until ctx ends; a refusal is final.
func join(ctx context.Context, dir, metaAddr, token string, id, want ids.NodeID, log *slog.Logger) (credentials, error) {
	var c credentials
	tok, err := jointoken.Parse(token)
	if err != nil {
		return c, fmt.Errorf("node: --join: %w", err)
	}
	keyPEM, csr, err := pki.NewNodeKey()
	if err != nil {
		return c, fmt.Errorf("node: %w", err)
	}
	mc := metaapi.NewClient(metaAddr, "", pki.JoinConfig(tok.Pin))
	defer mc.Close()
	var resp metaapi.JoinResp
	backoff := 100 * time.Millisecond
	for {
		err = mc.Call(ctx, metaapi.OpJoin, metaapi.JoinReq{Token: token, CSR: csr, ID: id, Want: want}, &resp)
		var me *metaapi.Error
		if err == nil || errors.As(err, &me) || errors.As(err, new(*metaapi.TLSError)) {
			break
		}
		log.Warn("joining the cluster", "meta", metaAddr, "err", err)
		select {
		case <-ctx.Done():
			return c, fmt.Errorf("node: joining the cluster at %s: %w", metaAddr, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	if err != nil {
		return c, fmt.Errorf("node: joining the cluster at %s: %w", metaAddr, err)
	}
	if want != 0 && id == 0 && resp.ID != want {
		return c, fmt.Errorf("node: asked for id %v, meta gave id %v", want, resp.ID)
	}
	if id != 0 && resp.ID != id {
		return c, fmt.Errorf("node: joining again as node %v, meta gave id %v", id, resp.ID)
	}
	c = credentials{id: resp.ID, keyPEM: keyPEM, certPEM: []byte(resp.Cert), caPEM: []byte(resp.CA)}
	if ca, err := pki.ParseCert(c.caPEM); err != nil || pki.Fingerprint(ca) != tok.Pin {
		return c, fmt.Errorf("node: joining: meta sent a CA the token does not pin")
	}
	if err := c.check(resp.ID); err != nil {
		return c, fmt.Errorf("node: joining: meta sent a bad certificate: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{keyFile, c.keyPEM}, {certFile, c.certPEM}, {caFile, c.caPEM}} {
		if err := privfs.WriteFile(filepath.Join(dir, f.name), f.data); err != nil {
			return c, fmt.Errorf("node: saving credentials: %w", err)
		}
	}
	if id == 0 {
		if err := saveIdentity(dir, c.id); err != nil {
			return c, err
		}
	}
	log.Info("joined the cluster", "node", c.id, "meta", metaAddr)
	return c, nil
}

// removeOldSecret deletes the cluster secret an earlier version saved in
// dir, saying so.
func removeOldSecret(dir string, log *slog.Logger) error {
	err := os.Remove(filepath.Join(dir, oldSecretFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("node: removing the cluster secret an earlier version saved: %w", err)
	}
	log.Info("removed the cluster secret an earlier version saved: a node no longer needs it", "file", filepath.Join(dir, oldSecretFile))
	return nil
}

// Joined reports whether the node with data directory dir has joined a
// cluster (so it needs no join token to start), and its id if it has
// one: a node with an id that has not joined needs a token for that id
// (`sluice join-token --node`).
func Joined(dir string) (bool, ids.NodeID) {
	id, err := loadIdentity(dir)
	if err != nil || id == 0 {
		return false, 0
	}
	_, err = os.Stat(filepath.Join(dir, certFile))
	return err == nil, id
}

// fabricTLS sets fo up for --fabric-tls: the node serves its fabric
// with its certificate, and accepts a peer it dials (to forward) only
// with a certificate naming a node its cluster map places at the
// address dialled: the node the layout named.
func (n *Node) fabricTLS(fo *fabric.Options) error {
	sc, err := pki.FabricServerConfig(n.creds.certPEM, n.creds.keyPEM)
	if err != nil {
		return fmt.Errorf("node: fabric TLS: %w", err)
	}
	roots, err := pki.PoolFromPEM(n.creds.caPEM)
	if err != nil {
		return fmt.Errorf("node: fabric TLS: %w", err)
	}
	fo.ServerTLS = sc
	fo.DialTLS = func(addr string) (*tls.Config, error) {
		var want []ids.NodeID
		if m := n.peers.Load(); m != nil {
			for id, a := range *m {
				if a == addr {
					want = append(want, id)
				}
			}
		}
		if len(want) == 0 {
			return nil, fmt.Errorf("no node at %s in the cluster map", addr)
		}
		return pki.FabricDialConfig(roots, want...), nil
	}
	return nil
}
