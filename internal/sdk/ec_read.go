package sdk

// Reads of erasure-coded files: data units straight, decoding block by
// block from the units intact where some are lost, stale or corrupt.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// ecRead fills buf with the file bytes at off (within one group, as
// split by the caller), reading data units directly and decoding from
// parity when some cannot be read or fail their checksums.
func (f *File) ecRead(ctx context.Context, g ecGeom, buf []byte, off int64) error {
	c := f.c
	a := f.Attr()
	idx, o := off/g.group, off%g.group
	for attempt := 0; ; attempt++ {
		ls, _, err := c.chunkLayouts(ctx, a.Ino, g.group, off, int64(len(buf)), false)
		if err != nil {
			return err
		}
		l, ok := ls[idx]
		if !ok {
			clear(buf) // a hole
			return nil
		}
		err = c.ecReadRange(ctx, g, &l, o, buf)
		if err != nil && attempt == 0 && ctx.Err() == nil {
			c.layouts.dropChunk(a.Ino, idx)
			continue
		}
		return err
	}
}

// ecReadRange reads group bytes [o, o+len(buf)) of l into buf.
func (c *Client) ecReadRange(ctx context.Context, g ecGeom, l *metaapi.ChunkLayout, o int64, buf []byte) error {
	end := o + int64(len(buf))
	// Whole stripes at a time, as many as one read per unit may carry.
	per := max(1, int64(c.maxReadLen())/g.cell)
	for s0 := o / g.width; s0*g.width < end; s0 += per {
		s1 := min(s0+per, (end+g.width-1)/g.width)
		lo, hi := max(o, s0*g.width), min(end, s1*g.width)
		if err := c.ecReadDirect(ctx, g, l, lo, buf[lo-o:hi-o]); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.log.Debug("direct read of an erasure-coded group failed, decoding", "group", l.Chunk, "err", err)
			stripes := make([]byte, (s1-s0)*g.width)
			if err := c.ecReadStripes(ctx, g, l, s0, s1, stripes, 0); err != nil {
				return err
			}
			copy(buf[lo-o:hi-o], stripes[lo-s0*g.width:])
		}
	}
	if l.ZeroFrom > 0 && end > l.ZeroFrom {
		clear(buf[max(0, l.ZeroFrom-o):]) // stale past a truncation
	}
	return nil
}

