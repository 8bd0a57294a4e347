package sdk

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// Erasure-coded files. A file chunk is a stripe group: K data units and M
// parity units, one per node, each a chunk of the same id on its node.
// The group's bytes are cut into stripes of K cells; cell j of stripe s
// is at unit offset s·Cell of data unit j, and the parity units hold, at
// the same offset, the parity of the stripe. So unit j's bytes for
// stripes [s0, s1) are contiguous, and the code works bytewise: encoding
// the units' runs is encoding every stripe.
//
// Every write covers whole stripes of all K+M units with one version
// (reserved at unit 0, which also serialises writers): a write that does
// not cover its first or last stripe whole reads the stripe first
// (read-modify-write, under the reservation) and writes it back whole.

// ecGeom is the striping of an erasure-coded file.
type ecGeom struct {
	k, m    int
	cell    int64
	width   int64 // file bytes of a stripe: k·cell
	group   int64 // file bytes of a stripe group (the file's chunk size)
	stripes int64 // stripes per group
}

func ecGeomOf(a *metaapi.Attr) (ecGeom, bool) {
	if a.Policy == nil || a.Policy.EC == nil {
		return ecGeom{}, false
	}
	ec := a.Policy.EC
	g := ecGeom{k: ec.Data, m: ec.Parity, cell: ec.Cell, width: int64(ec.Data) * ec.Cell, group: a.ChunkSize}
	if g.cell <= 0 || g.width <= 0 || g.group%g.width != 0 {
		return ecGeom{}, false
	}
	g.stripes = g.group / g.width
	return g, true
}

// ecFlags is how the units of an erasure-coded write are sent: the mode
// of the data units' nodes, their flags, and whether the client encodes
// (central) — streaming partial parities unless a benchmark says.
func (c *Client) ecFlags() (plan.Mode, uint8, bool, error) {
	switch c.bench.ECMode {
	case "", ECStream:
		return plan.Stream, wire.FlagEncode, false, nil
	case ECPerChunk:
		return plan.Host, wire.FlagEncode, false, nil
	case ECCentral:
		return plan.Stream, 0, true, nil
	}
	return 0, 0, false, fmt.Errorf("unknown erasure-coding mode %q (known: stream, per-chunk, central)", c.bench.ECMode)
}

// ecWriteOne writes the front of p at off that fits one group and one
// message (whole stripes where it can), and returns how much it wrote.
func (f *File) ecWriteOne(ctx context.Context, g ecGeom, p []byte, off int64) (int, metaapi.ChunkVersion, error) {
	return f.ecWriteMsg(ctx, g, p, off, false)
}

// ecWriteMsg is ecWriteOne; zeroing says the write is itself the zeroing
// of stale bytes past a truncation point (so it does not zero again).
func (f *File) ecWriteMsg(ctx context.Context, g ecGeom, p []byte, off int64, zeroing bool) (int, metaapi.ChunkVersion, error) {
	c := f.c
	a := f.Attr()
	idx, o := off/g.group, off%g.group
	s0 := o / g.width
	maxS := max(1, int64(c.opts.WriteMsg)/g.width)
	end := min(o+int64(len(p)), min(s0+maxS, g.stripes)*g.width)
	n := end - o
	s1 := (end + g.width - 1) / g.width
	var fo failover
	for attempt := 0; ; attempt++ {
		ls, _, err := c.chunkLayouts(ctx, a.Ino, g.group, off, n, true)
		if err != nil {
			if fo.waitRepair(ctx, err) {
				continue
			}
			return 0, metaapi.ChunkVersion{}, fo.explain(err)
		}
		l, ok := ls[idx]
		if !ok {
			return 0, metaapi.ChunkVersion{}, fmt.Errorf("meta returned no layout for chunk %d", idx)
		}
		if len(l.Replicas) != g.k+g.m {
			return 0, metaapi.ChunkVersion{}, fmt.Errorf("chunk %v has %d units, the code needs %d", l.Chunk, len(l.Replicas), g.k+g.m)
		}
		if l.ZeroFrom > 0 && o > l.ZeroFrom && !zeroing {
			// Stale bytes lie between the old truncation point and this
			// write: overwrite them with zeros first (whole stripes).
			if err := f.ecZero(ctx, g, idx*g.group+l.ZeroFrom, idx*g.group+o); err != nil {
				return 0, metaapi.ChunkVersion{}, err
			}
			c.layouts.dropChunk(a.Ino, idx)
			continue
		}
		ver, err := c.ecWriteStripes(ctx, g, &l, s0, s1, p[:n], o)
		if s, ok := statusOf(err); ok && s == wire.StatusAuth && attempt == 0 {
			c.layouts.dropChunk(a.Ino, idx)
			continue
		}
		if wire.IsPartial(err) {
			// Some units may be ahead of the others: record the group as
			// degraded so a repair finds it even if this error is ignored.
			req := metaapi.MarkDegradedReq{Ino: a.Ino, Index: idx, Chunk: l.Chunk, Degraded: true, Who: c.whoOf(ctx)}
			if merr := c.meta.Call(context.WithoutCancel(ctx), metaapi.OpDegraded, req, nil); merr != nil {
				c.log.Warn("recording a degraded stripe group", "group", l.Chunk, "err", merr)
			}
		}
		if err != nil && c.failover(ctx, &fo, a.Ino, &l, err) {
			continue
		}
		if err != nil {
			return 0, metaapi.ChunkVersion{}, err
		}
		c.layouts.written(a.Ino, &l, ver)
		return int(n), metaapi.ChunkVersion{Index: idx, Chunk: l.Chunk, Version: ver, End: min(g.group, s1*g.width)}, nil
	}
}

