package meta

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

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
	// block is why the chunk cannot be repaired now (status), found at
	// blockAt; pol and ec name its policy (set by the running attempt).
	block   *metaapi.RepairBlock
	blockAt time.Time
	pol     string
	ec      bool
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
	blocked blockedTally // the last scan's, of draining nodes
	joins   uint64       // nodes joined or came back up (nodeBack calls)
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

// failoverPending reports whether ref is queued (or running) for a
// reconciliation a writer's failure asked for: a write layout planned
// before it runs would fail again on the same members.
func (q *repairQueue) failoverPending(ref chunkRef) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	j := q.jobs[ref]
	return j != nil && j.failover
}

// nodeBack makes every queued job due now, with its failures forgotten:
// a node joined or came back up, so a member that did not answer may,
// and a lost one may find a place. Writers waiting for a chunk wait for
// that attempt instead of failing on a reason that may no longer hold.
func (q *repairQueue) nodeBack() {
	q.mu.Lock()
	q.joins++
	for _, j := range q.jobs {
		j.notBefore, j.attempts, j.block = time.Time{}, 0, nil
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

// memberCounts returns the last scan's per-node member counts.
func (q *repairQueue) memberCounts() map[ids.NodeID]int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.members
}

// blockedOn returns what the last scan found keeps node's members from
// moving.
func (q *repairQueue) blockedOn(node ids.NodeID) []metaapi.Blocked {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.blocked[node]
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
	var blocks []datedBlock
	for _, j := range q.jobs {
		if j.block != nil && !j.running {
			blocks = append(blocks, datedBlock{*j.block, j.blockAt})
		}
	}
	st.Stuck = int64(len(blocks))
	st.Blocked = aggregateBlocks(blocks, metaapi.MaxRepairBlocks)
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
	// Stuck chunks have no ETA: only the others are estimated.
	switch moving := st.Pending - st.Stuck; {
	case st.Pending == 0:
		st.ETA = 0
	case moving > 0 && st.Rate > 0 && st.Done > 0:
		st.ETA = float64(moving) * float64(st.Bytes) / float64(st.Done) / st.Rate
	}
	return q.tallies, st
}
