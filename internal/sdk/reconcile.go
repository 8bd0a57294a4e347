package sdk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/repairplan"
	"github.com/sluicefs/sluice/internal/wire"
)

// The node requests meta's repair worker sends to reconcile a chunk (see
// docs/failures.md). The layout's capability, minted by meta at the
// reconciliation's epoch, authorises them; the worker decides, these only
// carry out.

func layoutAddrs(l *metaapi.ChunkLayout) []string {
	addrs := make([]string, len(l.Replicas))
	for i, r := range l.Replicas {
		addrs[i] = r.Addr
	}
	return addrs
}

// fenceTimeout bounds fencing one member.
const fenceTimeout = 5 * time.Second

// FenceMembers fences every member of l's chunk at its capability's
// epoch, all at once, and reports what each holds (a member that could
// not be reached has Answered false and its error in errs). With
// resolveAt non-zero, a member at that version also drops its unresolved
// write (the reconciliation is complete).
func (c *Client) FenceMembers(ctx context.Context, l *metaapi.ChunkLayout, resolveAt uint64) (ms []repairplan.Member, errs []error) {
	addrs := layoutAddrs(l)
	ms, errs = make([]repairplan.Member, len(addrs)), make([]error, len(addrs))
	var wg sync.WaitGroup
	for i := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A member cut off must not hold the reconciliation long.
			ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
			defer cancel()
			h := wire.RepairHeader{Mode: wire.RepairFence, Unit: uint8(i), Chunk: l.Chunk, Version: resolveAt, Cap: l.Cap}
			hdr, err := wire.AppendRepair(nil, &h, addrs)
			var rep wire.Reply
			if err == nil {
				_, err = c.retryBusy(ctx, func() (uint64, error) {
					var err error
					rep, err = c.sendWriteReply(ctx, addrs[i], hdr, nil)
					return rep.Version, err
				})
			}
			if err != nil {
				errs[i] = &NodeError{Op: fmt.Sprintf("fence replica %d of chunk %v", i, l.Chunk), Addr: addrs[i], Err: err}
				return
			}
			ms[i] = repairplan.Member{Answered: true, Version: rep.Version, Length: int64(rep.ChunkLen), Doubt: rep.Partial, Corrupt: rep.Corrupt}
		}()
	}
	wg.Wait()
	return ms, errs
}

// CopyReplica has member target of l's replicated chunk copy it from
// sources, which hold version at length: each block from the first
// source whose copy of it passes its checksum. With heal the target
// keeps its copy (at version) and replaces only its bad blocks. It
// returns once the copy is durable and verified at the target.
func (c *Client) CopyReplica(ctx context.Context, l *metaapi.ChunkLayout, target int, sources []int, version uint64, length int64, heal bool) error {
	return c.restoreMembers(ctx, l, []int{target}, sources, version, length, wire.RepairCopy, heal)
}