// ecZero writes zeros over [from, to) of the file and records it.
func (f *File) ecZero(ctx context.Context, g ecGeom, from, to int64) error {
	zeros := make([]byte, min(to-from, max(g.width, int64(f.c.opts.WriteMsg))))
	var versions []metaapi.ChunkVersion
	for pos := from; pos < to; {
		n, v, err := f.ecWriteMsg(ctx, g, zeros[:min(int64(len(zeros)), to-pos)], pos, true)
		if err != nil {
			return err
		}
		versions = append(versions, v)
		pos += int64(n)
	}
	return f.commit(ctx, 0, versions)
}

// ecWriteStripes writes stripes [s0, s1) of group l, whose new bytes are
// data starting at group offset o (the rest of those stripes is read and
// written back), and returns the version they committed as. A write a
// unit refused busy is started over from a new reservation (with the same
// write id, so units that did apply it say so), for up to BusyRetry.
func (c *Client) ecWriteStripes(ctx context.Context, g ecGeom, l *metaapi.ChunkLayout, s0, s1 int64, data []byte, o int64) (uint64, error) {
	id := newWriteID()
	return c.retryWhile(ctx, c.opts.BusyRetry, func() (uint64, error, bool) {
		return c.ecWriteAttempt(ctx, g, l, s0, s1, data, o, id)
	})
}

