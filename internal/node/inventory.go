package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/store"
)

// Inventories and tombstones: the node's side of collecting chunks no
// file needs. Deleted chunks come with the heartbeat (applyGone): each is
// deleted behind a tombstone that refuses every write until no
// capability naming it is valid any more. Copies meta missed — a write
// that raced the deletion, a copy left on a node meta took out of a
// replica set — are found by an inventory: every InventoryInterval (or
// when meta asks) the node lists its chunks to meta a page at a time,
// and deletes what meta answers, which it does only for copies it has
// found stray for its grace period. The node never judges by itself.

// DefaultInventoryInterval is how often a node lists its chunks to meta
// unless told otherwise.
const DefaultInventoryInterval = time.Hour

// inventoryRetry is how soon a failed inventory round is tried again.
const inventoryRetry = 10 * time.Second

// tombstoneSweep is how often expired tombstones are dropped.
const tombstoneSweep = time.Minute

// applyGone deletes the chunks meta deleted, each behind a tombstone
// until meta's end for it, and returns those done (to acknowledge). A
// tombstone already past its end is not needed: no capability that
// could re-create the chunk is valid any more.
func (n *Node) applyGone(gone []metaapi.GoneChunk, now int64) []ids.ChunkID {
	var done []ids.ChunkID
	for _, g := range gone {
		var err error
		if g.Until > now {
			err = n.store.Tombstone(g.Chunk, g.Until)
		} else {
			err = n.store.Drop(g.Chunk)
		}
		if err != nil {
			// A write open on it cannot commit any more; the next
			// heartbeat deletes it.
			n.log.Warn("deleting a chunk meta deleted", "chunk", g.Chunk, "err", err)
			continue
		}
		done = append(done, g.Chunk)
	}
	return done
}

// applyRetired drops the copies meta moved elsewhere, each only if no
// reconciliation fenced it here after meta retired it (the chunk may have
// been placed back on this node since, and copied here again), and
// returns those settled (to acknowledge).
func (n *Node) applyRetired(retired []metaapi.RetiredCopy) []ids.ChunkID {
	var done []ids.ChunkID
	for _, r := range retired {
		var err error
		if r.Epoch == 0 {
			err = n.store.Drop(r.Chunk) // retired before meta recorded epochs
		} else {
			var dropped bool
			if dropped, err = n.store.Collect(r.Chunk, r.Epoch); err == nil && !dropped {
				n.log.Info("kept a copy meta retired: a later reconciliation placed it here again", "chunk", r.Chunk, "retired_at", r.Epoch)
			}
		}
		if err != nil {
			n.log.Warn("deleting a copy meta moved elsewhere", "chunk", r.Chunk, "err", err)
			continue
		}
		done = append(done, r.Chunk)
	}
	return done
}

// expireTombstones drops the tombstones past their end, at most every
// tombstoneSweep.
func (n *Node) expireTombstones(now time.Time) {
	if now.Sub(n.lastSweep) < tombstoneSweep {
		return
	}
	n.lastSweep = now
	k, err := n.store.ExpireTombstones(now.UnixNano())
	if err != nil {
		n.log.Warn("dropping expired tombstones", "err", err)
	} else if k > 0 {
		n.log.Debug("dropped expired tombstones", "count", k)
	}
}

// askInventory has the inventory loop run a round now (verify: reading
// every block against its checksum).
func (n *Node) askInventory(verify bool) {
	if verify {
		n.verifyNext.Store(true)
	}
	select {
	case n.inventoryNow <- struct{}{}:
	default:
	}
}

func (n *Node) inventoryLoop(ctx context.Context) {
	defer n.wg.Done()
	every := n.opts.InventoryInterval
	failed := false
	for {
		var tick <-chan time.Time
		switch {
		case failed:
			// A round that failed (meta restarting, a page lost) is tried
			// again soon: a check may be waiting for it.
			tick = time.After(inventoryRetry)
		case every > 0:
			tick = time.After(every)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-n.inventoryNow:
		}
		if !n.registered.Load() {
			continue
		}
		start := time.Now()
		verify := n.verifyNext.Swap(false)
		held, collected, err := n.inventory(ctx, verify)
		if failed = err != nil && ctx.Err() == nil; failed && verify {
			n.verifyNext.Store(true) // the retry reads every block too
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			n.log.Warn("inventory round failed; trying again soon", "err", err, "retry_in", inventoryRetry)
		default:
			n.log.Info("inventory round done", "chunks", held, "collected", collected, "took", time.Since(start).Round(time.Millisecond))
		}
	}
}

// inventory runs one round: every chunk listed to meta in pages of
// metaapi.MaxInventoryPage, with the blocks known to fail their
// checksums (with verify, every block is read to find them: a scrub at
// full speed), and the copies meta answers deleted. It reports the chunks
// listed and the copies deleted.
func (n *Node) inventory(ctx context.Context, verify bool) (held, collected int, err error) {
	page := make([]metaapi.HeldChunk, 0, metaapi.MaxInventoryPage)
	var after ids.ChunkID
	for {
		page = page[:0]
		more := false
		err := n.store.ListFrom(after+1, func(id ids.ChunkID, in store.Info) bool {
			if len(page) == cap(page) {
				more = true
				return false
			}
			page = append(page, metaapi.HeldChunk{Chunk: id, Version: in.Version, Length: in.Length})
			return true
		})
		if err != nil {
			return held, collected, fmt.Errorf("listing chunks: %w", err)
		}
		for i := range page {
			c := &page[i]
			var bad extent.List
			if verify {
				if ctx.Err() != nil {
					return held, collected, ctx.Err()
				}
				// What it finds also goes to meta to be healed, as a
				// scrub's findings do.
				if bad, err = n.store.Verify(c.Chunk); err != nil && !errors.Is(err, store.ErrCorrupt) {
					n.log.Warn("inventory: verifying a chunk", "chunk", c.Chunk, "err", err)
				}
			} else {
				bad = n.store.Suspect(c.Chunk, c.Version)
			}
			if len(bad) > metaapi.MaxBadExtents {
				c.BadUnlisted = true
			} else {
				c.Bad = bad
			}
		}
		held += len(page)
		req := metaapi.InventoryReq{Node: n.ID(), After: after, Chunks: page, Done: !more, Verified: verify}
		var resp metaapi.InventoryResp
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = n.meta.Call(cctx, metaapi.OpInventory, req, &resp)
		cancel()
		if err != nil {
			return held, collected, fmt.Errorf("inventory page after chunk %v: %w", after, err)
		}
		for _, id := range resp.Collect {
			ok, err := n.store.Collect(id, resp.Epoch)
			switch {
			case errors.Is(err, store.ErrBusy):
				// Being written: the next round sees it again.
			case err != nil:
				n.log.Warn("collecting a stray copy", "chunk", id, "err", err)
			case ok:
				collected++
				n.log.Info("collected a copy no file needs here", "chunk", id)
			}
		}
		if !more {
			return held, collected, nil
		}
		after = page[len(page)-1].Chunk
	}
}
