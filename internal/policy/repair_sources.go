package policy

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/exchange"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// Taking bytes from a repair's survivors. Checksums are judged block by
// block: a survivor with a bad block still serves every other block, and
// a byte is lost only when no survivor (for a copy) or fewer than K (for
// a stripe unit) hold it intact.

// fetch reads one piece of a survivor into buf (registered under rh's
// region) and returns the blocks that fail the checksums the survivor
// sent. The survivor's version must be the group's.
func (x *repairer) fetch(addr string, rh *wire.ReadHeader, version uint64, buf []byte) (extent.List, error) {
	ctx, cancel := context.WithTimeout(context.Background(), x.d.ReplyTimeout)
	defer cancel()
	hdr, err := wire.AppendRead(nil, rh)
	if err != nil {
		return nil, err
	}
	pc, err := x.d.Forward.Get(ctx, addr)
	if err != nil {
		return nil, err
	}
	call, err := exchange.Post(x.d.Forward, pc, hdr)
	if err != nil {
		return nil, err
	}
	p, err := call.Finish(context.Background(), x.d.ReplyTimeout)
	if err != nil {
		return nil, err
	}
	defer p.Release()
	var rep wire.Reply
	err = wire.ParseReply(p.Data, &rep)
	if err == nil {
		err = rep.Err()
	}
	if err != nil {
		return nil, err
	}
	if err := checkPiece(&rep, rh.Off, len(buf), version); err != nil {
		return nil, err
	}
	_, bad, err := rep.ReadData(buf, int64(rh.Off), int64(len(buf)))
	return bad, err
}

// checkPiece checks a survivor's reply describes the piece asked for,
// exactly (its checksums are checked by wire.Reply.ReadData).
func checkPiece(rep *wire.Reply, off uint64, n int, version uint64) error {
	switch {
	case rep.Version != version:
		return fmt.Errorf("%w: at version %d, the chunk is at %d", errOtherVersion, rep.Version, version)
	case rep.DataOff != off || rep.DataLen != uint64(n):
		return fmt.Errorf("sent [%d,+%d) for [%d,+%d)", rep.DataOff, rep.DataLen, off, n)
	}
	return nil
}

var errOtherVersion = errors.New("survivor holds another version")

// softFailure reports whether a survivor's failure concerns only the
// piece asked for (a scaled read that met a bad block of its own answers
// StatusIO), so the survivor may still serve the next ones.
func softFailure(err error) bool {
	var we *wire.Error
	return errors.As(err, &we) && we.Status == wire.StatusIO
}

// gather fills the extents need of out, the repaired member's bytes
// [off, off+n) (a piece, at most repairPiece, aligned to it), from every
// survivor that has not failed: for a copy each extent from the first
// survivor intact there, for a stripe unit decoded from K units intact
// there. Survivors found holding bad blocks are reported to meta.
func (x *repairer) gather(st *repairState, code *erasure.Code, off, n int64, need extent.List, out []byte) error {
	h := &st.h
	ep := x.d.Forward.Endpoint()
	type got struct {
		buf    *[]byte
		region *fabric.Region
		bad    extent.List
		ok     bool
	}
	gots := make([]got, len(st.survivors))
	defer func() {
		for _, g := range gots {
			if g.buf != nil {
				ep.Deregister(g.region)
				x.pieces.Put(g.buf)
			}
		}
	}()
	take := func(i int) {
		sv := &st.survivors[i]
		g := &gots[i]
		g.buf = x.pieces.Get().(*[]byte)
		g.region = ep.Register(*g.buf, fabric.RemoteWrite)
		rh := wire.ReadHeader{Chunk: h.Chunk, Off: uint64(off), Len: uint64(n), RegionKey: g.region.Key(), Cap: h.Cap}
		bad, err := x.fetch(sv.addr, &rh, h.Version, (*g.buf)[:n])
		switch {
		case err != nil:
			if !softFailure(err) {
				sv.failed = true
			}
			x.d.Logger.Warn("repair: a survivor could not serve a piece", "chunk", h.Chunk, "unit", sv.unit, "off", off, "err", err)
		default:
			g.bad, g.ok = bad, true
			if len(bad) > 0 && x.d.ReportCorrupt != nil {
				x.d.ReportCorrupt(h.Chunk, sv.node, h.Version, bad)
			}
		}
	}
	if code == nil {
		// A copy: survivors in order, each for what is still missing.
		rest := need
		for i := range st.survivors {
			if len(rest) == 0 {
				break
			}
			if st.survivors[i].failed {
				continue
			}
			take(i)
			g := &gots[i]
			if !g.ok {
				continue
			}
			var still extent.List
			for _, e := range rest {
				for _, s := range extent.Segments(e.Off, e.Len, []extent.List{g.bad}, nil) {
					if len(s.Good) == 0 {
						still = still.Add(s.Off, s.Len)
						continue
					}
					copy(out[s.Off-off:s.End()-off], (*g.buf)[s.Off-off:])
				}
			}
			rest = still
		}
		if len(rest) > 0 {
			return fmt.Errorf("no survivor holds %v of chunk %v intact at version %d", rest, h.Chunk, h.Version)
		}
		return nil
	}
	// A stripe unit: every survivor at once, then K intact ones per stretch.
	var wg sync.WaitGroup
	for i := range st.survivors {
		if !st.survivors[i].failed {
			wg.Add(1)
			go func() { defer wg.Done(); take(i) }()
		}
	}
	wg.Wait()
	bad := make([]extent.List, len(gots))
	absent := make([]bool, len(gots))
	for i, g := range gots {
		bad[i], absent[i] = g.bad, !g.ok
	}
	shards := make([][]byte, code.Units())
	for _, e := range need {
		for _, s := range extent.Segments(e.Off, e.Len, bad, absent) {
			if len(s.Good) < code.K {
				return fmt.Errorf("only %d units hold %v of stripe group %v intact at version %d, %d needed", len(s.Good), s.Extent, h.Chunk, h.Version, code.K)
			}
			clear(shards)
			for _, i := range s.Good[:code.K] {
				shards[st.survivors[i].unit] = (*gots[i].buf)[s.Off-off : s.End()-off]
			}
			if err := reconstructInto(code, shards, int(h.Unit), out[s.Off-off:s.End()-off]); err != nil {
				return fmt.Errorf("decoding %v of unit %d of stripe group %v: %w", s.Extent, h.Unit, h.Chunk, err)
			}
		}
	}
	return nil
}

