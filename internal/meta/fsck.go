package meta

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/inventory"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Checks (sluice check): meta asks every node that is up for an
// inventory round (reading every block against its checksum with
// Verify), keeps what each lists, and once all have listed a whole round
// judges every chunk record against the copies: which bytes of each have
// fewer intact copies (units) than the policy asks, block by block;
// stripe groups whose units disagree on version; copies no file needs
// where they are; chunks past their file's end. With the namespace's own
// check (CheckNamespace) that makes the report; with Repair, chunks below
// their policy are queued for reconciliation.
//
// A check runs while the cluster serves: a chunk written, moved or
// removed during the check is not judged (its record changed since the
// check began), so the report holds no false alarms from traffic.

// checkWait bounds how long a check waits for the nodes' rounds; a node
// that has not finished by then counts as not reached.
const checkWait = time.Hour

// maxCheckCopies bounds the copies one check keeps in memory (about 100
// bytes each); past it the check judges what it has and says so.
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
	full    bool  // maxCheckCopies reached
	// before are the chunk records' version and members when the check
	// began: a record that differs at the end was written or moved during
	// the check. (A reconciliation that only healed copies changes
	// neither: what the nodes listed is judged.)
	before map[ids.ChunkID]recordState
	result metaapi.CheckResp
}

// checkNode is what one node listed.
type checkNode struct {
	state    metaapi.NodeState
	began    bool // a round that started after the check is being listed
	finished bool
	listed   int64
	copies   map[ids.ChunkID]metaapi.HeldChunk
}

