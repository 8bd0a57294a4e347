package meta

import (
	"encoding/binary"
	"net"
	"slices"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Membership: storage nodes register once (getting a persistent id),
// then heartbeat. A node is up while heartbeats keep arriving and down
// once none has arrived for NodeTimeout; every change of a node's state,
// address or domain, and every new node, bumps the cluster epoch, which is
// persisted and stamped into capabilities. After a meta restart every
// known node starts down and comes up with its first heartbeat: liveness
// is never taken on trust from before the restart.

// maxDeletePerHeartbeat bounds the chunk deletions handed to a node per
// heartbeat.
const maxDeletePerHeartbeat = 1024

// tombstoneSlack is how much longer than a capability's lifetime nodes
// keep a deleted chunk's tombstone: for meta's clock stepping back
// between minting and deleting. (Nodes compare both a capability's
// expiry and a tombstone's end with their own clock, so skew between a
// node and meta does not matter.)
const tombstoneSlack = time.Minute

// maxDeletedAcks bounds the acknowledgements one heartbeat may carry.
const maxDeletedAcks = 1 << 16

// member is a storage node as meta tracks it.
type member struct {
	rec   nodeRec
	state metaapi.NodeState
	heard bool // heard from since this process started
	// pending is the bytes meta placed on the node since its last report
	// of its free space (space.go).
	pending int64
}

func (m *member) info() metaapi.NodeInfo {
	return metaapi.NodeInfo{
		ID: m.rec.ID, Addr: m.rec.Addr, Domain: m.rec.Domain, State: m.state,
		Capacity: m.rec.Capacity, Used: m.rec.Used, Free: m.rec.Free, Chunks: m.rec.Chunks,
		Reclaimable: m.rec.Reclaimable, Disk: m.rec.Disk, FSSize: m.rec.FSSize,
		LastHeartbeat: m.rec.LastHeartbeat, Draining: m.rec.Draining, Members: -1,
	}
}

// nodeInfosLocked returns every node sorted by id. Needs s.mu.
func (s *Service) nodeInfosLocked() []metaapi.NodeInfo {
	out := make([]metaapi.NodeInfo, 0, len(s.nodes))
	for _, m := range s.nodes {
		in := m.info()
		in.Full = s.fullLocked(m)
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b metaapi.NodeInfo) int { return int(a.ID) - int(b.ID) })
	return out
}

// addrsLocked returns the nodes' current addresses. Needs s.mu.
func (s *Service) addrsLocked() map[ids.NodeID]string {
	out := make(map[ids.NodeID]string, len(s.nodes))
	for id, m := range s.nodes {
		out[id] = m.rec.Addr
	}
	return out
}

func validNodeAddr(addr string) error {
	if len(addr) > 256 {
		return metaapi.Errorf(metaapi.EINVAL, "node address of %d bytes", len(addr))
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return metaapi.Errorf(metaapi.EINVAL, "node address %q: %v", addr, err)
	}
	return nil
}

// addrInUse refuses node id taking addr while another node that is up
// holds it: a fabric dialler accepts the certificate of any node the
// cluster map places at the address it dials, so a node registering
// another's address could pass for it. A down node's address may be
// taken (a host rebuilt as a new node); the down node is then refused
// the address until the other goes down or it moves. up says whether a
// node is up (silent ones not yet marked down are not).
func addrInUse(nodes map[ids.NodeID]*member, id ids.NodeID, addr string, up func(*member) bool) error {
	for _, m := range nodes {
		if m.rec.ID != id && m.rec.Addr == addr && up(m) {
			return metaapi.Errorf(metaapi.EEXIST, "address %s is node %v's, which is up: node %v may not register it", addr, m.rec.ID, id)
		}
	}
	return nil
}

