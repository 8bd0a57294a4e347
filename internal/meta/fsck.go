package meta

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Checks (sluice check): meta asks every node that is up for an
// inventory round (reading every block against its checksum with
// Verify), keeps what each lists, and once all have listed a whole round
// judges every chunk record against the copies (fsck_judge.go): which
// bytes of each have fewer intact copies (units) than the policy asks,
// block by block; stripe groups whose units are behind the others; copies
// no file needs where they are; chunks past their file's end. With the
// namespace's own check (CheckNamespace) that makes the report; with
// Repair, the damaged copies found are restored.
//
// A check runs while the cluster serves, and holds no lock while it
// walks: it compares two snapshots of meta's records, taken when it
// starts and when it judges, and a chunk written, moved or removed in
// between is not judged, so traffic raises no false alarm.

// checkWait bounds how long a check waits for the nodes' rounds; a node
// that has not finished by then counts as not reached.
const checkWait = time.Hour

// checkReask is how often a check asks again a node up that has not
// begun its round (it restarted, came back, or its round failed).
const checkReask = 10 * time.Second

// maxCheckCopies bounds the copies one check keeps in memory (about 100
// bytes each); a node whose listing did not fit counts as not reached.
const maxCheckCopies = 4 << 20

// checks holds the current (or last) check.
type checks struct {
	mu  sync.Mutex
	cur *checkRun
}

// checkRun is one check.
type checkRun struct {
	mu      sync.Mutex
	started time.Time
	done    time.Time
	verify  bool
	repair  bool
	nodes   map[ids.NodeID]*checkNode
	copies  int64 // kept, over all nodes
	judging bool  // the rounds are over: nodes and their copies are read without mu
	// before is meta's records as the check began (closed when it ends).
	before *pebble.Snapshot
	result metaapi.CheckResp
}

// checkNode is what one node listed.
type checkNode struct {
	state     metaapi.NodeState
	asked     time.Time // last asked for a round
	began     bool      // a round that started after the check is being listed
	finished  bool
	truncated bool // the listing did not fit maxCheckCopies
	listed    int64
	copies    map[ids.ChunkID]metaapi.HeldChunk
}

// reached reports whether the node listed a whole round for the check.
func (n *checkNode) reached() bool { return n != nil && n.finished && !n.truncated }

// CheckState answers a check request: it starts one (Start, root only;
// if one is running with the same options, its state is returned) or
// reports the current or last one.
func (s *Service) CheckState(req metaapi.CheckReq) (metaapi.CheckResp, error) {
	if req.Start && req.Who.UID != 0 {
		return metaapi.CheckResp{}, metaapi.Errorf(metaapi.EPERM, "only root may start a check")
	}
	s.chk.mu.Lock()
	cur := s.chk.cur
	switch {
	case req.Start && (cur == nil || cur.finished()):
		var err error
		if cur, err = s.startCheck(req.Verify, req.Repair); err != nil {
			s.chk.mu.Unlock()
			return metaapi.CheckResp{}, err
		}
		s.chk.cur = cur
	case req.Start && (cur.verify != req.Verify || cur.repair != req.Repair):
		s.chk.mu.Unlock()
		return metaapi.CheckResp{}, metaapi.Errorf(metaapi.EAGAIN, "another check (verify %v, repair %v) is running since %s: wait for it to finish",
			cur.verify, cur.repair, cur.started.Format(time.RFC3339))
	}
	s.chk.mu.Unlock()
	if cur == nil {
		return metaapi.CheckResp{}, nil
	}
	return cur.state(), nil
}

func (c *checkRun) finished() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.done.IsZero()
}

