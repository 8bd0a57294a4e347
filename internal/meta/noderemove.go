package meta

import (
	"cmp"
	"encoding/json"
	"fmt"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Removing a node for good (`sluice node remove`): one drained, or down
// with its data repaired elsewhere. Its membership record and pending
// deletions go, its certificate is revoked, placements and status no
// longer know it. A node still placed in a chunk or stripe group is
// refused, naming how many of them it holds the only copy (or one of the
// last K units) of.

// holdings is what a node holds as the chunk records place it.
type holdings struct {
	members int64 // chunks and stripe units placed on it
	sole    int64 // ... of which no other member can make up for
}

// nodeHoldings counts what chunk records place on node, a page of
// records at a time like the repair scan. A member is sole when the
// other members up cannot give every byte of it (intactCopies below the
// policy's minimum, 1 copy or K units).
func (s *Service) nodeHoldings(node ids.NodeID) (holdings, error) {
	var h holdings
	policies := map[ids.Ino]*metaapi.Policy{}
	page := cmp.Or(s.scanPage, 4096)
	cursor := []byte{pChunk}
	var err error
	for cursor != nil && err == nil {
		err = s.read(func(v view) error {
			others := map[ids.NodeID]bool{}
			for id, m := range s.nodes {
				others[id] = id != node && m.state == metaapi.NodeUp
			}
			n := 0
			lower := cursor
			cursor = nil
			return scan(v.r, lower, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
				if n == page {
					cursor = append([]byte(nil), k...)
					return false, nil
				}
				n++
				var rec chunkRec
				if len(k) != 17 {
					return true, nil
				}
				if err := json.Unmarshal(val, &rec); err != nil {
					return false, fmt.Errorf("decoding chunk record %q: %w", k, err)
				}
				if !containsNode(rec.Nodes, node) {
					return true, nil
				}
				ino := ids.Ino(beUint64(k[1:]))
				pol, ok := policies[ino]
				if !ok {
					if in, err := v.inode(ino); err == nil {
						pol = in.Policy
					}
					policies[ino] = pol
				}
				minimum := 1
				if pol != nil && pol.EC != nil {
					minimum = pol.EC.Data
				}
				h.members++
				if intactCopies(&rec, others, nil) < minimum {
					h.sole++
				}
				return true, nil
			})
		})
	}
	return h, err
}

func containsNode(nodes []ids.NodeID, n ids.NodeID) bool {
	for _, m := range nodes {
		if m == n {
			return true
		}
	}
	return false
}

// removable decides whether a node with these holdings may be removed.
func removable(node ids.NodeID, up, draining bool, h holdings) error {
	switch {
	case up && !draining:
		return metaapi.Errorf(metaapi.EPERM, "node %v is up and not draining: drain it first (sluice node drain %v)", node, node)
	case h.sole > 0:
		return metaapi.Errorf(metaapi.EPERM, "node %v still holds the only copy (or one of the last units) of %d chunks and stripe groups; drain it first", node, h.sole)
	case h.members > 0:
		return metaapi.Errorf(metaapi.EPERM, "node %v is still placed in %d chunks and stripe groups (their data is on other nodes too): wait until the drain or repair has moved them (sluice status, PLACED)", node, h.members)
	}
	return nil
}

// RemoveNode takes a node out of the cluster for good (see
// metaapi.RemoveNodeReq).
func (s *Service) RemoveNode(req metaapi.RemoveNodeReq) error { return s.removeNode(req, nil) }

// removeNode is RemoveNode; tests pass counted, which runs between the
// count of the node's holdings and the transaction that removes it.
func (s *Service) removeNode(req metaapi.RemoveNodeReq, counted func()) error {
	for attempt := 0; ; attempt++ {
		s.mu.RLock()
		m := s.nodes[req.Node]
		epoch := s.ctr.Epoch
		s.mu.RUnlock()
		if m == nil {
			return metaapi.Errorf(metaapi.ENOENT, "no storage node %v", req.Node)
		}
		h, err := s.nodeHoldings(req.Node)
		if err != nil {
			return err
		}
		if counted != nil {
			counted()
		}
		changed := false
		err = s.update(func(tx *txn) error {
			// A node silent past the timeout but not yet marked down is
			// still chosen by placement: mark it down first, so a chunk
			// placed on it since the count makes the count run again.
			s.sweepTx(tx, 0)
			m := s.nodes[req.Node]
			if m == nil {
				return metaapi.Errorf(metaapi.ENOENT, "no storage node %v", req.Node)
			}
			if err := removable(req.Node, s.upAt(tx.now)(m), m.rec.Draining, h); err != nil {
				return err
			}
			if tx.ctr.Epoch != epoch {
				// A node changed state meanwhile: what the count saw
				// may be stale. Count again.
				changed = true
				return nil
			}
			return s.removeNodeTx(tx, req.Node)
		})
		if err != nil || !changed {
			if err == nil {
				s.log.Warn("storage node removed from the cluster", "node", req.Node)
			}
			return err
		}
		if attempt == 3 {
			return metaapi.Errorf(metaapi.EAGAIN, "nodes keep changing state: try removing node %v again", req.Node)
		}
	}
}

// removeNodeTx drops node's membership and pending deletions and revokes
// its certificate, in tx.
func (s *Service) removeNodeTx(tx *txn, node ids.NodeID) error {
	if err := tx.b.Delete(nodeKey(node), nil); err != nil {
		return err
	}
	p := gcPrefix(node)
	if err := tx.b.DeleteRange(p, prefixEnd(p), nil); err != nil {
		return err
	}
	if err := s.setNodeCert(tx, node, nodeCertRec{Revoked: true, Removed: true, Since: tx.now}); err != nil {
		return err
	}
	tx.ctr.Epoch++
	tx.after = append(tx.after, func() { delete(s.nodes, node) })
	return nil
}
