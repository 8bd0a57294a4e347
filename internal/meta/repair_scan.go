package meta

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/repairplan"
	"golang.org/x/time/rate"
)

// maxCorruptReports bounds the chunks with corrupt copies meta holds
// reports of before the next scan.
const maxCorruptReports = 1024

// noteCorrupt records reports of corrupt copies for the next scan; from
// is the reporting node (0: a client), which copies naming no node are of.
func (q *repairQueue) noteCorrupt(from ids.NodeID, reports []metaapi.CorruptCopy) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, r := range reports {
		node := cmp.Or(r.Node, from)
		m := q.corrupt[r.Chunk]
		if node == 0 || m == nil && len(q.corrupt) >= maxCorruptReports {
			continue
		}
		if m == nil {
			m = map[ids.NodeID]extent.List{}
			q.corrupt[r.Chunk] = m
		}
		old, seen := m[node]
		m[node] = mergeBad(old, seen, r.Bad)
	}
}

// mergeBad adds newly reported bad bytes to what is known of a copy
// (known: whether anything is); a nil result means not known which.
func mergeBad(old extent.List, known bool, add extent.List) extent.List {
	switch {
	case !known:
		return slices.Clone(add)
	case old == nil || add == nil:
		return nil
	}
	if u := old.Union(add); len(u) <= metaapi.MaxBadExtents {
		return u
	}
	return nil // too many to list: bad throughout, as far as meta knows
}

// repairScanner scans the chunk records every scanEvery (or grace
// period, if shorter): for the tallies, and for grace periods ending.
func (s *Service) repairScanner() {
	defer s.wg.Done()
	const scanEvery = 5 * time.Second
	t := time.NewTicker(min(scanEvery, s.opts.RepairGrace))
	defer t.Stop()
	for {
		// Just after meta started, nodes not heard from yet are not
		// down: wait for them (repair_block.go), checking often.
		every := t.C
		if s.waitingForNodes() == nil {
			s.scanForRepair()
		} else {
			every = time.After(min(s.opts.HeartbeatInterval, 250*time.Millisecond))
		}
		select {
		case <-s.stop:
			return
		case <-every:
		}
	}
}