// CheckState answers a check request: it starts one (Start, root only;
// if one is running, its state is returned instead) or reports the
// current or last one.
func (s *Service) CheckState(req metaapi.CheckReq) (metaapi.CheckResp, error) {
	if req.Start && req.Who.UID != 0 {
		return metaapi.CheckResp{}, metaapi.Errorf(metaapi.EPERM, "only root may start a check")
	}
	s.chk.mu.Lock()
	cur := s.chk.cur
	if req.Start && (cur == nil || cur.finished()) {
		var err error
		if cur, err = s.startCheck(req.Verify, req.Repair); err != nil {
			s.chk.mu.Unlock()
			return metaapi.CheckResp{}, err
		}
		s.chk.cur = cur
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
		out.Nodes = append(out.Nodes, metaapi.CheckNode{Node: id, State: n.state, Listed: n.listed, Done: n.finished})
	}
	slices.SortFunc(out.Nodes, func(a, b metaapi.CheckNode) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// startCheck begins a check: the records' state now, and an inventory
// round asked of every node that is up.
func (s *Service) startCheck(verify, repair bool) (*checkRun, error) {
	c := &checkRun{started: s.opts.Now(), verify: verify, repair: repair, nodes: map[ids.NodeID]*checkNode{},
		before: map[ids.ChunkID]recordState{}}
	err := s.read(func(v view) error {
		return scan(v.r, []byte{pChunk}, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
			var rec chunkRec
			if json.Unmarshal(val, &rec) != nil {
				return true, nil // the namespace check reports it
			}
			c.before[rec.ID] = stateOf(&rec)
			return true, nil
		})
	})
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	for id, m := range s.nodes {
		c.nodes[id] = &checkNode{state: m.state}
		if m.state == metaapi.NodeUp {
			s.inv.ask(id, verify)
		}
	}
	s.mu.RUnlock()
	s.log.Info("check started", "verify", verify, "repair", repair, "nodes", len(c.nodes), "chunks", len(c.before))
	s.wg.Add(1)
	go s.runCheck(c)
	return c, nil
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
	if !c.done.IsZero() || n == nil || n.finished {
		return
	}
	if req.After == 0 {
		if c.verify && !req.Verified {
			return // a round asked for before: wait for the check's own
		}
		n.began, n.listed, n.copies = true, 0, map[ids.ChunkID]metaapi.HeldChunk{}
	}
	if !n.began {
		return
	}
	for _, h := range req.Chunks {
		if c.copies >= maxCheckCopies {
			c.full = true
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
	deadline := time.Now().Add(checkWait)
	for {
		if c.waiting(s) == 0 || time.Now().After(deadline) {
			break
		}
		select {
		case <-s.stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	res, err := s.judgeCheck(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		res.Problems = append(res.Problems, metaapi.CheckProblem{Kind: metaapi.CheckMetadata, Count: 1,
			Examples: []string{fmt.Sprintf("the check could not finish: %v", err)}})
	}
	c.result, c.done = res, s.opts.Now()
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

// problems gathers problems by kind, with counts and a few examples.
type problems struct {
	byKind map[metaapi.CheckKind]*metaapi.CheckProblem
	order  []metaapi.CheckKind
}

func (p *problems) add(kind metaapi.CheckKind, format string, args ...any) {
	if p.byKind == nil {
		p.byKind = map[metaapi.CheckKind]*metaapi.CheckProblem{}
	}
	pr := p.byKind[kind]
	if pr == nil {
		pr = &metaapi.CheckProblem{Kind: kind}
		p.byKind[kind] = pr
		p.order = append(p.order, kind)
	}
	pr.Count++
	if len(pr.Examples) < metaapi.MaxCheckExamples {
		pr.Examples = append(pr.Examples, fmt.Sprintf(format, args...))
	}
}

// merge adds a problem found elsewhere (the namespace check's).
func (p *problems) merge(o metaapi.CheckProblem) {
	if p.byKind == nil {
		p.byKind = map[metaapi.CheckKind]*metaapi.CheckProblem{}
	}
	pr := p.byKind[o.Kind]
	if pr == nil {
		p.byKind[o.Kind] = &o
		p.order = append(p.order, o.Kind)
		return
	}
	pr.Count += o.Count
	pr.Repaired += o.Repaired
	pr.Action = cmp.Or(pr.Action, o.Action)
	pr.Examples = append(pr.Examples, o.Examples[:min(len(o.Examples), metaapi.MaxCheckExamples-len(pr.Examples))]...)
}

func (p *problems) list() []metaapi.CheckProblem {
	out := make([]metaapi.CheckProblem, 0, len(p.order))
	for _, k := range p.order {
		out = append(out, *p.byKind[k])
	}
	return out
}

// judgeCheck compares every chunk record with what the nodes listed, and
// runs the namespace's check.
func (s *Service) judgeCheck(c *checkRun) (metaapi.CheckResp, error) {
	var res metaapi.CheckResp
	ns, err := s.CheckNamespace(c.repair)
	if err != nil {
		return res, err
	}
	res.Files, res.Dirs = ns.Files, ns.Dirs
	var p problems
	for _, pr := range ns.Problems { // the namespace's first
		p.merge(pr)
	}
	var due []metaapi.CorruptCopy // copies to restore, with --repair
	c.mu.Lock()                   // the rounds are over: nothing feeds it any more
	defer c.mu.Unlock()
	if c.full {
		p.add(metaapi.CheckMetadata, "the nodes hold more than %d copies: only the first %d listed were judged", maxCheckCopies, maxCheckCopies)
	}
	err = s.read(func(v view) error {
		sizes := map[ids.Ino]metaapi.Attr{}
		return scan(v.r, []byte{pChunk}, []byte{pChunk + 1}, func(k, val []byte) (bool, error) {
			if len(k) != 17 {
				return true, nil // the namespace check reports it
			}
			var rec chunkRec
			if json.Unmarshal(val, &rec) != nil {
				return true, nil // the namespace check reports it
			}
			res.Chunks++
			ref := chunkRef{ids.Ino(beUint64(k[1:])), int64(beUint64(k[9:]))}
			a, ok := sizes[ref.ino]
			if !ok {
				in, err := v.inode(ref.ino)
				if err != nil {
					return true, nil // the namespace check reports it
				}
				a = in.Attr
				sizes[ref.ino] = a
			}
			// Named (a path lookup) only if it makes an example.
			what := lazyString(func() string { return fmt.Sprintf("%s chunk %d (%v)", ns.Path(v.r, ref.ino), ref.index, rec.ID) })
			if a.ChunkSize > 0 && ref.index*a.ChunkSize >= max(a.Size, 1) {
				p.add(metaapi.CheckPastEOF, "%s: starts at %d, the file has %d bytes", what, ref.index*a.ChunkSize, a.Size)
			}
			if b, ok := c.before[rec.ID]; !ok || b != stateOf(&rec) {
				return true, nil // written or moved during the check
			}
			want := 1
			if a.Policy != nil {
				want = a.Policy.Units()
			}
			seen := make([]copySeen, len(rec.Nodes))
			for i, n := range rec.Nodes {
				cn := c.nodes[n]
				if cn == nil || !cn.finished {
					continue
				}
				h, held := cn.copies[rec.ID]
				seen[i] = copySeen{reached: true, held: held, version: h.Version, bad: h.Bad, badUnlisted: h.BadUnlisted}
			}
			j := judgeCopies(seen, rec.Version, a.Policy != nil && a.Policy.EC != nil)
			switch {
			case j.intact < want && j.unreached > 0:
				p.add(metaapi.CheckUnreached, "%s: %d of %d members on nodes that did not list their chunks", what, j.unreached, len(rec.Nodes))
			case j.intact < want:
				note := ""
				if rec.Reconciling {
					note = "; meta is repairing it"
				}
				p.add(metaapi.CheckBelowPolicy, "%s: %d of %d copies intact%s (%s%s)", what, j.intact, want, j.where, describeCopies(rec.Nodes, seen, rec.Version), note)
			}
			if j.versionsDiffer {
				p.add(metaapi.CheckUnitVersions, "%s: units at versions %s, meta recorded %d", what, j.versions, rec.Version)
			}
			if j.intact < want && j.unreached == 0 || j.versionsDiffer {
				due = append(due, damaged(rec.ID, rec.Nodes, seen, rec.Version, j.versionsDiffer)...)
			}
			return true, nil
		})
	})
	if err != nil {
		return res, err
	}
	if err := s.judgeHeld(c, &p); err != nil {
		return res, err
	}
	res.Problems = p.list()
	if c.repair {
		s.repairChecked(res.Problems, due)
	}
	for i := range res.Problems {
		if res.Problems[i].Kind == metaapi.CheckUnknownCopy && res.Problems[i].Action == "" {
			res.Problems[i].Action = fmt.Sprintf("each is collected once the nodes' inventories have found it stray for --orphan-grace (%s)", s.opts.OrphanGrace)
		}
	}
	return res, nil
}

// judgeHeld finds the copies nodes listed that no file needs there.
func (s *Service) judgeHeld(c *checkRun, p *problems) error {
	nodes := slices.Sorted(func(yield func(ids.NodeID) bool) {
		for id := range c.nodes {
			if !yield(id) {
				return
			}
		}
	})
	return s.read(func(v view) error {
		next := s.ctr.NextChunk
		for _, n := range nodes {
			cn := c.nodes[n]
			if !cn.finished {
				continue
			}
			for _, id := range slices.Sorted(func(yield func(ids.ChunkID) bool) {
				for id := range cn.copies {
					if !yield(id) {
						return
					}
				}
			}) {
				r, err := copyRecord(v.r, n, id)
				if err != nil {
					continue // an index problem: the namespace check reports it
				}
				switch verdict := inventory.Judge(id, next, r); verdict {
				case inventory.Unknown, inventory.NotMember, inventory.Ahead:
					h := cn.copies[id]
					p.add(metaapi.CheckUnknownCopy, "%v on %v (version %d, %d bytes): %s", id, n, h.Version, h.Length, verdict.Kind())
				}
			}
		}
		return nil
	})
}

// repairChecked has the copies found damaged (missing, behind, with bad
// blocks) restored: they are reported to the repair scan as a scrub's
// findings are, so status counts them and meta reconciles their chunks.
func (s *Service) repairChecked(ps []metaapi.CheckProblem, due []metaapi.CorruptCopy) {
	for i := range ps {
		pr := &ps[i]
		switch pr.Kind {
		case metaapi.CheckBelowPolicy, metaapi.CheckUnitVersions:
			if !s.repairs.started.Load() {
				pr.Action = "left: this meta service repairs nothing by itself (--repair-parallel 0)"
				continue
			}
			pr.Repaired = pr.Count
			pr.Action = "queued for reconciliation: meta restores them in the background (sluice status shows progress)"
		case metaapi.CheckPastEOF:
			pr.Action = "left: a write extending the file may be under way"
		case metaapi.CheckUnreached:
			pr.Action = "left: run the check again once the nodes are up"
		}
	}
	if !s.repairs.started.Load() {
		return
	}
	for len(due) > 0 {
		n := min(len(due), metaapi.MaxCorruptCopies)
		s.repairs.noteCorrupt(0, due[:n])
		due = due[n:]
	}
	s.repairs.poke()
}

// damaged lists the members of a chunk whose copies are missing, behind
// version (with exact, at any other version: stripe units must agree),
// or have bad blocks.
func damaged(id ids.ChunkID, nodes []ids.NodeID, seen []copySeen, version uint64, exact bool) []metaapi.CorruptCopy {
	var out []metaapi.CorruptCopy
	for i, s := range seen {
		switch {
		case !s.reached:
		case !s.held || s.version < version || exact && s.version != version || s.badUnlisted:
			out = append(out, metaapi.CorruptCopy{Chunk: id, Node: nodes[i], Version: s.version})
		case len(s.bad) > 0:
			out = append(out, metaapi.CorruptCopy{Chunk: id, Node: nodes[i], Version: s.version, Bad: s.bad})
		}
	}
	return out
}

// lazyString is a %s argument computed only when formatted.
type lazyString func() string

func (f lazyString) String() string { return f() }

// recordState is what of a chunk record a check compares before and
// after: its version and its members.
type recordState struct {
	version uint64
	members string
}

func stateOf(rec *chunkRec) recordState {
	return recordState{rec.Version, fmt.Sprint(rec.Nodes)}
}

// copySeen is what a check saw of one member's copy.
type copySeen struct {
	reached     bool // its node listed a whole round
	held        bool // ... and this copy in it
	version     uint64
	bad         extent.List
	badUnlisted bool
}

// copyJudgement is the outcome of judging a chunk's copies.
type copyJudgement struct {
	intact         int    // the fewest intact copies of any byte
	where          string // where that is, if some bytes have more
	unreached      int
	versionsDiffer bool
	versions       string
}

// judgeCopies counts the intact copies of a chunk recorded at version:
// a member counts where its node listed the copy at that version (or
// later: a write under way), less its bad blocks. Stripe units must all
// be at one version.
func judgeCopies(seen []copySeen, version uint64, ec bool) copyJudgement {
	var j copyJudgement
	bad := make([]extent.List, len(seen))
	absent := make([]bool, len(seen))
	versions := map[uint64]int{}
	for i, s := range seen {
		if !s.reached {
			j.unreached++
		}
		absent[i] = !s.reached || !s.held || s.version < version || s.badUnlisted
		bad[i] = s.bad
		if s.reached && s.held {
			versions[s.version]++
		}
	}
	j.intact = extent.MinGood(bad, absent)
	whole := 0
	for i := range seen {
		if !absent[i] {
			whole++
		}
	}
	if j.intact < whole {
		for _, seg := range extent.Segments(0, 1<<62, bad, absent) {
			if len(seg.Good) == j.intact {
				j.where = fmt.Sprintf(" at bytes %v", seg.Extent)
				break
			}
		}
	}
	if ec && len(versions) > 1 {
		j.versionsDiffer = true
		var parts []string
		for v, n := range versions {
			parts = append(parts, fmt.Sprintf("%d×%d", n, v))
		}
		slices.Sort(parts)
		j.versions = strings.Join(parts, ", ")
	}
	return j
}

// describeCopies says what is wrong with each member's copy.
func describeCopies(nodes []ids.NodeID, seen []copySeen, version uint64) string {
	var parts []string
	for i, s := range seen {
		switch {
		case !s.reached:
			parts = append(parts, fmt.Sprintf("%v not reached", nodes[i]))
		case !s.held:
			parts = append(parts, fmt.Sprintf("%v holds no copy", nodes[i]))
		case s.version < version:
			parts = append(parts, fmt.Sprintf("%v at version %d", nodes[i], s.version))
		case s.badUnlisted:
			parts = append(parts, fmt.Sprintf("%v has many bad blocks", nodes[i]))
		case len(s.bad) > 0:
			parts = append(parts, fmt.Sprintf("%v bad at %v", nodes[i], s.bad))
		}
	}
	return strings.Join(parts, "; ")
}