// ecWriteAttempt is one try of ecWriteStripes; again says whether trying
// again from a new reservation may succeed.
func (c *Client) ecWriteAttempt(ctx context.Context, g ecGeom, l *metaapi.ChunkLayout, s0, s1 int64, data []byte, o int64, id uint64) (ver uint64, err error, again bool) {
	mode, flags, central, err := c.ecFlags()
	if err != nil {
		return 0, err, false
	}
	addrs := make([]string, len(l.Replicas))
	for i, r := range l.Replicas {
		addrs[i] = r.Addr
	}
	unitOff, unitLen := s0*g.cell, (s1-s0)*g.cell
	h := wire.WriteHeader{Strategy: plan.EC, Chunk: l.Chunk, Off: uint64(unitOff), Len: uint64(unitLen), Cap: l.Cap, WriteID: id}

	// Reserve the group's next version at unit 0: it orders this write
	// against every other one of the group.
	res := h
	res.Flags = wire.FlagReserve
	rhdr, err := wire.AppendWrite(nil, &res, addrs)
	if err != nil {
		return 0, err, false
	}
	var rep wire.Reply
	if _, err = c.retryBusy(ctx, func() (uint64, error) {
		var err error
		rep, err = c.sendWriteReply(ctx, addrs[0], rhdr, nil)
		return rep.Version, err
	}); err != nil {
		return 0, &NodeError{Op: fmt.Sprintf("reserve stripe group %v", l.Chunk), Addr: addrs[0], Err: err}, false
	}
	ver, base := rep.Version, rep.Version-1-rep.Skipped
	if rep.Skipped > 0 {
		h.Flags |= wire.FlagBase
	}
	h.Base = base
	// Until a unit write goes out, a failure gives the version back.
	release := func(err error) (uint64, error, bool) {
		rel := res
		rel.Version = ver
		if hdr, herr := wire.AppendWrite(nil, &rel, addrs); herr == nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			c.sendWriteReply(rctx, addrs[0], hdr, nil)
			cancel()
		}
		return 0, err, false
	}

	start, span := s0*g.width, (s1-s0)*g.width
	stripes := data
	if o != start || int64(len(data)) != span {
		// Not whole stripes: the first and last stripes' other bytes are
		// read as they stand (at the reserved base or a version skipped
		// since, whichever K units agree on — the base may be 0, nothing
		// written, when a first write failed midway), then the new bytes
		// overlaid.
		stripes = make([]byte, span)
		if base > 0 || rep.Skipped > 0 {
			read := func(s int64) error {
				return c.ecReadStripes(ctx, g, l, s, s+1, stripes[(s-s0)*g.width:][:g.width], base)
			}
			end := o + int64(len(data))
			var err error
			if o > start {
				err = read(s0)
			}
			if err == nil && end < start+span && (s1-1 != s0 || o == start) {
				err = read(s1 - 1)
			}
			if err != nil {
				return release(fmt.Errorf("reading stripes of group %v to update them: %w", l.Chunk, err))
			}
			if l.ZeroFrom > 0 && l.ZeroFrom < start+span {
				clear(stripes[max(0, l.ZeroFrom-start):]) // stale past a truncation
			}
		}
		copy(stripes[o-start:], data)
	}
	units := make([][][]byte, g.k+g.m) // each unit's bytes, as cells
	for j := 0; j < g.k; j++ {
		units[j] = cellsOf(stripes, g, j)
	}
	if central {
		if err := c.ecEncode(g, stripes, units); err != nil {
			return release(err)
		}
	}
	send := g.k
	if central {
		send = g.k + g.m
	}
	hdrs := make([][]byte, send)
	for i := range send {
		hi := h
		hi.Rank, hi.Version, hi.Mode = uint8(i), ver, mode
		if i < g.k {
			hi.Flags |= flags
		} else {
			hi.Mode = plan.Stream
		}
		if hdrs[i], err = wire.AppendWrite(nil, &hi, addrs); err != nil {
			return release(err)
		}
	}
	if ctx.Err() != nil {
		return release(ctx.Err())
	}
	// All units at once, their packets interleaved; a unit refused busy
	// is retried on its own at once (the others' parity waits for it).
	errs := c.sendInterleaved(ctx, addrs[:send], hdrs, units[:send])
	// Start over only if every failure may pass: busy, or unit 0 "stale",
	// which for the reservation holder means its reservation is gone
	// (taken by a first attempt that was then refused busy). A unit that
	// is down fails the write now.
	var failed []error
	again = true
	for i, err := range errs {
		if err == nil {
			continue
		}
		if s, ok := statusOf(err); !ok || !s.Retryable() && !(i == 0 && s == wire.StatusStale) {
			again = false
		}
		failed = append(failed, &NodeError{Op: fmt.Sprintf("write unit %d of stripe group %v", i, l.Chunk), Addr: addrs[i], Err: err})
	}
	if len(failed) == 0 {
		return ver, nil, false
	}
	// Units that did commit are ahead of the others: the stripe is
	// degraded until the write is retried or repaired.
	return 0, &wire.PartialError{Err: fmt.Errorf("stripe group %v version %d is degraded: %d of %d unit writes failed: %w",
		l.Chunk, ver, len(failed), send, oneLine(failed))}, again
}

// interleave is the piece of each unit sent in turn: the client
// interleaves the units' packets across their nodes (seed 000 §V-C), so
// every data node receives — and streams on — its unit at the same pace
// instead of one after the other.
const interleave = 64 << 10

// unitRetry bounds retrying one unit of a stripe write on its own: the
// parity units wait about 2 s (policy.Deps.JoinTimeout) for all data
// units to begin.
const unitRetry = 1500 * time.Millisecond

