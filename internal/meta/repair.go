package meta

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/placement"
	"github.com/sluicefs/sluice/internal/repairplan"
)

// Repair: meta finds chunks below their policy and reconciles them, a
// bounded number at a time (docs/failures.md). A scan of the chunk
// records finds those with a member on a node down past the grace period
// (or a reconciliation left unfinished by a restart); a client whose
// write failed asks for its chunk at once (Reconcile). Each
// reconciliation replaces the members it must, at a new epoch, then has
// the Repairer fence the members, copy or rebuild what is missing, and
// reports back.

// Repairer carries out a reconciliation's node requests (the client SDK
// does, over the fabric); the layout's capability is minted for it.
//
// Sources are listed in order of preference: each block is taken from
// the first (for a stripe group, the first K) whose copy of it passes its
// checksum. With heal, the targets keep their copies and only their bad
// blocks are replaced.
type Repairer interface {
	FenceMembers(ctx context.Context, l *metaapi.ChunkLayout, resolveAt uint64) ([]repairplan.Member, []error)
	CopyReplica(ctx context.Context, l *metaapi.ChunkLayout, target int, sources []int, version uint64, length int64, heal bool) error
	RebuildUnits(ctx context.Context, l *metaapi.ChunkLayout, lost, survivors []int, version uint64, length int64, gather, heal bool) error
	DropMembers(ctx context.Context, l *metaapi.ChunkLayout, members []int, versions []uint64) error
}

// chunkRef names a chunk by its place in a file.
type chunkRef struct {
	ino   ids.Ino
	index int64
}

// repairJob is a chunk waiting for (or in) reconciliation.
type repairJob struct {
	ref       chunkRef
	failover  bool         // a writer is waiting: replace down or unreachable members now
	suspects  []ids.NodeID // members that did not answer the last attempt
	margin    int          // copies it can still lose (lower goes first)
	notBefore time.Time
	attempts  int // failed in a row
	running   bool
	// asked is what waiting Reconcile calls asked of the next attempt;
	// taken, what the running attempt took of it (given back if it fails).
	asked, taken reconcileAsk
	started      int // attempts begun
	// joins is the queue's count of node (re)starts when the running
	// attempt began: one that fails after a node came up is retried at
	// once, its verdict stale.
	joins uint64
	// restored is what the running attempt copied or rebuilt.
	restored []metaapi.RestoredMember
	version  uint64
	elapsed  time.Duration
	// waiters are Reconcile calls waiting for an attempt begun after them.
	waiters []repairWaiter
}

// reconcileAsk is what a waiting Reconcile call may ask beyond a plain
// reconciliation.
type reconcileAsk struct {
	gather  bool  // rebuild stripe units the baseline way (ReconcileReq.Gather)
	rebuild []int // members to restore even if whole (ReconcileReq.Rebuild)
}

// merge adds o's asks to a's.
func (a *reconcileAsk) merge(o reconcileAsk) {
	a.gather = a.gather || o.gather
	for _, u := range o.rebuild {
		if !slices.Contains(a.rebuild, u) {
			a.rebuild = append(a.rebuild, u)
		}
	}
}

// repairWaiter is a waiting Reconcile call: it wants the outcome of the
// first attempt numbered above after.
type repairWaiter struct {
	after int
	ch    chan jobOutcome // buffered: finishJob never blocks
}

// jobOutcome is what an attempt did, for its waiters.
type jobOutcome struct {
	resp metaapi.ReconcileResp
	err  error
}

// repairQueue is the scheduler's state.
type repairQueue struct {
	started atomic.Bool
	mu      sync.Mutex
	jobs    map[chunkRef]*repairJob
	// stuck holds why a chunk cannot be made whole now (no live node to
	// replace a lost member): writers waiting for it are told at once.
	stuck   map[chunkRef]error
	joins   uint64 // nodes joined or came back up (nodeBack calls)
	wake    chan struct{}
	tallies metaapi.RedundancyTally
	stats   metaapi.RepairStats
	recent  []completion // the last minute's, for the rate
	// members counts, per node, the chunks and units placed on it (last
	// scan; nil before the first).
	members map[ids.NodeID]int64
	// corrupt are copies reported holding bad blocks (by nodes' scrubs
	// and repairs, and by clients' reads), per chunk and node, until the
	// scan finds their records (reports name chunk ids; records are by
	// file). A nil list: not said which blocks.
	corrupt map[ids.ChunkID]map[ids.NodeID]extent.List
}

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

