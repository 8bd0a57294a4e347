package meta

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/jointoken"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// Joining: an admin creates a one-time join token (NewJoinToken); a new
// storage node presents it over TLS with a certificate request (Join),
// and gets a new node id, a certificate naming it and the CA (never the
// cluster secret: docs/capkeys.md). Meta keeps only a hash of each token's secret, under
// j <token id:8>, until it is used or, expired, swept; using it deletes
// it in the same batch that hands out the node id, so a token joins
// exactly one node.

const pJoin = 'j'

// joinRec is a stored join token.
type joinRec struct {
	Hash    []byte     `json:"hash"`           // SHA-256 of the token's secret
	Expires int64      `json:"expires"`        // unix ns
	Node    ids.NodeID `json:"node,omitempty"` // the node it admits again; 0: a new node
}

func joinKey(id uint64) []byte {
	b := make([]byte, 9)
	b[0] = pJoin
	binary.BigEndian.PutUint64(b[1:], id)
	return b
}

// NewJoinToken creates a join token valid for ttl (0: an hour) for a
// new node, or with node, for that node to join again keeping its id.
func (s *Service) NewJoinToken(ttl time.Duration, node ids.NodeID) (metaapi.JoinTokenResp, error) {
	var out metaapi.JoinTokenResp
	if ttl == 0 {
		ttl = time.Duration(metaapi.DefaultJoinTTL)
	}
	if ttl < 0 || ttl > time.Duration(metaapi.MaxJoinTTL) {
		return out, metaapi.Errorf(metaapi.EINVAL, "join token lifetime %s: must be positive and at most %s", ttl, time.Duration(metaapi.MaxJoinTTL))
	}
	tok, err := jointoken.New(pki.Fingerprint(s.ca.Cert))
	if err != nil {
		return out, err
	}
	err = s.update(func(tx *txn) error {
		live := 0
		var expired [][]byte
		p := []byte{pJoin}
		err := scan(tx.b, p, prefixEnd(p), func(k, v []byte) (bool, error) {
			var r joinRec
			if json.Unmarshal(v, &r) != nil || r.Expires <= tx.now {
				expired = append(expired, append([]byte(nil), k...))
			} else {
				live++
			}
			return true, nil
		})
		if err != nil {
			return err
		}
		for _, k := range expired { // swept here
			if err := tx.b.Delete(k, nil); err != nil {
				return err
			}
		}
		if node != 0 && node >= tx.ctr.NextNode {
			return metaapi.Errorf(metaapi.EINVAL, "node %v was never admitted to this cluster", node)
		}
		if live >= metaapi.MaxJoinTokens {
			return metaapi.Errorf(metaapi.EINVAL, "%d join tokens outstanding, the most meta keeps: use or let some expire first", live)
		}
		h := tok.Hash()
		out = metaapi.JoinTokenResp{Token: tok.String(), Expires: tx.now + int64(ttl)}
		return tx.setJSON(joinKey(tok.ID), &joinRec{Hash: h[:], Expires: out.Expires, Node: node})
	})
	if err != nil {
		return metaapi.JoinTokenResp{}, err
	}
	s.log.Info("join token created", "expires", time.Unix(0, out.Expires).UTC().Format(time.RFC3339), "for_node", node)
	return out, nil
}

// errNoToken is the answer for a token meta does not hold, whether
// never issued, already used or forged: which one is nobody's business.
var errNoToken = metaapi.Errorf(metaapi.EAUTH, "join token not valid: already used, or not issued by this cluster")

// maxJoinBody bounds a Join request: a token and a certificate request
// of at most metaapi.MaxCSRBytes, base64 in JSON. Anyone may send one,
// so it is refused before a large body is even read.
const maxJoinBody = 16 << 10

