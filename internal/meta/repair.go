package meta

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
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
	var be *blockedError
	stale := j.joins != q.joins // a node came up meanwhile: try again now
	switch {
	case done || err == nil:
		delete(q.stuck, j.ref)
		j.block = nil
	case stale:
		j.block = nil
	case errors.As(err, &me) && me.Code == metaapi.ENOSPC:
		q.stuck[j.ref] = err
		if errors.As(err, &be) {
			j.block, j.blockAt = &be.block, s.opts.Now()
		}
	case j.attempts+1 >= stuckAfter:
		// No intact copy, too few units at one version, a member that
		// heartbeats but does not answer: retrying goes on (a node may
		// return), but writers are told now rather than left waiting.
		q.stuck[j.ref] = fmt.Errorf("repair failed %d times, last: %w", j.attempts+1, err)
		j.block, j.blockAt = failingBlock(j.pol, j.ec, err), s.opts.Now()
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