// state is what the check found so far.
func (c *checkRun) state() metaapi.CheckResp {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.result
	out.Started, out.Verify, out.Repair = c.started.UnixNano(), c.verify, c.repair
	if !c.done.IsZero() {
		out.Done = c.done.UnixNano()
	}
	out.Nodes = nil
	for id, n := range c.nodes {
		out.Nodes = append(out.Nodes, metaapi.CheckNode{Node: id, State: n.state, Listed: n.listed, Done: n.reached()})
	}
	slices.SortFunc(out.Nodes, func(a, b metaapi.CheckNode) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// snapshot is meta's durable records now, read without holding the
// service's lock afterwards.
func (s *Service) snapshot() (*pebble.Snapshot, counters, error) {
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return nil, counters{}, errClosed
	}
	snap, ctr, seen := s.db.NewSnapshot(), s.ctr, s.dur.committed()
	s.mu.RUnlock()
	if err := s.dur.wait(seen); err != nil {
		snap.Close()
		return nil, counters{}, err
	}
	return snap, ctr, nil
}

// startCheck begins a check: meta's records now, and an inventory round
// asked of every node that is up.
func (s *Service) startCheck(verify, repair bool) (*checkRun, error) {
	snap, _, err := s.snapshot()
	if err != nil {
		return nil, err
	}
	c := &checkRun{started: s.opts.Now(), verify: verify, repair: repair, nodes: map[ids.NodeID]*checkNode{}, before: snap}
	s.mu.RLock()
	for id, m := range s.nodes {
		c.nodes[id] = &checkNode{state: m.state}
	}
	s.mu.RUnlock()
	c.ask(s)
	s.log.Info("check started", "verify", verify, "repair", repair, "nodes", len(c.nodes))
	s.wg.Add(1)
	go s.runCheck(c)
	return c, nil
}

// ask has every node that is up and has not begun its round for the
// check run one at its next heartbeat (again every checkReask: it may
// have restarted or come back since, or its round failed).
func (c *checkRun) ask(s *Service) {
	now := time.Now()
	s.mu.RLock()
	c.mu.Lock()
	var ask []ids.NodeID
	for id, cn := range c.nodes {
		if m := s.nodes[id]; m != nil {
			cn.state = m.state
		}
		if cn.state == metaapi.NodeUp && !cn.began && now.Sub(cn.asked) >= checkReask {
			cn.asked = now
			ask = append(ask, id)
		}
	}
	c.mu.Unlock()
	s.mu.RUnlock()
	for _, id := range ask {
		s.inv.ask(id, c.verify)
	}
}

// feed takes one page of a node's inventory round for the running
// check, if any: only rounds that begin after the check does count (and,
// when the check verifies, only rounds that read every block).
func (ck *checks) feed(req *metaapi.InventoryReq) {
	ck.mu.Lock()
	c := ck.cur
	ck.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[req.Node]
	if c.judging || n == nil || n.finished {
		return
	}
	if req.After == 0 {
		if c.verify && !req.Verified {
			return // a round asked for before: wait for the check's own
		}
		c.copies -= int64(len(n.copies))
		n.began, n.truncated, n.listed, n.copies = true, false, 0, map[ids.ChunkID]metaapi.HeldChunk{}
	}
	if !n.began {
		return
	}
	for _, h := range req.Chunks {
		if c.copies >= maxCheckCopies {
			n.truncated = true
			break
		}
		n.copies[h.Chunk] = h
		n.listed++
		c.copies++
	}
	n.finished = req.Done
}

// runCheck waits for the nodes' rounds, then judges.
func (s *Service) runCheck(c *checkRun) {
	defer s.wg.Done()
	defer c.before.Close()
	deadline := time.Now().Add(checkWait)
	for c.waiting(s) > 0 && time.Now().Before(deadline) {
		c.ask(s)
		select {
		case <-s.stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	c.mu.Lock()
	c.judging = true // nothing feeds it any more: judge without holding mu
	c.mu.Unlock()
	res, err := s.judgeCheck(c)
	if err != nil {
		res.Problems = append(res.Problems, metaapi.CheckProblem{Kind: metaapi.CheckMetadata, Count: 1,
			Examples: []string{"the check could not finish: " + err.Error()}})
	}
	c.mu.Lock()
	c.result, c.done = res, s.opts.Now()
	c.mu.Unlock()
	s.log.Info("check done", "problems", len(res.Problems), "chunks", res.Chunks, "took", c.done.Sub(c.started).Round(time.Millisecond))
}

// waiting counts the nodes up whose round the check still waits for
// (a node that went down is no longer waited for).
func (c *checkRun) waiting(s *Service) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for id, cn := range c.nodes {
		if m := s.nodes[id]; m != nil {
			cn.state = m.state
		}
		if cn.state == metaapi.NodeUp && !cn.finished {
			n++
		}
	}
	return n
}