// completion is a finished reconciliation, for the repair rate.
type completion struct {
	at    time.Time
	bytes int64
}

// rateWindow is how far back the repair rate looks.
const rateWindow = time.Minute

func newRepairQueue() *repairQueue {
	return &repairQueue{jobs: map[chunkRef]*repairJob{}, stuck: map[chunkRef]error{}, corrupt: map[ids.ChunkID]map[ids.NodeID]extent.List{},
		wake: make(chan struct{}, 1)}
}

func (q *repairQueue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// add queues ref, or updates its job.
func (q *repairQueue) add(ref chunkRef, margin int, failover bool) {
	q.mu.Lock()
	j := q.jobs[ref]
	if j == nil {
		j = &repairJob{ref: ref, margin: margin}
		q.jobs[ref] = j
		q.stats.Queued++
	}
	j.margin = min(j.margin, margin)
	if failover {
		j.failover, j.notBefore = true, time.Time{}
	}
	q.mu.Unlock()
	q.poke()
}

// nodeBack makes every queued job due now, with its failures forgotten:
// a node joined or came back up, so a member that did not answer may,
// and a lost one may find a place. Writers waiting for a chunk wait for
// that attempt instead of failing on a reason that may no longer hold.
func (q *repairQueue) nodeBack() {
	q.mu.Lock()
	q.joins++
	for _, j := range q.jobs {
		j.notBefore, j.attempts = time.Time{}, 0
	}
	clear(q.stuck)
	q.mu.Unlock()
	q.poke()
}

// next takes the most urgent job that is due.
func (q *repairQueue) next(now time.Time) *repairJob {
	q.mu.Lock()
	defer q.mu.Unlock()
	var best *repairJob
	for _, j := range q.jobs {
		if j.running || now.Before(j.notBefore) {
			continue
		}
		if best == nil || j.failover && !best.failover || j.failover == best.failover && j.margin < best.margin {
			best = j
		}
	}
	if best != nil {
		best.running = true
		best.started++
		best.joins = q.joins
		best.restored, best.version, best.elapsed = nil, 0, 0
		best.taken, best.asked = best.asked, reconcileAsk{}
	}
	return best
}

// wait queues ref for a full reconciliation now (as a waiting writer's
// would be) and returns where its outcome will arrive: that of the first
// attempt numbered above after (clamped to the attempts begun, which a
// meta restart resets) and its number.
func (q *repairQueue) wait(ref chunkRef, after int, gather bool, rebuild []int) (<-chan jobOutcome, int) {
	q.mu.Lock()
	j := q.jobs[ref]
	if j == nil {
		j = &repairJob{ref: ref}
		q.jobs[ref] = j
		q.stats.Queued++
	}
	j.failover, j.notBefore = true, time.Time{}
	j.asked.merge(reconcileAsk{gather: gather, rebuild: rebuild})
	if after <= 0 || after > j.started {
		after = j.started
	}
	ch := make(chan jobOutcome, 1)
	j.waiters = append(j.waiters, repairWaiter{after: after, ch: ch})
	q.mu.Unlock()
	q.poke()
	return ch, after + 1
}

// unwait drops a waiter that stopped waiting.
func (q *repairQueue) unwait(ref chunkRef, ch <-chan jobOutcome) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if j := q.jobs[ref]; j != nil {
		j.waiters = slices.DeleteFunc(j.waiters, func(w repairWaiter) bool { return w.ch == ch })
	}
}

// rateBurst is the most bytes the repair rate limit grants at once.
const rateBurst = 4 << 20