// Register records a storage node, assigning an id on its first start.
func (s *Service) Register(req metaapi.RegisterReq) (metaapi.RegisterResp, error) {
	var out metaapi.RegisterResp
	if err := validNodeAddr(req.Addr); err != nil {
		return out, err
	}
	if len(req.Domain) > 256 {
		return out, metaapi.Errorf(metaapi.EINVAL, "failure domain name of %d bytes", len(req.Domain))
	}
	if err := validUsage(req.Capacity, req.Used, req.Free, req.Reclaimable, req.Chunks, req.FSSize, req.Disk); err != nil {
		return out, err
	}
	err := s.update(func(tx *txn) error {
		s.sweepTx(tx, req.ID)
		id := req.ID
		old := s.nodes[id]
		switch {
		case id == 0:
			id = tx.ctr.NextNode
			tx.ctr.NextNode++
		case old == nil && id >= tx.ctr.NextNode:
			// A node that kept its id while meta's state was lost or
			// restored from an older copy: take it, and never hand the
			// id out again. (An id Join handed out is below NextNode.)
			s.log.Warn("registering node with an id meta does not know", "node", id, "addr", req.Addr)
			tx.ctr.NextNode = id + 1
		}
		if err := addrInUse(s.nodes, id, req.Addr, s.upAt(tx.now)); err != nil {
			return err
		}
		rec := nodeRec{
			ID: id, Addr: req.Addr, Domain: req.Domain,
			Capacity: req.Capacity, Used: req.Used, Free: req.Free, Chunks: req.Chunks,
			Reclaimable: req.Reclaimable, Disk: req.Disk, FSSize: req.FSSize, LastHeartbeat: tx.now,
		}
		if old != nil {
			rec.Draining = old.rec.Draining // an operator's decision outlives restarts
		}
		if old == nil || old.state != metaapi.NodeUp || old.rec.Addr != rec.Addr || old.rec.Domain != rec.Domain {
			tx.ctr.Epoch++
		}
		if err := tx.setJSON(nodeKey(id), &rec); err != nil {
			return err
		}
		tx.after = append(tx.after, func() {
			s.nodes[id] = &member{rec: rec, state: metaapi.NodeUp, heard: true}
			// A node (re)started: members that did not answer may now.
			// Under the lock, so nobody sees it up with stale verdicts.
			s.repairs.nodeBack()
			s.log.Info("storage node registered", "node", id, "addr", rec.Addr, "domain", rec.Domain, "epoch", tx.ctr.Epoch)
		})
		out = metaapi.RegisterResp{ID: id, Epoch: tx.ctr.Epoch, HeartbeatInterval: int64(s.opts.HeartbeatInterval),
			CapKeys: s.capKeysLocked(tx.now)}
		return nil
	})
	return out, err
}

// validUsage checks a node's report of its space (fsSize 0: not known).
func validUsage(capacity, used, free, reclaimable, chunks, fsSize int64, disk string) error {
	if capacity < 0 || used < 0 || free < 0 || chunks < 0 || reclaimable < 0 || fsSize < 0 {
		return metaapi.Errorf(metaapi.EINVAL, "negative capacity or usage")
	}
	if fsSize > 0 && fsSize < free {
		return metaapi.Errorf(metaapi.EINVAL, "%d bytes free on a file system of %d", free, fsSize)
	}
	if reclaimable > used || reclaimable > free {
		return metaapi.Errorf(metaapi.EINVAL, "%d bytes reclaimable of %d used, %d free", reclaimable, used, free)
	}
	return metaapi.ValidDiskID(disk)
}