// scanForRepair walks every chunk record, queues those below their
// policy whose lost members may be replaced (down past the grace period)
// or whose reconciliation is unfinished, and counts redundancy.
func (s *Service) scanForRepair() {
	now := s.opts.Now()
	var tally metaapi.RedundancyTally
	var due []*repairJob
	s.repairs.mu.Lock()
	reported := s.repairs.corrupt
	s.repairs.corrupt = map[ids.ChunkID]map[ids.NodeID]extent.List{}
	stuck := maps.Clone(s.repairs.stuck)
	s.repairs.mu.Unlock()
	blocked := blockedTally{}
	type finding struct {
		ref    chunkRef
		id     ids.ChunkID
		copies map[ids.NodeID]extent.List
	}
	var found []finding
	members := map[ids.NodeID]int64{}
	policies := map[ids.Ino]*metaapi.Policy{}
	// A page of records at a time, each under its own read lock, so that
	// a large namespace does not hold off mutations for the whole scan.
	page := cmp.Or(s.scanPage, 4096)
	cursor := []byte{pChunk}
	var err error
	for cursor != nil && err == nil {
		err = s.read(func(v view) error {
			state := map[ids.NodeID]bool{} // up
			past := map[ids.NodeID]bool{}  // down past the grace period, or draining: its members move
			draining := map[ids.NodeID]bool{}
			for id, m := range s.nodes {
				draining[id] = m.rec.Draining
				state[id] = m.state == metaapi.NodeUp
				past[id] = m.rec.Draining || m.state != metaapi.NodeUp && now.Sub(s.downSince(m)) >= s.opts.RepairGrace
				if _, ok := members[id]; !ok {
					members[id] = 0
				}
			}
			n := 0
			lower := cursor
			cursor = nil
			marks, err := newKeyCursor(v.r, pDegraded, lower[1:])
			if err != nil {
				return err
			}
			err = scan(v.r, lower, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
				if n == page {
					cursor = append([]byte(nil), k...)
					return false, nil
				}
				n++
				if len(k) != 17 {
					return true, nil
				}
				var rec chunkRec
				if err := json.Unmarshal(val, &rec); err != nil {
					return false, fmt.Errorf("decoding chunk record %q: %w", k, err)
				}
				ino := ids.Ino(beUint64(k[1:]))
				pol, ok := policies[ino]
				if !ok {
					in, err := v.inode(ino)
					if err != nil {
						return true, nil // checked elsewhere
					}
					pol = in.Policy
					policies[ino] = pol
				}
				minimum := 1
				if pol != nil && pol.EC != nil {
					minimum = pol.EC.Data
				}
				replaceable := false
				for _, n := range rec.Nodes {
					members[n]++
					replaceable = replaceable || past[n]
				}
				ref := chunkRef{ino, int64(beUint64(k[9:]))}
				if err := stuck[ref]; err != nil {
					for _, n := range rec.Nodes {
						if draining[n] {
							blocked.add(n, err)
						}
					}
				}
				copies := reported[rec.ID]
				if len(copies) > 0 {
					found = append(found, finding{ref, rec.ID, copies})
				}
				live := intactCopies(&rec, state, copies)
				// A group a write left with units at different versions,
				// or a reconciliation not finished, is short of its
				// policy whatever the state of its nodes, and is queued.
				degraded := pol != nil && pol.EC != nil && marks.has(k[1:])
				if degraded || rec.Reconciling {
					live = min(live, len(rec.Nodes)-1)
				}
				tally.Count(pol != nil && pol.EC != nil, live, len(rec.Nodes), minimum)
				if replaceable || rec.Reconciling || degraded || len(rec.Corrupt) > 0 {
					due = append(due, &repairJob{ref: ref, margin: repairplan.Margin(live, minimum)})
				}
				return true, nil
			})
			return errors.Join(err, marks.close())
		})
	}
	if err != nil {
		s.log.Warn("scanning chunks for repair", "err", err)
		return
	}
	for _, f := range found {
		if err := s.markCorrupt(f.ref, f.id, f.copies); err != nil {
			s.log.Warn("recording a corrupt chunk copy", "chunk", f.id, "err", err)
			continue
		}
		s.log.Warn("copies with blocks failing their checksums; healing them", "ino", f.ref.ino, "index", f.ref.index, "chunk", f.id, "copies", f.copies)
		due = append(due, &repairJob{ref: f.ref})
	}
	s.repairs.mu.Lock()
	s.repairs.members = members
	s.repairs.blocked = blocked
	s.repairs.tallies = tally
	s.repairs.tallies.ScannedAt = now.UnixNano()
	s.repairs.mu.Unlock()
	for _, j := range due {
		s.repairs.add(j.ref, j.margin, false)
	}
}

// blockedTally counts, per draining node, its members repair cannot move
// by reason (at most maxBlockedWhy reasons a node; the rest are lumped).
type blockedTally map[ids.NodeID][]metaapi.Blocked

const maxBlockedWhy = 4

func (b blockedTally) add(n ids.NodeID, err error) {
	why := err.Error()
	l := b[n]
	for i := range l {
		if l[i].Why == why {
			l[i].Count++
			return
		}
	}
	if len(l) == maxBlockedWhy {
		l[maxBlockedWhy-1].Why = "for these and other reasons"
		l[maxBlockedWhy-1].Count++
		return
	}
	b[n] = append(l, metaapi.Blocked{Count: 1, Why: why})
}

// markCorrupt records that nodes hold corrupt copies of chunk id (with
// their bad bytes where said), if it is still ref and they are still its
// members.
func (s *Service) markCorrupt(ref chunkRef, id ids.ChunkID, copies map[ids.NodeID]extent.List) error {
	return s.update(func(tx *txn) error {
		key := chunkKey(ref.ino, ref.index)
		var rec chunkRec
		found, err := getJSON(tx.b, key, &rec)
		if err != nil || !found || rec.ID != id {
			return err
		}
		changed := false
		for n, bad := range copies {
			if !slices.Contains(rec.Nodes, n) {
				continue
			}
			old, known := rec.Bad[n]
			if !slices.Contains(rec.Corrupt, n) {
				rec.Corrupt, known, changed = append(rec.Corrupt, n), false, true
			} else if !known {
				continue // already bad throughout as far as meta knows
			}
			merged := mergeBad(old, known, bad)
			if merged == nil {
				delete(rec.Bad, n)
			} else {
				if rec.Bad == nil {
					rec.Bad = map[ids.NodeID]extent.List{}
				}
				rec.Bad[n] = merged
			}
			changed = true
		}
		if !changed {
			return nil
		}
		return tx.setJSON(key, &rec)
	})
}

