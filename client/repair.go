package client

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/wire"
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
	Elapsed time.Duration
}

// RepairReport is what Repair did to a file.
type RepairReport struct {
	Groups  int           // stripe groups checked
	Rebuilt []RebuiltUnit // units rebuilt
	Cleared int           // groups no longer recorded as degraded
}

// Repair checks every stripe group of the erasure-coded file at p and
// rebuilds the units that are lost (node down, chunk missing), stale or
// unreadable: each at the node that will hold it — a new live node if its
// old one is down — from K surviving units, as mode says. The lost units
// of one group are rebuilt in parallel.
func (c *Client) Repair(ctx context.Context, p string, mode string) (RepairReport, error) {
	var wmode wire.RepairMode
	switch mode {
	case "", RepairDistributed:
		wmode = wire.RepairDistributed
	case RepairGather:
		wmode = wire.RepairGather
	default:
		return RepairReport{}, fmt.Errorf("unknown repair mode %q (known: distributed, gather)", mode)
	}
	f, err := c.Open(ctx, p)
	if err != nil {
		return RepairReport{}, err
	}
	return c.repairFile(ctx, f.Attr(), p, wmode)
}

// RepairDegraded repairs every file with a stripe group recorded as
// degraded (by a write that failed part-way), and reports the files.
func (c *Client) RepairDegraded(ctx context.Context, mode string) (map[ids.Ino]RepairReport, error) {
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
		var wmode wire.RepairMode
		if mode == RepairGather {
			wmode = wire.RepairGather
		}
		rep, err := c.repairFile(ctx, a, fmt.Sprintf("inode %d", g.Ino), wmode)
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
func (c *Client) repairFile(ctx context.Context, a metaapi.Attr, p string, wmode wire.RepairMode) (RepairReport, error) {
	var rep RepairReport
	g, ok := ecGeomOf(&a)
	if !ok {
		return rep, pathErr("repair", p, metaapi.Errorf(metaapi.EINVAL, "not an erasure-coded file"))
	}
	var degraded metaapi.ListDegradedResp
	if err := c.meta.Call(ctx, metaapi.OpListDeg, struct{}{}, &degraded); err != nil {
		return rep, err
	}
	st, err := c.Status(ctx)
	if err != nil {
		return rep, err
	}
	down := map[ids.NodeID]bool{}
	for _, n := range st.Nodes {
		down[n.ID] = n.State != metaapi.NodeUp
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
		// Read-write capability for the group (no allocation: it exists).
		ls, _, err := c.chunkLayouts(ctx, a.Ino, g.group, idx*g.group, 1, true)
		if err != nil {
			return rep, pathErr("repair", p, err)
		}
		l = ls[idx]
		rep.Groups++
		units, err := c.repairGroup(ctx, g, a.Ino, &l, down, wmode)
		rep.Rebuilt = append(rep.Rebuilt, units...)
		c.layouts.dropChunk(a.Ino, idx)
		if err != nil {
			return rep, pathErr("repair", p, err)
		}
		if slices.Contains(degraded.Groups, metaapi.DegradedGroup{Ino: a.Ino, Index: idx, Chunk: l.Chunk}) {
			req := metaapi.MarkDegradedReq{Ino: a.Ino, Index: idx, Chunk: l.Chunk, Who: c.whoOf(ctx)}
			if err := c.meta.Call(ctx, metaapi.OpDegraded, req, nil); err != nil {
				return rep, pathErr("repair", p, fmt.Errorf("clearing the degraded mark of group %v: %w", l.Chunk, err))
			}
			rep.Cleared++
		}
	}
	return rep, nil
}

// repairGroup rebuilds the lost units of one stripe group.
func (c *Client) repairGroup(ctx context.Context, g ecGeom, ino ids.Ino, l *metaapi.ChunkLayout, down map[ids.NodeID]bool, mode wire.RepairMode) ([]RebuiltUnit, error) {
	n := g.k + g.m
	if len(l.Replicas) != n {
		return nil, fmt.Errorf("group %v has %d units, the code needs %d", l.Chunk, len(l.Replicas), n)
	}
	// Probe every unit: its version and length.
	type probe struct {
		ver, length uint64
		err         error
	}
	probes := make([]probe, n)
	var wg sync.WaitGroup
	for u := range n {
		if down[l.Replicas[u].Node] {
			probes[u].err = fmt.Errorf("node %v is down", l.Replicas[u].Node)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc, err := c.readUnit(ctx, l, u, 0, 1, 0)
			if err != nil {
				probes[u].err = err
				return
			}
			probes[u].ver, probes[u].length = pc.version, uint64(pc.length)
			c.bufs.put(pc.region)
		}()
	}
	wg.Wait()
	// The group's version: the newest at least K units hold.
	count := map[uint64]int{}
	for _, p := range probes {
		if p.err == nil {
			count[p.ver]++
		}
	}
	var ver uint64
	for v, k := range count {
		if k >= g.k && v > ver {
			ver = v
		}
	}
	if ver == 0 {
		return nil, fmt.Errorf("group %v: fewer than %d of its %d units readable at one version (%v): cannot rebuild", l.Chunk, g.k, n, count)
	}
	var lost, survivors []int
	var length uint64
	for u, p := range probes {
		if p.err == nil && p.ver == ver {
			if len(survivors) < g.k {
				survivors = append(survivors, u)
			}
			length = max(length, p.length)
			continue
		}
		lost = append(lost, u)
	}
	if len(lost) == 0 {
		return nil, nil
	}
	// Units on nodes that are down move to other live nodes.
	moved := map[int]bool{}
	for _, u := range lost {
		if !down[l.Replicas[u].Node] {
			continue
		}
		var resp metaapi.LayoutResp
		req := metaapi.ReplaceUnitReq{Ino: ino, Index: l.Index, Chunk: l.Chunk, Unit: u, Old: l.Replicas[u].Node, Who: c.whoOf(ctx)}
		if err := c.meta.Call(ctx, metaapi.OpReplace, req, &resp); err != nil {
			if metaapi.IsCode(err, metaapi.EINVAL) && strings.Contains(err.Error(), "is up") {
				continue // it came back since the status was taken: rebuild it in place
			}
			return nil, fmt.Errorf("moving unit %d of group %v off node %v: %w", u, l.Chunk, l.Replicas[u].Node, err)
		}
		if len(resp.Chunks) != 1 {
			return nil, fmt.Errorf("meta returned %d layouts for group %v", len(resp.Chunks), l.Chunk)
		}
		*l = resp.Chunks[0]
		moved[u] = true
	}
	return c.rebuildUnits(ctx, l, lost, survivors, ver, length, moved, mode)
}

// rebuildUnits sends the repair requests for units lost of group l, all
// at once, and waits for them.
func (c *Client) rebuildUnits(ctx context.Context, l *metaapi.ChunkLayout, lost, survivors []int, ver, length uint64, moved map[int]bool, mode wire.RepairMode) ([]RebuiltUnit, error) {
	addrs := make([]string, len(l.Replicas))
	for i, r := range l.Replicas {
		addrs[i] = r.Addr
	}
	surv := make([]byte, len(survivors))
	for i, s := range survivors {
		surv[i] = byte(s)
	}
	out := make([]RebuiltUnit, len(lost))
	errs := make([]error, len(lost))
	var wg sync.WaitGroup
	for i, u := range lost {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			h := wire.RepairHeader{Mode: mode, Unit: uint8(u), Chunk: l.Chunk, Version: ver, Len: length, Survivors: surv, Cap: l.Cap}
			hdr, err := wire.AppendRepair(nil, &h, addrs)
			if err == nil {
				_, err = c.retryBusy(ctx, func() (uint64, error) { return c.sendWrite(ctx, addrs[u], hdr, nil) })
			}
			if err != nil {
				errs[i] = &NodeError{Op: fmt.Sprintf("rebuild unit %d of group %v", u, l.Chunk), Addr: addrs[u], Err: err}
				return
			}
			out[i] = RebuiltUnit{Group: l.Chunk, Unit: u, Node: l.Replicas[u].Node, Moved: moved[u], Bytes: int64(length), Elapsed: time.Since(start)}
		}()
	}
	wg.Wait()
	var done []RebuiltUnit
	var failed []error
	for i := range lost {
		if errs[i] != nil {
			failed = append(failed, errs[i])
		} else {
			done = append(done, out[i])
		}
	}
	if len(failed) > 0 {
		return done, oneLine(failed)
	}
	return done, nil
}