// reconstructInto decodes unit u into dst from the K shards present.
func reconstructInto(code *erasure.Code, shards [][]byte, u int, dst []byte) error {
	shards[u] = dst[:0]
	if err := code.ReconstructOne(shards, u); err != nil {
		return err
	}
	if len(dst) > 0 && &shards[u][0] != &dst[0] {
		copy(dst, shards[u]) // the decoder took other memory
	}
	return nil
}

// heal replaces, in place, the blocks of this member's copy that fail
// their checksums (RepairHeal): the member holds the chunk's version, and
// every other block of it stays as it is. Copies that each have a
// different bad block thus heal each other.
func (x *repairer) heal(st *repairState, code *erasure.Code) (store.Info, error) {
	h := &st.h
	info, err := x.d.Store.Stat(h.Chunk)
	if err != nil {
		return store.Info{}, storeError(err)
	}
	if info.Version != h.Version {
		return store.Info{}, wire.Errorf(wire.StatusStale, "healing chunk %v at version %d, this copy is at %d", h.Chunk, h.Version, info.Version)
	}
	bad, err := x.d.Store.BadBlocks(h.Chunk)
	switch {
	case errors.Is(err, store.ErrUnreadable):
		return store.Info{}, errReplaceWhole // nothing to heal block by block
	case err != nil && !errors.Is(err, store.ErrCorrupt):
		return store.Info{}, storeError(err)
	}
	if len(bad) == 0 {
		return info, nil // reported corrupt, but whole (or healed meanwhile)
	}
	bp := x.pieces.Get().(*[]byte)
	defer x.pieces.Put(bp)
	for p := bad[0].Off / repairPiece * repairPiece; p < bad[len(bad)-1].End(); p += repairPiece {
		n := min(repairPiece, info.Length-p)
		need := bad.Clip(p, n)
		if len(need) == 0 {
			continue
		}
		buf := (*bp)[:n]
		if err := x.gather(st, code, p, n, need, buf); err != nil {
			return store.Info{}, wire.Errorf(wire.StatusReplica, "healing unit %d of chunk %v: %v", h.Unit, h.Chunk, err)
		}
		for _, e := range need {
			if _, err := x.d.Store.Heal(h.Chunk, h.Version, e.Off, buf[e.Off-p:e.End()-p]); err != nil {
				return store.Info{}, storeError(err)
			}
		}
	}
	if bad, err := x.d.Store.BadBlocks(h.Chunk); err != nil {
		return store.Info{}, wire.Errorf(wire.StatusIO, "chunk %v still has bad blocks %v after healing: %v", h.Chunk, bad, err)
	}
	x.d.Logger.Info("repair: healed bad blocks", "chunk", h.Chunk, "unit", h.Unit, "version", h.Version, "bad", bad)
	return info, nil
}