// Heartbeat records that a node is alive, takes its usage and deletion
// acknowledgements, and hands back the cluster map and chunks to delete.
func (s *Service) Heartbeat(req metaapi.HeartbeatReq) (metaapi.HeartbeatResp, error) {
	var out metaapi.HeartbeatResp
	if req.Addr != "" {
		if err := validNodeAddr(req.Addr); err != nil {
			return out, err
		}
	}
	if err := validUsage(req.Capacity, req.Used, req.Free, req.Reclaimable, req.Chunks, req.FSSize, req.Disk); err != nil {
		return out, err
	}
	if len(req.Deleted) > maxDeletedAcks {
		return out, metaapi.Errorf(metaapi.EINVAL, "%d deletion acknowledgements, at most %d", len(req.Deleted), maxDeletedAcks)
	}
	if len(req.Corrupt) > metaapi.MaxCorruptCopies {
		return out, metaapi.Errorf(metaapi.EINVAL, "%d corrupt copies reported, at most %d", len(req.Corrupt), metaapi.MaxCorruptCopies)
	}
	for _, c := range req.Corrupt {
		if err := c.Validate(); err != nil {
			return out, err
		}
	}
	err := s.update(func(tx *txn) error {
		m := s.nodes[req.ID]
		if m == nil {
			return metaapi.Errorf(metaapi.ENOENT, "unknown storage node %d: register first", req.ID)
		}
		rec := m.rec
		rec.Capacity, rec.Used, rec.Free, rec.Chunks = req.Capacity, req.Used, req.Free, req.Chunks
		rec.Reclaimable, rec.Disk, rec.FSSize = req.Reclaimable, req.Disk, req.FSSize
		rec.LastHeartbeat = tx.now
		persist := false
		if req.Addr != "" && req.Addr != rec.Addr {
			if err := addrInUse(s.nodes, rec.ID, req.Addr, s.upAt(tx.now)); err != nil {
				return err
			}
			rec.Addr = req.Addr
			tx.ctr.Epoch++
			persist = true
		}
		if m.state != metaapi.NodeUp {
			tx.ctr.Epoch++
			persist = true
		}
		if persist {
			if err := tx.setJSON(nodeKey(rec.ID), &rec); err != nil {
				return err
			}
		}
		for _, c := range req.Deleted {
			if err := tx.b.Delete(gcKey(rec.ID, c), nil); err != nil {
				return err
			}
		}
		s.sweepTx(tx, rec.ID)
		p := gcPrefix(rec.ID)
		err := scan(tx.b, p, prefixEnd(p), func(k, v []byte) (bool, error) {
			id := ids.ChunkID(binary.BigEndian.Uint64(k[len(p):]))
			if len(v) == 8 {
				out.Gone = append(out.Gone, metaapi.GoneChunk{Chunk: id, Until: int64(binary.BigEndian.Uint64(v))})
			} else {
				out.Delete = append(out.Delete, metaapi.RetiredCopy{Chunk: id, Epoch: retiredEpoch(v)})
			}
			return len(out.Delete)+len(out.Gone) < maxDeletePerHeartbeat, nil
		})
		if err != nil {
			return err
		}
		wasUp := m.state == metaapi.NodeUp
		tx.after = append(tx.after, func() {
			// Its report counts what it holds now: what meta placed
			// before it is in there (or arrives within the margin).
			m.rec, m.state, m.heard, m.pending = rec, metaapi.NodeUp, true, 0
			if !wasUp {
				s.repairs.nodeBack()
				s.log.Info("storage node up", "node", rec.ID, "addr", rec.Addr, "epoch", tx.ctr.Epoch)
			}
			out.Nodes = s.nodeInfosLocked()
			out.Epoch = tx.ctr.Epoch
			out.CapKeys = s.capKeysLocked(tx.now)
		})
		return nil
	})
	if err == nil {
		s.repairs.noteCorrupt(req.ID, req.Corrupt)
		out.Inventory, out.Verify = s.inv.wanted(req.ID)
	}
	return out, err
}

// Sweep marks nodes that have been silent for NodeTimeout down, bumping
// the epoch. A background ticker calls it; Status and allocation call it
// first too, so a node's state never lags the clock.
func (s *Service) Sweep() {
	now := s.opts.Now().UnixNano()
	s.mu.RLock()
	due := false
	for _, m := range s.nodes {
		if s.silent(m, now) {
			due = true
			break
		}
	}
	s.mu.RUnlock()
	if !due {
		return
	}
	if err := s.update(func(tx *txn) error { s.sweepTx(tx, 0); return nil }); err != nil && err != errClosed {
		s.log.Error("marking silent nodes down", "err", err)
	}
}

// upAt says whether a node is up at now: marked so and not silent.
func (s *Service) upAt(now int64) func(*member) bool {
	return func(m *member) bool { return m.state == metaapi.NodeUp && !s.silent(m, now) }
}

func (s *Service) silent(m *member, now int64) bool {
	return m.state == metaapi.NodeUp && now-m.rec.LastHeartbeat > int64(s.opts.NodeTimeout)
}