// Join admits a new storage node holding a valid join token. A refused
// join changes nothing: the token stays as it was and no id is used.
// Anyone may call it, so a token meta does not hold is refused under the
// read lock, before the certificate request's signature is checked or
// the write lock taken; the check is done again in the update.
func (s *Service) Join(req metaapi.JoinReq) (metaapi.JoinResp, error) {
	var out metaapi.JoinResp
	tok, err := jointoken.Parse(req.Token)
	if err != nil {
		return out, metaapi.Errorf(metaapi.EAUTH, "%v", err)
	}
	if tok.Pin != pki.Fingerprint(s.ca.Cert) {
		return out, metaapi.Errorf(metaapi.EAUTH, "join token is for another cluster (it pins another CA)")
	}
	if req.Want > metaapi.MaxNodeID || req.Want != 0 && req.ID != 0 {
		return out, metaapi.Errorf(metaapi.EINVAL, "node id %v asked for: a new node may ask for an id from 1 to %d", req.Want, metaapi.MaxNodeID)
	}
	if len(req.CSR) > metaapi.MaxCSRBytes {
		return out, metaapi.Errorf(metaapi.EINVAL, "certificate request of %d bytes, at most %d", len(req.CSR), metaapi.MaxCSRBytes)
	}
	err = s.read(func(v view) error {
		_, err := checkJoinToken(v.reader(), tok, req.ID, s.opts.Now().UnixNano())
		return err
	})
	if err != nil {
		return out, err
	}
	csr, err := pki.CheckCSR(req.CSR)
	if err != nil {
		return out, metaapi.Errorf(metaapi.EINVAL, "%v", err)
	}
	err = s.update(func(tx *txn) error {
		r, err := checkJoinToken(tx.b, tok, req.ID, tx.now)
		if err != nil {
			return err
		}
		id := r.Node
		switch {
		case id == 0 && req.Want != 0:
			if err := s.idTaken(req.Want); err != nil {
				return err
			}
			id = req.Want
			tx.ctr.NextNode = max(tx.ctr.NextNode, id+1) // never handed out by itself
		case id == 0:
			id = tx.ctr.NextNode
			tx.ctr.NextNode++
		}
		cert, err := s.ca.SignNode(csr, id)
		if err != nil {
			return err
		}
		if err := tx.b.Delete(joinKey(tok.ID), nil); err != nil {
			return err
		}
		if err := s.recordNodeCert(tx, id, cert); err != nil {
			return err
		}
		out = metaapi.JoinResp{ID: id, Cert: string(cert), CA: string(s.ca.CertPEM)}
		return nil
	})
	if err != nil {
		return metaapi.JoinResp{}, err
	}
	s.log.Info("storage node joined", "node", out.ID, "again", req.ID != 0)
	return out, nil
}

// idTaken refuses a new node id another node has: one meta knows as a
// member or has a certificate of (a removed node's may be taken again).
// Needs s.mu.
func (s *Service) idTaken(id ids.NodeID) error {
	r, hasCert := s.nodeCerts[id]
	if s.nodes[id] != nil || hasCert && !r.Removed {
		return metaapi.Errorf(metaapi.EEXIST, "node id %v is taken by another node of this cluster: choose another --id (sluice status lists them)", id)
	}
	return nil
}

// checkJoinToken returns the stored token tok names, if its secret
// matches, it has not expired and it admits node id (0: a new node).
func checkJoinToken(r pebble.Reader, tok jointoken.Token, id ids.NodeID, now int64) (joinRec, error) {
	var rec joinRec
	found, err := getJSON(r, joinKey(tok.ID), &rec)
	if err != nil {
		return rec, err
	}
	h := tok.Hash()
	if !found || subtle.ConstantTimeCompare(rec.Hash, h[:]) != 1 {
		return rec, errNoToken
	}
	if rec.Expires <= now {
		return rec, metaapi.Errorf(metaapi.EAUTH, "join token expired at %s: create a new one with `sluice join-token`",
			time.Unix(0, rec.Expires).UTC().Format(time.RFC3339))
	}
	switch {
	case rec.Node != id && rec.Node == 0:
		return rec, metaapi.Errorf(metaapi.EAUTH, "join token admits a new node, not node %v: create one with `sluice join-token --node %v`", id, id)
	case rec.Node != id:
		return rec, metaapi.Errorf(metaapi.EAUTH, "join token admits node %v only", rec.Node)
	}
	return rec, nil
}