// intactCopies is how many members of rec hold each byte intact, at the
// least: members up and not just placed, each counting where its bytes
// pass their checksums as far as meta knows (recorded and newly reported
// bad blocks; a corrupt member whose bad blocks are unknown counts for
// nothing). A chunk whose copies each have a different bad block is thus
// reduced, not lost.
func intactCopies(rec *chunkRec, up map[ids.NodeID]bool, reported map[ids.NodeID]extent.List) int {
	bad := make([]extent.List, len(rec.Nodes))
	absent := make([]bool, len(rec.Nodes))
	for i, n := range rec.Nodes {
		absent[i] = !up[n] || slices.Contains(rec.Fresh, n)
		if slices.Contains(rec.Corrupt, n) {
			l, known := rec.Bad[n]
			absent[i] = absent[i] || !known
			bad[i] = l
		}
		if r, ok := reported[n]; ok {
			absent[i] = absent[i] || r == nil
			bad[i] = bad[i].Union(r)
		}
	}
	return extent.MinGood(bad, absent)
}

// ReportCorrupt takes a client's report that a copy it read holds blocks
// failing their checksums. The read capability the client used proves it
// may read the chunk and that the node holds a member of it; the copy is
// then healed as one a scrub found (a false report costs the node one
// verification of its copy).
func (s *Service) ReportCorrupt(client ids.ClientID, req metaapi.ReportCorruptReq) error {
	if err := req.Copy.Validate(); err != nil {
		return err
	}
	var c capability.Capability
	if _, err := s.keys.Open(req.Cap, s.opts.Now().UnixNano(), &c); err != nil {
		return metaapi.Errorf(metaapi.EACCES, "reporting corrupt chunk %v: %v", req.Copy.Chunk, err)
	}
	switch {
	case c.Client != client || c.Rights&capability.Read == 0:
		return metaapi.Errorf(metaapi.EACCES, "reporting corrupt chunk %v: not this client's read capability", req.Copy.Chunk)
	case c.Chunk != req.Copy.Chunk || req.Copy.Node == 0 || c.RankOf(req.Copy.Node) < 0:
		return metaapi.Errorf(metaapi.EINVAL, "reporting corrupt chunk %v on node %v: the capability is for chunk %v on nodes %v",
			req.Copy.Chunk, req.Copy.Node, c.Chunk, c.ReplicaList())
	}
	if !s.reportLimits.allow(client, s.opts.Now()) {
		return metaapi.Errorf(metaapi.EAGAIN, "client %v reports corrupt copies faster than %v a second: report later", client, clientReportRate)
	}
	s.log.Warn("a client read blocks failing their checksums", "client", client, "chunk", req.Copy.Chunk, "node", req.Copy.Node, "bad", req.Copy.Bad)
	s.repairs.noteCorrupt(0, []metaapi.CorruptCopy{req.Copy})
	return nil
}

// Each report has a node read a whole copy to heal it, so one client's
// reports are rate-limited: a client cannot make the nodes scrub on its
// say-so faster than this.
const (
	clientReportRate  = 10 // a second
	clientReportBurst = 100
	maxReportLimiters = 4096
)

// reportLimits are the clients' report rate limiters.
type reportLimits struct {
	mu sync.Mutex
	m  map[ids.ClientID]*rate.Limiter
}

func (r *reportLimits) allow(client ids.ClientID, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.m[client]
	if l == nil {
		if r.m == nil || len(r.m) >= maxReportLimiters {
			r.m = map[ids.ClientID]*rate.Limiter{} // forgetting only ever allows more
		}
		l = rate.NewLimiter(clientReportRate, clientReportBurst)
		r.m[client] = l
	}
	return l.AllowN(now, 1)
}