// sweepTx does Sweep's work inside a mutation, leaving node except alone
// (it is being heard from in this very mutation).
func (s *Service) sweepTx(tx *txn, except ids.NodeID) {
	for _, m := range s.nodes {
		if m.rec.ID == except || !s.silent(m, tx.now) {
			continue
		}
		tx.ctr.Epoch++
		tx.after = append(tx.after, func() {
			m.state = metaapi.NodeDown
			s.log.Warn("storage node down", "node", m.rec.ID, "addr", m.rec.Addr,
				"silent_for", time.Duration(tx.now-m.rec.LastHeartbeat).String(), "epoch", tx.ctr.Epoch)
		})
	}
}

// Drain has everything moved off a node (see metaapi.DrainReq).
func (s *Service) Drain(req metaapi.DrainReq) error {
	if req.Who.UID != 0 {
		return metaapi.Errorf(metaapi.EPERM, "only root may drain a node")
	}
	err := s.update(func(tx *txn) error {
		m := s.nodes[req.Node]
		if m == nil {
			return metaapi.Errorf(metaapi.ENOENT, "no storage node %v", req.Node)
		}
		rec := m.rec
		if rec.Draining == !req.Cancel {
			return nil
		}
		rec.Draining = !req.Cancel
		tx.ctr.Epoch++
		if err := tx.setJSON(nodeKey(rec.ID), &rec); err != nil {
			return err
		}
		tx.after = append(tx.after, func() { m.rec.Draining = rec.Draining })
		return nil
	})
	if err == nil {
		s.log.Info("drain", "node", req.Node, "draining", !req.Cancel)
		s.repairs.poke()
	}
	return err
}

func (s *Service) sweeper() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sweep()
			s.SweepOrphans()
			s.SweepLocks()
			s.SweepTemps()
			s.tickCapKeys()
			s.admitPeers()
		}
	}
}

// placementError turns a placement failure into the caller's error. Just
// after a restart every node is down until its first heartbeat, so a
// shortage then is reported as EAGAIN (the client retries) rather than
// ENOSPC.
func (s *Service) placementError(err error) error {
	if !metaapi.IsCode(err, metaapi.ENOSPC) {
		return err
	}
	now := s.opts.Now()
	w := s.waitingForNodesLocked(now)
	if w == nil {
		return err
	}
	return metaapi.Errorf(metaapi.EAGAIN, "meta restarted %s ago and is waiting for %d storage nodes to report in (%v)",
		now.Sub(s.openedAt).Round(time.Millisecond), w.Known-w.Reported, err)
}

// Status reports the cluster map and object counts.
func (s *Service) Status() (metaapi.StatusResp, error) {
	s.Sweep()
	var out metaapi.StatusResp
	err := s.read(func(v view) error {
		out = metaapi.StatusResp{
			MetaAddr: s.metaAddr,
			Epoch:    s.ctr.Epoch,
			Nodes:    s.nodeInfosLocked(),
			Files:    s.ctr.Files,
			Dirs:     s.ctr.Dirs,
			Chunks:   s.ctr.Chunks,
		}
		out.Totals = metaapi.Totals(out.Nodes)
		out.Waiting = s.waitingForNodesLocked(s.opts.Now())
		out.Redundancy, out.Repair = s.repairStatus()
		var err error
		if out.TempFiles, out.TempBytes, err = tempUsage(v); err != nil {
			return err
		}
		members := s.repairs.memberCounts()
		for i := range out.Nodes {
			if out.Nodes[i].Draining {
				out.Nodes[i].Blocked = s.repairs.blockedOn(out.Nodes[i].ID)
			}
			if n, ok := members[out.Nodes[i].ID]; ok {
				out.Nodes[i].Members = n
			} else if members != nil {
				out.Nodes[i].Members = 0
			}
		}
		return scan(v.reader(), []byte{pDegraded}, []byte{pDegraded + 1}, func(_, _ []byte) (bool, error) {
			out.Degraded++
			return out.Degraded < metaapi.MaxDegradedList, nil
		})
	})
	return out, err
}