// Rebuild rebuilds the given units of stripe group index of the
// erasure-coded file at p in place, whether or not they are damaged, from
// the first K other units (benchmarks of repair). It returns when all
// are rebuilt; the report's units carry each one's time.
func (c *Client) Rebuild(ctx context.Context, p string, index int64, units []int, mode string) ([]RebuiltUnit, error) {
	wmode := wire.RepairDistributed
	if mode == RepairGather {
		wmode = wire.RepairGather
	}
	a, err := c.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	g, ok := ecGeomOf(&a)
	if !ok {
		return nil, pathErr("rebuild", p, metaapi.Errorf(metaapi.EINVAL, "not an erasure-coded file"))
	}
	ls, _, err := c.chunkLayouts(ctx, a.Ino, g.group, index*g.group, 1, true)
	if err != nil {
		return nil, err
	}
	l := ls[index]
	var survivors []int
	for u := 0; u < g.k+g.m && len(survivors) < g.k; u++ {
		if !slices.Contains(units, u) {
			survivors = append(survivors, u)
		}
	}
	pc, err := c.readUnit(ctx, &l, survivors[0], 0, 1, 0)
	if err != nil {
		return nil, err
	}
	ver, length := pc.version, uint64(pc.length)
	c.bufs.put(pc.region)
	return c.rebuildUnits(ctx, &l, units, survivors, ver, length, nil, wmode)
}