// sendInterleaved sends write i (header hdrs[i], data parts[i]) to
// addrs[i] for every i at once, a piece of each in turn, and returns each
// one's outcome. A write refused busy is retried on its own right away
// (for up to unitRetry): the other units' parity cannot complete without
// it.
func (c *Client) sendInterleaved(ctx context.Context, addrs []string, hdrs [][]byte, parts [][][]byte) []error {
	n := len(addrs)
	errs := make([]error, n)
	var wg sync.WaitGroup
	retry := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Only while the others' parity may still wait for this unit;
			// past that, the whole stripe starts over.
			_, errs[i] = c.retryBusyFor(ctx, min(c.opts.BusyRetry, unitRetry), func() (uint64, error) {
				rep, err := c.sendWriteParts(ctx, addrs[i], hdrs[i], parts[i])
				return rep.Version, err
			})
		}()
	}
	retryable := func(err error) bool {
		s, ok := statusOf(err)
		return ok && s.Retryable()
	}
	type msg struct {
		call exchange.Call
		done bool
	}
	ms := make([]*msg, n)
	for i := range n {
		total := 0
		for _, p := range parts[i] {
			total += len(p)
		}
		call, err := exchange.Begin(ctx, c.pool, addrs[i], hdrs[i], total == 0)
		if err != nil {
			errs[i] = err
			continue
		}
		// The call's cursor leaves the caller's parts alone: a retry sends
		// them again.
		ms[i] = &msg{call: call}
		ms[i].call.SetData(parts[i])
	}
	for active := true; active; {
		active = false
		for i, m := range ms {
			if m == nil || m.done || m.call.Left() == 0 {
				continue
			}
			answered, p, err := m.call.Pump(parts[i], interleave)
			if answered {
				// Answered before the end: a refusal, or "already applied".
				_, errs[i] = parseReply(p, err)
				m.done = true
				if retryable(errs[i]) {
					retry(i)
				}
				continue
			}
			if err != nil {
				errs[i], m.done = err, true
				continue
			}
			active = active || m.call.Left() > 0
		}
	}
	for i, m := range ms {
		if m == nil || m.done {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A busy verdict after the whole unit was sent may be a refusal
			// at admission (a small unit is all sent before its header is
			// answered): retried alone, briefly, like an early one. If the
			// parity has given up on the write instead, the retry fails too
			// and the whole stripe starts over (the caller's decision).
			_, err := awaitReply(ctx, &m.call)
			if retryable(err) {
				_, err = c.retryBusyFor(ctx, min(c.opts.BusyRetry, unitRetry), func() (uint64, error) {
					rep, err := c.sendWriteParts(ctx, addrs[i], hdrs[i], parts[i])
					return rep.Version, err
				})
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	return errs
}

// cellsOf returns data unit j's bytes of the stripes in buf: one cell per
// stripe, aliasing buf. Small cells are gathered into one buffer so they
// do not each become a packet.
func cellsOf(buf []byte, g ecGeom, j int) [][]byte {
	n := int64(len(buf)) / g.width
	if g.cell < 16<<10 && n > 1 {
		out := make([]byte, 0, n*g.cell)
		for s := range n {
			out = append(out, buf[s*g.width+int64(j)*g.cell:][:g.cell]...)
		}
		return [][]byte{out}
	}
	cells := make([][]byte, n)
	for s := range n {
		cells[s] = buf[s*g.width+int64(j)*g.cell:][:g.cell]
	}
	return cells
}

// ecEncode computes the parity units' bytes of the stripes in buf (the
// central mode) into units[k:].
func (c *Client) ecEncode(g ecGeom, buf []byte, units [][][]byte) error {
	code, err := c.codes.Get(g.k, g.m)
	if err != nil {
		return err
	}
	n := int64(len(buf)) / g.width
	par := make([]byte, int64(g.m)*n*g.cell)
	for p := range g.m {
		units[g.k+p] = [][]byte{par[int64(p)*n*g.cell:][:n*g.cell]}
	}
	shards := make([][]byte, g.k+g.m)
	for s := range n {
		for j := range g.k {
			shards[j] = buf[s*g.width+int64(j)*g.cell:][:g.cell]
		}
		for p := range g.m {
			shards[g.k+p] = units[g.k+p][0][s*g.cell:][:g.cell]
		}
		if err := code.Encode(shards); err != nil {
			return fmt.Errorf("encoding stripe: %w", err)
		}
	}
	return nil
}