// DropMembers has members of l's chunk discard their copies, all at
// once: the reconciliation found that no write to the chunk completed.
// Member i is dropped only if it is still at versions[i] (what fencing
// found).
func (c *Client) DropMembers(ctx context.Context, l *metaapi.ChunkLayout, members []int, versions []uint64) error {
	addrs := layoutAddrs(l)
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for k, i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := wire.RepairHeader{Mode: wire.RepairDrop, Unit: uint8(i), Chunk: l.Chunk, Version: versions[k], Cap: l.Cap}
			hdr, err := wire.AppendRepair(nil, &h, addrs)
			if err == nil {
				_, err = c.retryBusy(ctx, func() (uint64, error) { return c.sendWrite(ctx, addrs[i], hdr, nil) })
			}
			if err != nil {
				errs[k] = &NodeError{Op: fmt.Sprintf("drop member %d of chunk %v", i, l.Chunk), Addr: addrs[i], Err: err}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// RebuildUnits has the units lost of l's stripe group rebuild themselves
// from the units survivors (at version; the first K serve, the others
// stand in for blocks that fail their checksums), all at once: by
// distributed repair, or with gather by sending the survivors' units
// whole to each rebuilder. With heal the units keep what they hold and
// rebuild only their bad blocks.
func (c *Client) RebuildUnits(ctx context.Context, l *metaapi.ChunkLayout, lost, survivors []int, version uint64, length int64, gather, heal bool) error {
	mode := wire.RepairDistributed
	if gather {
		mode = wire.RepairGather
	}
	return c.restoreMembers(ctx, l, lost, survivors, version, length, mode, heal)
}

// restoreMembers sends the repair requests for targets of l, all at once,
// each naming the sources but itself, and waits for them (l carries
// meta's repair right).
func (c *Client) restoreMembers(ctx context.Context, l *metaapi.ChunkLayout, targets, sources []int, version uint64, length int64, mode wire.RepairMode, heal bool) error {
	addrs := layoutAddrs(l)
	var flags uint8
	if heal {
		flags = wire.RepairHeal
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var surv []byte
			for _, s := range sources {
				if s != t {
					surv = append(surv, byte(s))
				}
			}
			var err error
			if len(surv) == 0 {
				err = fmt.Errorf("no other member holds version %d to take it from", version)
			} else {
				h := wire.RepairHeader{Mode: mode, Flags: flags, Unit: uint8(t), Chunk: l.Chunk, Version: version, Len: uint64(length), Survivors: surv, Cap: l.Cap}
				var hdr []byte
				if hdr, err = wire.AppendRepair(nil, &h, addrs); err == nil {
					_, err = c.retryBusy(ctx, func() (uint64, error) { return c.sendWrite(ctx, addrs[t], hdr, nil) })
				}
			}
			if err != nil {
				what := "restore"
				if heal {
					what = "heal"
				}
				errs[i] = &NodeError{Op: fmt.Sprintf("%s member %d of chunk %v (%s) from members %v", what, t, l.Chunk, mode, surv), Addr: addrs[t], Err: err}
			}
		}()
	}
	wg.Wait()
	var failed []error
	for _, e := range errs {
		if e != nil {
			failed = append(failed, e)
		}
	}
	if len(failed) > 0 {
		return oneLine(failed)
	}
	return nil
}

// Write fail-over. A write a node failed (it died, was cut off, or its
// replicas were left apart by an earlier failure) asks meta to reconcile
// the chunk — replace members on dead nodes, fence, make the members
// whole — and is retried on the new replica set once meta is done; a
// write refused as fenced (the set changed since its layout) is retried
// on a fresh layout. A write therefore succeeds only with its whole
// policy met on live nodes.
const (
	maxFailovers = 3
	// failoverWait bounds how long a writer waits for meta to finish
	// reconciling its chunk (meta answers EAGAIN meanwhile).
	failoverWait = 45 * time.Second
)

// failover is one write's fail-over state.
type failover struct {
	n         int
	since     time.Time // when the last reconciliation was asked for
	nodeErr   error     // the failure that started it
	repairing error     // meta's last answer while it was at it
	gone      error     // a node refused the chunk as deleted
}

// failover decides whether a write to chunk l that failed with err is
// tried again, asking meta to reconcile the chunk if a node failed it.
func (c *Client) failover(ctx context.Context, fo *failover, ino ids.Ino, l *metaapi.ChunkLayout, err error) bool {
	if fo.n >= maxFailovers || ctx.Err() != nil {
		return false
	}
	s, isStatus := statusOf(err)
	var ne *NodeError
	switch {
	case isStatus && s == wire.StatusFenced:
		// The set changed: the chunk may still be being reconciled, so
		// wait for it like a fail-over of our own.
		c.fenced.Add(1)
		fo.since, fo.nodeErr = time.Now(), err
	case isStatus && s == wire.StatusGone:
		// The chunk was deleted under this write: its file was removed
		// or truncated below it. A fresh layout says what became of the
		// file: gone (ENOENT, see explain), or a new chunk to write.
		fo.gone = err
	case isStatus && (s == wire.StatusAuth || s == wire.StatusBadRequest || s == wire.StatusUnknownOp):
		return false
	case isStatus && s == wire.StatusBusy && !strings.Contains(err.Error(), "unresolved write"):
		// Another writer holds the chunk (or the node is loaded): not a
		// failure to repair. An unresolved write (store.ErrInDoubt),
		// whose writer may be gone, is.
		return false
	case !errors.As(err, &ne):
		return false
	default:
		req := metaapi.ReconcileReq{Ino: ino, Index: l.Index, Chunk: l.Chunk, Who: c.whoOf(ctx)}
		if rerr := c.meta.Call(ctx, metaapi.OpReconcile, req, nil); rerr != nil {
			c.log.Warn("asking meta to repair a chunk a write failed on", "chunk", l.Chunk, "err", rerr)
			return false
		}
		c.log.Info("write failed on a node; meta is repairing the chunk", "chunk", l.Chunk, "err", err)
		c.failovers.Add(1)
		fo.since, fo.nodeErr = time.Now(), err
	}
	fo.n++
	c.layouts.dropChunk(ino, l.Index)
	return true
}

// waitRepair reports whether a layout request that failed with err is
// tried again: meta answers EAGAIN while it reconciles the chunk (one this
// write asked it to, or one its own scan found). A writer waits for that
// as for a slow disk, up to failoverWait; EAGAIN never reaches write(2).
func (fo *failover) waitRepair(ctx context.Context, err error) bool {
	if !metaapi.IsCode(err, metaapi.EAGAIN) {
		return false
	}
	if fo.since.IsZero() {
		fo.since = time.Now()
	}
	fo.repairing = err
	if time.Since(fo.since) > failoverWait {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(200 * time.Millisecond):
		return true
	}
}

// explain turns a layout failure after a fail-over into the node failure
// that started it, with what meta said; a repair that outlasted the wait
// is an I/O error, not "try again".
func (fo *failover) explain(err error) error {
	if fo.gone != nil && metaapi.IsCode(err, metaapi.ENOENT) {
		return metaapi.Errorf(metaapi.ENOENT, "the file was removed while it was being written (a storage node refused the write: %v; meta: %v)", fo.gone, err)
	}
	if metaapi.IsCode(err, metaapi.EAGAIN) && fo.repairing != nil {
		err = metaapi.Errorf(metaapi.EIO, "waited %s for meta to repair the chunk: %v", failoverWait, err)
	}
	if fo.nodeErr == nil {
		return err
	}
	return fmt.Errorf("%w (meta could not repair the chunk: %v)", fo.nodeErr, err)
}
