package meta

import (
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// Node certificates: a certificate of the cluster CA naming node n is
// not enough for meta to take a caller for node n; it must also be the
// one certificate meta records as n's current one, under C <node:4>.
// Join records the certificate it issues, so joining again (`sluice
// join-token --node n`) revokes the certificate n had; `sluice node
// revoke n` records that n has none, so no certificate of n works until
// it joins again. A node id with no record (a cluster from before
// records were kept) has the first certificate meta sees for it
// recorded.

const pNodeCert = 'C'

// nodeCertRec is a node id's current certificate.
type nodeCertRec struct {
	// Fingerprint is pki.Fingerprint of the certificate; empty once
	// the node's identity was revoked.
	Fingerprint string `json:"fingerprint,omitempty"`
	Since       int64  `json:"since"`             // unix ns: when recorded (or revoked)
	Revoked     bool   `json:"revoked,omitempty"` // `sluice node revoke`
	// Removed: `sluice node remove`; its id may be chosen again.
	Removed bool `json:"removed,omitempty"`
}

func nodeCertKey(id ids.NodeID) []byte {
	b := make([]byte, 5)
	b[0] = pNodeCert
	binary.BigEndian.PutUint32(b[1:], uint32(id))
	return b
}

// admits decides whether the certificate with fingerprint fp may act as
// node id, whose record is r.
func (r nodeCertRec) admits(id ids.NodeID, fp string) error {
	at := time.Unix(0, r.Since).UTC().Format(time.RFC3339)
	switch {
	case r.Revoked:
		return metaapi.Errorf(metaapi.EAUTH, "node %v's identity was revoked at %s (sluice node revoke): its certificates are refused; it may join again with a token from `sluice join-token --node %v`", id, at, id)
	case r.Fingerprint != fp:
		return metaapi.Errorf(metaapi.EAUTH, "certificate for node %v was replaced at %s; this one is revoked", id, at)
	}
	return nil
}

// loadNodeCerts reads the records at open.
func (s *Service) loadNodeCerts() error {
	s.nodeCerts = make(map[ids.NodeID]nodeCertRec)
	return scan(s.db, []byte{pNodeCert}, []byte{pNodeCert + 1}, func(k, v []byte) (bool, error) {
		var r nodeCertRec
		if len(k) != 5 {
			return true, nil
		}
		if err := json.Unmarshal(v, &r); err != nil {
			return false, err
		}
		s.nodeCerts[ids.NodeID(binary.BigEndian.Uint32(k[1:]))] = r
		return true, nil
	})
}

// recordNodeCert makes certPEM node id's only certificate, in tx.
func (s *Service) recordNodeCert(tx *txn, id ids.NodeID, certPEM []byte) error {
	cert, err := pki.ParseCert(certPEM)
	if err != nil {
		return err
	}
	return s.setNodeCert(tx, id, nodeCertRec{Fingerprint: pki.Fingerprint(cert), Since: tx.now})
}

func (s *Service) setNodeCert(tx *txn, id ids.NodeID, r nodeCertRec) error {
	if err := tx.setJSON(nodeCertKey(id), &r); err != nil {
		return err
	}
	tx.after = append(tx.after, func() { s.nodeCerts[id] = r })
	return nil
}

// checkNodeCert refuses cert (verified by TLS, naming node id) unless it
// is id's recorded certificate; one for an id with no record is recorded.
func (s *Service) checkNodeCert(id ids.NodeID, cert *x509.Certificate) error {
	fp := pki.Fingerprint(cert)
	s.mu.RLock()
	r, ok := s.nodeCerts[id]
	s.mu.RUnlock()
	if ok {
		return r.admits(id, fp)
	}
	recorded := false
	err := s.update(func(tx *txn) error {
		if r, ok := s.nodeCerts[id]; ok { // recorded meanwhile
			return r.admits(id, fp)
		}
		recorded = true
		return s.setNodeCert(tx, id, nodeCertRec{Fingerprint: fp, Since: tx.now})
	})
	if err == nil && recorded {
		s.log.Info("recorded the certificate of a node joined before meta kept them", "node", id, "fingerprint", fp)
	}
	return err
}

// RevokeNode retires node id's identity: every certificate naming it is
// refused from now on, and meta takes it for down at once (its data is
// repaired elsewhere after the repair grace, as for any down node). It
// may join again with a token from `sluice join-token --node`.
func (s *Service) RevokeNode(req metaapi.RevokeNodeReq) error {
	err := s.update(func(tx *txn) error {
		if req.Node == 0 || req.Node >= tx.ctr.NextNode {
			return metaapi.Errorf(metaapi.ENOENT, "node %v was never admitted to this cluster", req.Node)
		}
		if r, ok := s.nodeCerts[req.Node]; ok && r.Revoked {
			return nil
		}
		if err := s.setNodeCert(tx, req.Node, nodeCertRec{Revoked: true, Since: tx.now}); err != nil {
			return err
		}
		if m := s.nodes[req.Node]; m != nil && m.state == metaapi.NodeUp {
			tx.ctr.Epoch++
			tx.after = append(tx.after, func() { m.state = metaapi.NodeDown })
		}
		return nil
	})
	if err == nil {
		s.log.Warn("storage node's identity revoked: its certificates are refused", "node", req.Node)
	}
	return err
}