// throttle waits until n more bytes of repair traffic fit the rate.
func (s *Service) throttle(ctx context.Context, n int64) error {
	if s.repairLimit == nil {
		return nil
	}
	for n > 0 {
		step := min(n, rateBurst)
		if err := s.repairLimit.WaitN(ctx, int(step)); err != nil {
			return err
		}
		n -= step
	}
	return nil
}

// StartRepair starts the scheduler and parallel workers (at least 1)
// that reconcile chunks through r. Without it, meta repairs nothing.
func (s *Service) StartRepair(r Repairer, parallel int) {
	parallel = max(parallel, 1)
	if s.opts.RepairRate > 0 {
		s.repairLimit = rate.NewLimiter(rate.Limit(s.opts.RepairRate), rateBurst)
	}
	s.repairs.started.Store(true)
	s.wg.Add(1 + parallel)
	go s.repairScanner()
	for range parallel {
		go s.repairWorker(r)
	}
}

// Reconcile asks for a chunk to be reconciled now: a client's write to
// it failed. The caller needs write access to the file.
func (s *Service) Reconcile(req metaapi.ReconcileReq) (metaapi.ReconcileResp, error) {
	if !s.repairs.started.Load() {
		return metaapi.ReconcileResp{}, metaapi.Errorf(metaapi.ENOTSUP, "this meta service repairs nothing by itself (started with --repair-parallel 0)")
	}
	err := s.read(func(v view) error {
		in, err := fileForData(v, req.Ino, req.Who, mayWrite)
		if err != nil {
			return err
		}
		var rec chunkRec
		found, err := getJSON(v.r, chunkKey(in.Ino, req.Index), &rec)
		if err != nil {
			return err
		}
		if !found || rec.ID != req.Chunk {
			return metaapi.Errorf(metaapi.EINVAL, "chunk %v is not chunk %d of file %d", req.Chunk, req.Index, in.Ino)
		}
		for _, u := range req.Rebuild {
			if u < 0 || u >= len(rec.Nodes) {
				return metaapi.Errorf(metaapi.EINVAL, "chunk %v has no member %d to rebuild (it has %d)", req.Chunk, u, len(rec.Nodes))
			}
		}
		if len(req.Rebuild) > 0 && !req.Wait {
			return metaapi.Errorf(metaapi.EINVAL, "rebuilding members needs a waiting request")
		}
		return nil
	})
	if err != nil {
		return metaapi.ReconcileResp{}, err
	}
	ref := chunkRef{req.Ino, req.Index}
	if !req.Wait {
		s.repairs.add(ref, 0, true)
		s.log.Info("reconciling a chunk a write failed on", "ino", req.Ino, "index", req.Index, "chunk", req.Chunk)
		return metaapi.ReconcileResp{}, nil
	}
	ch, attempt := s.repairs.wait(ref, req.After, req.Gather, req.Rebuild)
	t := time.NewTimer(cmp.Or(s.reconcileWait, metaapi.MaxReconcileWait))
	defer t.Stop()
	select {
	case o := <-ch:
		return o.resp, o.err
	case <-t.C:
		s.repairs.unwait(ref, ch)
		return metaapi.ReconcileResp{Pending: true, After: attempt - 1}, nil
	case <-s.stop:
		return metaapi.ReconcileResp{}, metaapi.Errorf(metaapi.EAGAIN, "meta is stopping")
	}
}

