package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/placement"
	"github.com/sluicefs/sluice/internal/repairplan"
)

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
		j.pol, j.ec = metaapi.PolicyName(in.Policy), ec // the worker's own: status reads only j.block
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
		// Copies of the chunk found on nodes its record does not name
		// take lost members' places before new ones are placed: they hold
		// it (after a restore from an older backup, they may be its only
		// copies: docs/backup.md).
		adopt := s.adoptableLocked(&rec, len(replace), ec)
		sound += len(adopt)
		// Never replace so many members that fewer than the chunk needs
		// would hold it: their copies are the only source (a drain of a
		// single replica waits; dead members are replaced once enough
		// others are live). The replaced copies are collected only when
		// the reconciliation is done.
		if len(replace) > 0 && sound < minimum {
			if sound+corrupt < minimum {
				return &blockedError{
					block: metaapi.RepairBlock{Kind: metaapi.BlockNoSource, Policy: metaapi.PolicyName(in.Policy), EC: ec, Need: minimum, Chunks: 1},
					err:   metaapi.Errorf(metaapi.ENOSPC, "chunk %v: only %d of its members are live and whole, it needs %d to be rebuilt from", rec.ID, sound, minimum),
				}
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
			var nodes []ids.NodeID
			if need := len(replace) - len(adopt) + len(grow); need > 0 {
				nodes, err = placement.Replace(infos, need, slices.Concat(rec.Nodes, adopt), slices.Concat(kept, adopt), s.minFree, s.rng)
			}
			if err != nil {
				err = s.placementError(err)
				if me, ok := err.(*metaapi.Error); ok {
					err = metaapi.Errorf(me.Code, "chunk %v lost %d member(s) and no live node can take their place: it %s", rec.ID, len(replace)+len(grow), me.Message)
					if me.Code == metaapi.ENOSPC {
						err = &blockedError{block: s.noPlaceBlockLocked(infos, metaapi.PolicyName(in.Policy), ec, len(rec.Nodes)+len(grow)), err: err}
					}
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
			nodes = slices.Concat(adopt, nodes) // the adopted take the first places
			for k, i := range replace {
				old := rec.Nodes[i]
				rec.Nodes[i] = nodes[k]
				if !slices.Contains(rec.Replaced, old) {
					rec.Replaced = append(rec.Replaced, old)
				}
				if err := tx.b.Delete(gcKey(nodes[k], rec.ID), nil); err != nil {
					return err
				}
				if k < len(adopt) {
					s.log.Warn("a copy found on a node the chunk's record did not name becomes its member", "ino", j.ref.ino, "index", j.ref.index,
						"chunk", rec.ID, "node", nodes[k], "in_place_of", old)
					continue
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

// adoptableLocked picks up to n live nodes, not draining, that the last
// inventories found holding an intact copy of rec's chunk at its
// recorded version or later though its record does not name them, to
// take the places of n lost members. A unit of an erasure-coded chunk
// is not adopted: the node does not know which unit it holds. Nor is a
// copy of a chunk made since the last restore from a backup (or in a
// cluster never restored): its record names every node that may hold
// it, and a copy elsewhere is one retired or made up (a node may list
// any id at any version: adopted, it would be the source the members'
// copies are overwritten from). s.mu is held (taken before s.inv.mu).
func (s *Service) adoptableLocked(rec *chunkRec, n int, ec bool) []ids.NodeID {
	if ec || n == 0 || rec.ID >= s.ctr.RestoredChunks {
		return nil
	}
	var out []ids.NodeID
	for _, f := range s.inv.displaced(rec.ID) {
		m := s.nodes[f.Node]
		if len(out) == n {
			break
		}
		if m == nil || m.state != metaapi.NodeUp || m.rec.Draining || f.Version < rec.Version || slices.Contains(rec.Nodes, f.Node) {
			continue
		}
		out = append(out, f.Node)
	}
	return out
}
