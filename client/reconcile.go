package client

import (
	"context"
	"fmt"
	"sync"

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
			ms[i] = repairplan.Member{Answered: true, Version: rep.Version, Length: int64(rep.ChunkLen), Doubt: rep.Partial}
		}()
	}
	wg.Wait()
	return ms, errs
}

// CopyReplica has member target of l's replicated chunk copy it whole
// from member source, which holds version at length. It returns once
// the copy is durable and verified at the target.
func (c *Client) CopyReplica(ctx context.Context, l *metaapi.ChunkLayout, target, source int, version uint64, length int64) error {
	addrs := layoutAddrs(l)
	h := wire.RepairHeader{Mode: wire.RepairCopy, Unit: uint8(target), Chunk: l.Chunk, Version: version, Len: uint64(length),
		Survivors: []byte{byte(source)}, Cap: l.Cap}
	hdr, err := wire.AppendRepair(nil, &h, addrs)
	if err == nil {
		_, err = c.retryBusy(ctx, func() (uint64, error) { return c.sendWrite(ctx, addrs[target], hdr, nil) })
	}
	if err != nil {
		return &NodeError{Op: fmt.Sprintf("copy chunk %v to replica %d from replica %d", l.Chunk, target, source), Addr: addrs[target], Err: err}
	}
	return nil
}

// RebuildUnits has the units lost of l's stripe group rebuild themselves
// from the units survivors (the first K at version) by distributed
// repair, all at once.
func (c *Client) RebuildUnits(ctx context.Context, l *metaapi.ChunkLayout, lost, survivors []int, version uint64, length int64) error {
	_, err := c.rebuildUnits(ctx, l, lost, survivors, version, uint64(length), nil, wire.RepairDistributed)
	return err
}