// repairScanner scans the chunk records every scanEvery (or grace
// period, if shorter): for the tallies, and for grace periods ending.
func (s *Service) repairScanner() {
	defer s.wg.Done()
	const scanEvery = 5 * time.Second
	t := time.NewTicker(min(scanEvery, s.opts.RepairGrace))
	defer t.Stop()
	for {
		s.scanForRepair()
		select {
		case <-s.stop:
			return
		case <-t.C:
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
	s.repairs.mu.Unlock()
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
			for id, m := range s.nodes {
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
	s.repairs.tallies = tally
	s.repairs.tallies.ScannedAt = now.UnixNano()
	s.repairs.mu.Unlock()
	for _, j := range due {
		s.repairs.add(j.ref, j.margin, false)
	}
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

// memberCounts returns the last scan's per-node member counts.
func (q *repairQueue) memberCounts() map[ids.NodeID]int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.members
}

// downSince is when a node stopped being heard from.
func (s *Service) downSince(m *member) time.Time {
	if !m.heard {
		return s.openedAt // not heard since meta started: its grace starts then
	}
	return time.Unix(0, m.rec.LastHeartbeat)
}

// repairWorker reconciles queued chunks one at a time.
func (s *Service) repairWorker(r Repairer) {
	defer s.wg.Done()
	for {
		j := s.repairs.next(s.opts.Now())
		if j == nil {
			select {
			case <-s.stop:
				return
			case <-s.repairs.wake:
			case <-time.After(time.Second):
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		go func() { // stop with the service
			select {
			case <-s.stop:
				cancel()
			case <-ctx.Done():
			}
		}()
		done, bytes, err := s.reconcile(ctx, r, j)
		cancel()
		s.finishJob(j, done, bytes, err)
	}
}

// stuckAfter is how many failed attempts (about 8 s of backoff) make a
// chunk's writers get EIO with the reason instead of waiting.
const stuckAfter = 4

// finishJob drops a job that is done, or requeues it with backoff.
func (s *Service) finishJob(j *repairJob, done bool, bytes int64, err error) {
	q := s.repairs
	q.mu.Lock()
	defer q.mu.Unlock()
	j.running = false
	var me *metaapi.Error
	stale := j.joins != q.joins // a node came up meanwhile: try again now
	switch {
	case done || err == nil:
		delete(q.stuck, j.ref)
	case stale:
	case errors.As(err, &me) && me.Code == metaapi.ENOSPC:
		q.stuck[j.ref] = err
	case j.attempts+1 >= stuckAfter:
		// No intact copy, too few units at one version, a member that
		// heartbeats but does not answer: retrying goes on (a node may
		// return), but writers are told now rather than left waiting.
		q.stuck[j.ref] = fmt.Errorf("repair failed %d times, last: %w", j.attempts+1, err)
	}
	// Answer the waiters whose calls came before this attempt began.
	o := jobOutcome{err: err}
	if done {
		o.resp = metaapi.ReconcileResp{Restored: j.restored, Version: j.version, Bytes: bytes, Elapsed: j.elapsed}
	} else {
		j.asked.merge(j.taken) // the next attempt does it
		if err == nil {
			o.err = metaapi.Errorf(metaapi.EAGAIN, "chunk not reconciled yet")
		}
	}
	j.taken = reconcileAsk{}
	j.waiters = slices.DeleteFunc(j.waiters, func(w repairWaiter) bool {
		if w.after < j.started {
			w.ch <- o
			return true
		}
		return false
	})
	if done {
		q.stats.Done++
		q.stats.Bytes += bytes
		if len(j.waiters) > 0 {
			// Someone asked during this attempt: go again for them.
			j.failover, j.notBefore, j.attempts = true, time.Time{}, 0
			return
		}
		delete(q.jobs, j.ref)
		q.stats.WaveDone++
		now := s.opts.Now()
		q.recent = append(q.recent, completion{now, bytes})
		for len(q.recent) > 0 && now.Sub(q.recent[0].at) > rateWindow {
			q.recent = q.recent[1:]
		}
		if len(q.jobs) == 0 {
			q.stats.WaveDone = 0 // the wave is over
		}
		return
	}
	q.stats.Failed++
	wait := time.Duration(0)
	if !stale {
		j.attempts++
		wait = min(time.Duration(1<<min(j.attempts, 6))*250*time.Millisecond, 15*time.Second)
	}
	j.notBefore = s.opts.Now().Add(wait)
	if err != nil {
		s.log.Warn("reconciling a chunk; will retry", "ino", j.ref.ino, "index", j.ref.index, "attempt", j.attempts, "retry_in", wait, "err", err)
	}
}

// reconcilePlan is what meta planned for one attempt.
type reconcilePlan struct {
	layout  metaapi.ChunkLayout
	epoch   uint64
	version uint64 // the last version meta recorded a commit of
	ec      *metaapi.ErasureCode
	fresh   map[int]bool
	corrupt map[int]bool
}

// reconcile makes one attempt at a job. done: the chunk is whole (or
// gone); bytes: what was copied or rebuilt.
func (s *Service) reconcile(ctx context.Context, r Repairer, j *repairJob) (done bool, bytes int64, err error) {
	p, skip, err := s.beginReconcile(j)
	if err != nil || skip {
		return skip, 0, err
	}
	l := &p.layout
	s.repairs.mu.Lock()
	gather, rebuild := j.taken.gather, j.taken.rebuild
	s.repairs.mu.Unlock()
	ms, errs := r.FenceMembers(ctx, l, 0)
	var unreachable []ids.NodeID
	for i, e := range errs {
		if e != nil {
			unreachable = append(unreachable, l.Replicas[i].Node)
		}
	}
	if len(unreachable) > 0 {
		s.repairs.mu.Lock()
		j.suspects = unreachable
		s.repairs.mu.Unlock()
		return false, 0, fmt.Errorf("fencing chunk %v: %w", l.Chunk, errors.Join(errs...))
	}
	for i := range ms {
		// A member asked to be rebuilt is treated as just placed: its copy
		// is replaced whole. A corrupt one (meta heard so, or it says so
		// itself) is healed.
		ms[i].Fresh = p.fresh[i] || slices.Contains(rebuild, i)
		ms[i].Corrupt = ms[i].Corrupt || p.corrupt[i]
	}
	var plan repairplan.Plan
	if p.ec != nil {
		plan, err = repairplan.Striped(ms, p.ec.Data, p.version)
	} else {
		plan, err = repairplan.Replicated(ms, p.version)
	}
	if err != nil {
		return false, 0, fmt.Errorf("planning chunk %v: %w", l.Chunk, err)
	}
	if len(plan.Drop) > 0 {
		// No write to the chunk completed; these members hold one that
		// did not, or its doubt, which would keep the chunk unwritable.
		versions := make([]uint64, len(plan.Drop))
		for k, i := range plan.Drop {
			versions[k] = ms[i].Version
		}
		if err := r.DropMembers(ctx, l, plan.Drop, versions); err != nil {
			return false, 0, fmt.Errorf("dropping the incomplete first write of chunk %v: %w", l.Chunk, err)
		}
	}
	if len(plan.Targets)+len(plan.Heal) > 0 {
		bytes = plan.Length * int64(len(plan.Targets))
		if err := s.throttle(ctx, bytes); err != nil {
			return false, 0, err
		}
		start := time.Now()
		if err := restore(ctx, r, l, plan, p.ec != nil, gather); err != nil {
			return false, 0, fmt.Errorf("restoring chunk %v at version %d: %w", l.Chunk, plan.Version, err)
		}
		s.repairs.mu.Lock()
		j.elapsed = time.Since(start)
		s.repairs.mu.Unlock()
	}
	if len(plan.Resolve) > 0 {
		if _, errs := r.FenceMembers(ctx, l, plan.Version); errors.Join(errs...) != nil {
			return false, bytes, fmt.Errorf("resolving chunk %v's unfinished write: %w", l.Chunk, errors.Join(errs...))
		}
	}
	var handled []ids.NodeID // the corrupt copies this attempt knew of, now healed or replaced
	for i, r := range l.Replicas {
		if p.corrupt[i] {
			handled = append(handled, r.Node)
		}
	}
	if err := s.endReconcile(j.ref, l.Chunk, p.epoch, plan.Version, handled); err != nil {
		return false, bytes, err
	}
	s.repairs.mu.Lock()
	j.version = plan.Version
	for _, t := range slices.Concat(plan.Targets, plan.Heal) {
		j.restored = append(j.restored, metaapi.RestoredMember{Index: t, Node: l.Replicas[t].Node, Moved: p.fresh[t]})
	}
	s.repairs.mu.Unlock()
	if !plan.Done() {
		s.log.Info("chunk reconciled", "ino", j.ref.ino, "index", j.ref.index, "chunk", l.Chunk, "version", plan.Version,
			"copied_to", plan.Targets, "healed", plan.Heal, "resolved", plan.Resolve, "dropped", plan.Drop, "epoch", p.epoch)
	}
	return true, bytes, nil
}

// restore carries out a plan's copies, rebuilds and heals, all at once.
// Each target takes the sources in its own rotation, so copies spread
// over them; each corrupt member heals from the other sources.
func restore(ctx context.Context, r Repairer, l *metaapi.ChunkLayout, plan repairplan.Plan, ec, gather bool) error {
	others := func(skip int, rot int) []int {
		out := make([]int, 0, len(plan.Sources))
		for k := range plan.Sources {
			if src := plan.Sources[(k+rot)%len(plan.Sources)]; src != skip {
				out = append(out, src)
			}
		}
		return out
	}
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	if ec {
		if len(plan.Targets) > 0 {
			run(func() error {
				return r.RebuildUnits(ctx, l, plan.Targets, plan.Sources, plan.Version, plan.Length, gather, false)
			})
		}
		if len(plan.Heal) > 0 {
			run(func() error {
				return r.RebuildUnits(ctx, l, plan.Heal, plan.Sources, plan.Version, plan.Length, true, true)
			})
		}
	} else {
		for i, t := range plan.Targets {
			run(func() error { return r.CopyReplica(ctx, l, t, others(t, i), plan.Version, plan.Length, false) })
		}
		for i, t := range plan.Heal {
			run(func() error { return r.CopyReplica(ctx, l, t, others(t, i), plan.Version, plan.Length, true) })
		}
	}
	wg.Wait()
	return errors.Join(errs...)
}

// beginReconcile replaces the members it must, at a new epoch, marks the
// chunk reconciling and mints the layout the repairer works with. skip:
// nothing to do (the chunk is gone, or healthy and not reconciling).
func (s *Service) beginReconcile(j *repairJob) (p reconcilePlan, skip bool, err error) {
	s.Sweep()
	now := s.opts.Now()
	s.repairs.mu.Lock() // add() may set it meanwhile
	failover, suspects := j.failover, slices.Clone(j.suspects)
	s.repairs.mu.Unlock()
	var plan layoutPlan
	err = s.update(func(tx *txn) error {
		in, err := tx.inode(j.ref.ino)
		if metaapi.IsCode(err, metaapi.ENOENT) {
			skip = true
			return nil
		} else if err != nil {
			return err
		}
		key := chunkKey(in.Ino, j.ref.index)
		var rec chunkRec
		found, err := getJSON(tx.b, key, &rec)
		if err != nil {
			return err
		}
		if !found {
			skip = true
			return nil
		}
		minimum := 1
		if in.Policy != nil && in.Policy.EC != nil {
			minimum = in.Policy.EC.Data
		}
		ec := in.Policy != nil && in.Policy.EC != nil
		var replace, grow []int
		sound := 0   // members that hold the chunk and stay (for now)
		corrupt := 0 // live members holding it with bad blocks
		for i, n := range rec.Nodes {
			m := s.nodes[n]
			down := m == nil || m.state != metaapi.NodeUp
			holds := !down && !slices.Contains(rec.Fresh, n) && !slices.Contains(rec.Corrupt, n)
			if !down && !slices.Contains(rec.Fresh, n) && slices.Contains(rec.Corrupt, n) {
				corrupt++
			}
			// A writer's fail-over also moves members off full nodes: the
			// write it retries would fail there again (no space), while
			// other nodes have room. They leave like a drain's.
			leaving := m != nil && (m.rec.Draining || failover && !down && s.fullLocked(m))
			switch {
			case m == nil:
			case leaving && !down && !ec:
				// A replica leaving a live node stays a member, and a
				// source, until the new copy is whole (the set grows by
				// one meanwhile): a drain never lowers redundancy, and a
				// single replica can drain.
				if holds {
					sound++
				}
				if !slices.Contains(rec.Leaving, n) {
					grow = append(grow, i)
				}
				continue
			case leaving:
			case down && now.Sub(s.downSince(m)) >= s.opts.RepairGrace:
			// A writer waiting, or a member that did not answer: replace
			// it now if meta has heard it go silent (not merely not yet
			// heard since meta started).
			case down && failover && m.heard:
			case slices.Contains(suspects, n) && m.heard && (down || now.Sub(time.Unix(0, m.rec.LastHeartbeat)) > 3*s.opts.HeartbeatInterval):
			default:
				if holds {
					sound++
				}
				continue
			}
			replace = append(replace, i)
		}
		// Never replace so many members that fewer than the chunk needs
		// would hold it: their copies are the only source (a drain of a
		// single replica waits; dead members are replaced once enough
		// others are live). The replaced copies are collected only when
		// the reconciliation is done.
		if len(replace) > 0 && sound < minimum {
			if sound+corrupt < minimum {
				return metaapi.Errorf(metaapi.ENOSPC, "chunk %v: only %d of its members are live and whole, it needs %d to be rebuilt from", rec.ID, sound, minimum)
			}
			// Live members with bad blocks can heal each other now (block
			// by block); the lost members are replaced once they have,
			// so that no member whose blocks may be needed leaves first.
			replace, grow = nil, nil
		}
		_, degraded, err := getRaw(tx.b, degradedKey(in.Ino, j.ref.index))
		if err != nil {
			return err
		}
		if len(replace) == 0 && len(grow) == 0 && !rec.Reconciling && !failover && !degraded && len(rec.Corrupt) == 0 {
			skip = true
			return nil
		}
		if len(replace)+len(grow) > 0 {
			var kept []ids.NodeID
			for i, n := range rec.Nodes {
				if !slices.Contains(replace, i) && !slices.Contains(grow, i) {
					kept = append(kept, n)
				}
			}
			infos := s.placementInfosLocked()
			nodes, err := placement.Replace(infos, len(replace)+len(grow), rec.Nodes, kept, s.minFree, s.rng)
			if err != nil {
				err = s.placementError(err)
				if me, ok := err.(*metaapi.Error); ok {
					return metaapi.Errorf(me.Code, "chunk %v lost %d member(s) and no live node can take their place: it %s", rec.ID, len(replace)+len(grow), me.Message)
				}
				return err
			}
			// The new members receive a copy of the chunk.
			pol := metaapi.Policy{}
			if in.Policy != nil {
				pol = *in.Policy
			}
			placed := charges{}
			placed.add(infos, nodes, placedBytes(pol, in.ChunkSize, j.ref.index, 0, in.Size))
			tx.after = append(tx.after, func() { s.commitCharges(placed) })
			for k, i := range replace {
				old := rec.Nodes[i]
				rec.Nodes[i] = nodes[k]
				if !slices.Contains(rec.Replaced, old) {
					rec.Replaced = append(rec.Replaced, old)
				}
				if err := tx.b.Delete(gcKey(nodes[k], rec.ID), nil); err != nil {
					return err
				}
				rec.Fresh = append(rec.Fresh, nodes[k])
			}
			for k, i := range grow {
				add := nodes[len(replace)+k]
				rec.Leaving = append(rec.Leaving, rec.Nodes[i])
				rec.Nodes = append(rec.Nodes, add)
				if err := tx.b.Delete(gcKey(add, rec.ID), nil); err != nil {
					return err
				}
				rec.Fresh = append(rec.Fresh, add)
			}
		}
		tx.ctr.Epoch++
		rec.Epoch, rec.Reconciling = tx.ctr.Epoch, true
		if err := tx.setJSON(key, &rec); err != nil {
			return err
		}
		p = reconcilePlan{epoch: rec.Epoch, version: rec.Version, fresh: map[int]bool{}, corrupt: map[int]bool{}}
		for i, n := range rec.Nodes {
			p.fresh[i] = slices.Contains(rec.Fresh, n)
			p.corrupt[i] = slices.Contains(rec.Corrupt, n)
		}
		if in.Policy != nil {
			p.ec = in.Policy.EC
		}
		plan = layoutPlan{at: tx.now, attr: in.Attr, epoch: tx.ctr.Epoch, chunks: []indexedChunk{{index: j.ref.index, rec: rec}}, addrs: s.addrsLocked()}
		return nil
	})
	if err != nil || skip {
		return p, skip, err
	}
	resp := s.mintLayout(0, capability.Read|capability.Write|capability.Repair, &plan)
	p.layout = resp.Chunks[0]
	return p, false, nil
}

// endReconcile records a finished reconciliation, unless the chunk was
// reconciled again (a newer epoch) or replaced meanwhile.
func (s *Service) endReconcile(ref chunkRef, id ids.ChunkID, epoch, version uint64, corrupt []ids.NodeID) error {
	return s.update(func(tx *txn) error {
		key := chunkKey(ref.ino, ref.index)
		var rec chunkRec
		found, err := getJSON(tx.b, key, &rec)
		if err != nil || !found || rec.ID != id || rec.Epoch != epoch {
			return err
		}
		// The members it replaced may now drop their copies (not before:
		// until the new ones were whole, theirs were the other copies).
		for _, old := range rec.Replaced {
			if !slices.Contains(rec.Nodes, old) {
				if err := tx.b.Set(gcKey(old, rec.ID), retiredValue(rec.Epoch), nil); err != nil {
					return err
				}
			}
		}
		// Members leaving a draining node go now that their copy has a
		// whole successor.
		for _, old := range rec.Leaving {
			rec.Nodes = slices.DeleteFunc(rec.Nodes, func(n ids.NodeID) bool { return n == old })
			if err := tx.b.Set(gcKey(old, rec.ID), retiredValue(rec.Epoch), nil); err != nil {
				return err
			}
		}
		// A scrub report that came in meanwhile stays, for the next scan.
		rec.Corrupt = slices.DeleteFunc(rec.Corrupt, func(n ids.NodeID) bool {
			return slices.Contains(corrupt, n) || !slices.Contains(rec.Nodes, n)
		})
		for n := range rec.Bad {
			if !slices.Contains(rec.Corrupt, n) {
				delete(rec.Bad, n)
			}
		}
		rec.Reconciling, rec.Fresh, rec.Replaced, rec.Leaving = false, nil, nil, nil
		rec.Version = max(rec.Version, version)
		if err := tx.b.Delete(degradedKey(ref.ino, ref.index), nil); err != nil {
			return err
		}
		return tx.setJSON(key, &rec)
	})
}

// stuckErr is why chunk ref cannot be made whole now, if it cannot.
func (q *repairQueue) stuckErr(ref chunkRef) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stuck[ref]
}

// repairStatus reports the redundancy tallies of the last scan and the
// repair queue.
func (s *Service) repairStatus() (metaapi.RedundancyTally, metaapi.RepairStats) {
	q := s.repairs
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	st.Pending = 0
	for _, j := range q.jobs {
		st.Pending++
		if j.running {
			st.Running++
		}
	}
	st.ETA = -1
	now := s.opts.Now()
	var bytes int64
	var first time.Time
	for _, c := range q.recent {
		if now.Sub(c.at) <= rateWindow {
			if first.IsZero() {
				first = c.at
			}
			bytes += c.bytes
		}
	}
	if span := now.Sub(first); !first.IsZero() && span > 0 {
		st.Rate = float64(bytes) / max(span.Seconds(), 1)
	}
	switch {
	case st.Pending == 0:
		st.ETA = 0
	case st.Rate > 0 && st.Done > 0:
		st.ETA = float64(st.Pending) * float64(st.Bytes) / float64(st.Done) / st.Rate
	}
	return q.tallies, st
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
	s.log.Warn("a client read blocks failing their checksums", "client", client, "chunk", req.Copy.Chunk, "node", req.Copy.Node, "bad", req.Copy.Bad)
	s.repairs.noteCorrupt(0, []metaapi.CorruptCopy{req.Copy})
	return nil
}
