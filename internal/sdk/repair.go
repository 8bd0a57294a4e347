package sdk

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Repair modes (seed 003): survivors send partial decodings that the
// rebuilding node XORs, or their whole units for it to decode alone.
const (
	RepairDistributed = "distributed"
	RepairGather      = "gather"
)

// RebuiltUnit reports one unit a repair rebuilt.
type RebuiltUnit struct {
	Group   ids.ChunkID
	Unit    int
	Node    ids.NodeID
	Moved   bool // its old node was down: meta placed it on another one
	Bytes   int64
	Elapsed time.Duration // the rebuild step of its group (all its units at once)
}

// RepairReport is what Repair did to a file.
type RepairReport struct {
	Groups  int           // stripe groups checked
	Rebuilt []RebuiltUnit // units rebuilt
	Cleared int           // groups no longer recorded as degraded
}

// Repair has meta reconcile every stripe group of the erasure-coded file
// at p now, and reports what it rebuilt: each group's members are fenced
// and checked, units that are lost (node down, chunk missing), stale or
// in doubt are rebuilt from K whole ones at the node that will hold them
// — a new live node if its old one is down — as mode says. Meta does the
// work with a repair right only it mints, so a repair never races a
// writer or another repair (docs/failures.md).
func (c *Client) Repair(ctx context.Context, p string, mode string) (RepairReport, error) {
	gather, err := gatherMode(mode)
	if err != nil {
		return RepairReport{}, err
	}
	f, err := c.Open(ctx, p)
	if err != nil {
		return RepairReport{}, err
	}
	return c.repairFile(ctx, f.Attr(), p, gather)
}

func gatherMode(mode string) (bool, error) {
	switch mode {
	case "", RepairDistributed:
		return false, nil
	case RepairGather:
		return true, nil
	}
	return false, fmt.Errorf("unknown repair mode %q (known: distributed, gather)", mode)
}

// RepairDegraded repairs every file with a stripe group recorded as
// degraded (by a write that failed part-way), and reports the files.
func (c *Client) RepairDegraded(ctx context.Context, mode string) (map[ids.Ino]RepairReport, error) {
	gather, err := gatherMode(mode)
	if err != nil {
		return nil, err
	}
	var resp metaapi.ListDegradedResp
	if err := c.meta.Call(ctx, metaapi.OpListDeg, struct{}{}, &resp); err != nil {
		return nil, err
	}
	out := map[ids.Ino]RepairReport{}
	var errs []error
	for _, g := range resp.Groups {
		if _, done := out[g.Ino]; done {
			continue
		}
		a, err := c.GetAttr(ctx, g.Ino)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rep, err := c.repairFile(ctx, a, fmt.Sprintf("inode %d", g.Ino), gather)
		out[g.Ino] = rep
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return out, oneLine(errs)
	}
	return out, nil
}

// repairFile is Repair of the file with attributes a (named p in errors).
func (c *Client) repairFile(ctx context.Context, a metaapi.Attr, p string, gather bool) (RepairReport, error) {
	var rep RepairReport
	g, ok := ecGeomOf(&a)
	if !ok {
		return rep, pathErr("repair", p, metaapi.Errorf(metaapi.EINVAL, "not an erasure-coded file"))
	}
	var degraded metaapi.ListDegradedResp
	if err := c.meta.Call(ctx, metaapi.OpListDeg, struct{}{}, &degraded); err != nil {
		return rep, err
	}
	for idx := int64(0); idx*g.group < max(a.Size, 1); idx++ {
		c.layouts.dropChunk(a.Ino, idx)
		var resp metaapi.LayoutResp
		req := metaapi.LayoutReq{Ino: a.Ino, Off: idx * g.group, Len: g.group, Who: c.whoOf(ctx)}
		if err := c.meta.Call(ctx, metaapi.OpLayout, req, &resp); err != nil {
			return rep, pathErr("repair", p, err)
		}
		if len(resp.Chunks) == 0 {
			continue // a hole
		}
		l := resp.Chunks[0]
		if len(resp.Chunks) != 1 || l.Index != idx {
			return rep, pathErr("repair", p, fmt.Errorf("meta returned chunks %v for index %d", resp.Chunks, idx))
		}
		rep.Groups++
		done, err := c.reconcileNow(ctx, a.Ino, &l, gather, nil)
		c.layouts.dropChunk(a.Ino, idx)
		if err != nil {
			return rep, pathErr("repair", p, fmt.Errorf("reconciling stripe group %v: %w", l.Chunk, err))
		}
		rep.Rebuilt = append(rep.Rebuilt, rebuiltUnits(l.Chunk, done)...)
		if slices.Contains(degraded.Groups, metaapi.DegradedGroup{Ino: a.Ino, Index: idx, Chunk: l.Chunk}) {
			rep.Cleared++ // a finished reconciliation clears the mark
		}
	}
	return rep, nil
}

// reconcileNow has meta reconcile chunk l of file ino (rebuilding the
// members in rebuild even if whole) and waits for it to be done.
func (c *Client) reconcileNow(ctx context.Context, ino ids.Ino, l *metaapi.ChunkLayout, gather bool, rebuild []int) (metaapi.ReconcileResp, error) {
	req := metaapi.ReconcileReq{Ino: ino, Index: l.Index, Chunk: l.Chunk, Who: c.whoOf(ctx), Wait: true, Gather: gather, Rebuild: rebuild}
	for {
		var resp metaapi.ReconcileResp
		if err := c.meta.Call(ctx, metaapi.OpReconcile, req, &resp); err != nil {
			return resp, err
		}
		if !resp.Pending {
			return resp, nil
		}
		req.After = resp.After // still at it: wait for the same attempt
	}
}

// Rebuild has meta rebuild the given units of stripe group index of the
// erasure-coded file at p, whether or not they are damaged, from K other
// units (benchmarks of repair). It returns when all are rebuilt; each
// unit reports the time of the group's rebuild step, without the fencing
// and planning around it.
func (c *Client) Rebuild(ctx context.Context, p string, index int64, units []int, mode string) ([]RebuiltUnit, error) {
	gather, err := gatherMode(mode)
	if err != nil {
		return nil, err
	}
	a, err := c.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	g, ok := ecGeomOf(&a)
	if !ok {
		return nil, pathErr("rebuild", p, metaapi.Errorf(metaapi.EINVAL, "not an erasure-coded file"))
	}
	ls, _, err := c.chunkLayouts(ctx, a.Ino, g.group, index*g.group, 1, false)
	if err != nil {
		return nil, err
	}
	l, ok := ls[index]
	if !ok {
		return nil, pathErr("rebuild", p, fmt.Errorf("stripe group %d is a hole", index))
	}
	done, err := c.reconcileNow(ctx, a.Ino, &l, gather, units)
	if err != nil {
		return nil, pathErr("rebuild", p, err)
	}
	return rebuiltUnits(l.Chunk, done), nil
}

// rebuiltUnits reports the units a reconciliation of group restored.
func rebuiltUnits(group ids.ChunkID, done metaapi.ReconcileResp) []RebuiltUnit {
	out := make([]RebuiltUnit, 0, len(done.Restored))
	for _, m := range done.Restored {
		out = append(out, RebuiltUnit{Group: group, Unit: m.Index, Node: m.Node, Moved: m.Moved,
			Bytes: done.Bytes / int64(len(done.Restored)), Elapsed: done.Elapsed})
	}
	return out
}