// ecReadDirect reads group bytes [lo, lo+len(out)) from the data units
// holding them (the healthy path: the code is systematic).
func (c *Client) ecReadDirect(ctx context.Context, g ecGeom, l *metaapi.ChunkLayout, lo int64, out []byte) error {
	hi := lo + int64(len(out))
	errs := make([]error, g.k)
	versions := make([]uint64, g.k)
	var wg sync.WaitGroup
	for j := range g.k {
		// Unit j's bytes in [lo, hi): from its first cell in range to its last.
		first, last := int64(-1), int64(-1)
		for s := lo / g.width; s*g.width < hi; s++ {
			cs, ce := s*g.width+int64(j)*g.cell, s*g.width+int64(j+1)*g.cell
			if ce <= lo || cs >= hi {
				continue
			}
			u0, u1 := s*g.cell+max(lo, cs)-cs, s*g.cell+min(hi, ce)-cs
			if first < 0 {
				first = u0
			}
			last = u1
		}
		if first < 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pc, err := c.readUnit(ctx, l, j, first, last-first, 0, false)
			if err != nil {
				errs[j] = err
				return
			}
			defer c.bufs.put(pc.region)
			versions[j] = pc.version
			// Scatter the unit's run back to file order.
			for u := first; u < last; {
				s := u / g.cell
				n := min(last, (s+1)*g.cell) - u
				fo := s*g.width + int64(j)*g.cell + u%g.cell
				copy(out[fo-lo:], pc.data[u-first:u-first+n])
				u += n
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Cells of one stripe from two versions (a write committed between
	// the reads, or on only some units) must not be mixed: decode from a
	// version K units agree on instead.
	var v uint64
	for _, u := range versions {
		if u != 0 && v != 0 && u != v {
			return fmt.Errorf("group %v: data units at versions %v", l.Chunk, versions)
		}
		v = max(v, u)
	}
	return nil
}

// readUnit reads [off, off+n) of unit j of group l, which must be at
// version floor or later (0: the version meta knows). With partial, bytes
// failing their checksums are listed in the piece's bad rather than
// failing the read.
func (c *Client) readUnit(ctx context.Context, l *metaapi.ChunkLayout, j int, off, n int64, floor uint64, partial bool) (piece, error) {
	ul := *l
	ul.ZeroFrom = 0 // applies to group offsets, not unit offsets
	if floor > 0 {
		ul.Version = floor
	}
	r := l.Replicas[j]
	p, err := c.readCopy(ctx, r, &ul, off, n, nil, partial)
	if err != nil {
		return piece{}, &NodeError{Op: fmt.Sprintf("read unit %d of stripe group %v", j, l.Chunk), Addr: r.Addr, Err: err}
	}
	return p, nil
}

// ecReadStripes reads whole stripes [s0, s1) of group l into out (file
// order), decoding from any K units that agree on a version: the newest
// at least K units hold among those at floor or later (0: the version
// meta knows; K units holding nothing read as zeros). Every byte used
// passed its checksum: the units are judged block by block, so a stretch
// is decoded from the units intact there. The code works bytewise, so the
// units are read and decoded in runs of at most one read request each.
func (c *Client) ecReadStripes(ctx context.Context, g ecGeom, l *metaapi.ChunkLayout, s0, s1 int64, out []byte, floor uint64) error {
	code, err := c.codes.Get(g.k, g.m)
	if err != nil {
		return err
	}
	step := int64(c.maxReadLen())
	if step >= g.cell {
		step = step / g.cell * g.cell
	}
	for off, end := s0*g.cell, s1*g.cell; off < end; off += step {
		n := min(step, end-off)
		shards, release, err := c.ecDecodeRun(ctx, code, l, off, n, floor)
		if err != nil {
			return err
		}
		// Scatter the units' run [off, off+n) back to file order.
		for u := off; u < off+n; {
			s := u / g.cell
			k := min(off+n, (s+1)*g.cell) - u
			for j := range g.k {
				copy(out[(s-s0)*g.width+int64(j)*g.cell+u%g.cell:][:k], shards[j][u-off:][:k])
			}
			u += k
		}
		release()
	}
	return nil
}

// ecDecodeRun reads bytes [off, off+n) of every unit of l and returns the
// K data units' bytes, decoded where missing or failing their checksums
// (from K units intact there).
func (c *Client) ecDecodeRun(ctx context.Context, code *erasure.Code, l *metaapi.ChunkLayout, off, n int64, floor uint64) ([][]byte, func(), error) {
	units := code.Units()
	pcs := make([]piece, units)
	errs := make([]error, units)
	var wg sync.WaitGroup
	for u := range units {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pcs[u], errs[u] = c.readUnit(ctx, l, u, off, n, floor, true)
		}()
	}
	wg.Wait()
	release := func() {
		for _, p := range pcs {
			if p.region != nil {
				c.bufs.put(p.region)
			}
		}
	}
	// The newest version enough units agree on: 0 too, when K units
	// hold nothing (a first write that failed midway reached the rest).
	count := map[uint64]int{}
	for u := range units {
		if errs[u] == nil {
			count[pcs[u].version]++
		}
	}
	var ver uint64
	found := false
	for v, k := range count {
		if k >= code.K && (!found || v > ver) {
			ver, found = v, true
		}
	}
	if !found {
		release()
		var failed []error
		for _, e := range errs {
			if e != nil {
				failed = append(failed, e)
			}
		}
		return nil, nil, fmt.Errorf("stripe group %v: fewer than %d of its %d units readable at one version (%v): %w", l.Chunk, code.K, units, count, oneLine(failed))
	}
	shards := make([][]byte, units)
	bad := make([]extent.List, units)
	absent := make([]bool, units)
	for u := range units {
		absent[u] = errs[u] != nil || pcs[u].version != ver
		if !absent[u] {
			shards[u], bad[u] = pcs[u].data, pcs[u].bad
		} else if u < code.K {
			shards[u] = make([]byte, n) // decoded below
		}
	}
	// Decode each stretch that lacks a data unit from K units intact there.
	sub := make([][]byte, units)
	for _, s := range extent.Segments(off, n, bad, absent) {
		if len(s.Good) == units {
			continue
		}
		if len(s.Good) < code.K {
			release()
			return nil, nil, fmt.Errorf("stripe group %v: only %d of its %d units hold unit bytes %v intact at version %d", l.Chunk, len(s.Good), units, s.Extent, ver)
		}
		a, b := s.Off-off, s.End()-off
		clear(sub)
		missing := false
		for _, u := range s.Good {
			sub[u] = shards[u][a:b]
		}
		for u := range code.K {
			if sub[u] == nil {
				sub[u], missing = shards[u][a:b][:0], true
			}
		}
		if !missing {
			continue
		}
		if err := code.ReconstructData(sub); err != nil {
			release()
			return nil, nil, fmt.Errorf("decoding stripe group %v: %w", l.Chunk, err)
		}
		for u := range code.K {
			if len(sub[u]) > 0 && &sub[u][0] != &shards[u][a] {
				copy(shards[u][a:b], sub[u]) // the decoder took other memory
			}
		}
	}
	return shards, release, nil
}
