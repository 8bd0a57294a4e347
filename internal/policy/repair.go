package policy

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// repairer rebuilds lost units of erasure-coded stripe groups at the node
// that will hold them (seed 003's receive-and-decode, with the healing at
// the owner). In distributed mode every survivor multiplies its unit by
// its decoding coefficient (a scaled read) and this node XORs the K
// products, so the decoding work is spread over the survivors; in gather
// mode the survivors send their units and this node decodes alone (the
// baseline). Either way the unit is rebuilt piece by piece into the store
// (bounded memory), committed at the group's version, and read back
// against its fresh checksums before the reply. A replicated chunk is
// copied the same way from one survivor (copy mode). Fence mode raises a
// member's fence and reports its state; drop mode discards a copy of a
// chunk no write to which completed (docs/failures.md).
type repairer struct {
	d      *Deps
	codes  *erasure.Codes
	slots  chan struct{}
	pieces sync.Pool // of *[]byte, repairPiece bytes: survivors' pieces gathered block by block
}

// repairPiece is how much of a unit is rebuilt per round.
const repairPiece = readPiece

type repairState struct {
	h         wire.RepairHeader // Cap, Survivors and Addrs copied out of the packet
	cap       capability.Capability
	survivors []survivor
	addrs     []string
}

// survivor is a member a repair takes bytes from.
type survivor struct {
	unit int // index in the replica set or stripe group
	node ids.NodeID
	addr string
	// failed: it could not serve (down, another version): not asked again
	// during this repair. Bad blocks are not a failure: only those blocks
	// come from elsewhere.
	failed bool
}

// Where a repair header's mode is (wire.AppendRepair's layout): the byte
// the repair contexts match on.
const repairModeAt = 1

// contexts are the repair execution contexts: fencing a member and
// dropping its copy are cheap, survivorless requests with contexts of
// their own; every other repair mode rebuilds (or copies) a unit.
func (x *repairer) contexts() []*engine.Context {
	mode := func(m wire.RepairMode) []engine.Field {
		return []engine.Field{{At: repairModeAt, Mask: 0xff, Value: byte(m)}}
	}
	return []*engine.Context{
		{Name: "repair-fence", Class: wire.OpRepair, Match: mode(wire.RepairFence), Handlers: engine.Handlers{
			Header: x.memberHeader, Completion: x.fence}},
		{Name: "repair-drop", Class: wire.OpRepair, Match: mode(wire.RepairDrop), Handlers: engine.Handlers{
			Header: x.memberHeader, Completion: x.dropCompletion}},
		{Name: "rebuild", Class: wire.OpRepair, Handlers: engine.Handlers{
			Header: x.rebuildHeader, Completion: x.rebuildCompletion}},
	}
}

// admitRepair parses and authenticates a repair header: every repair
// context's first step.
func (x *repairer) admitRepair(hdr []byte) (*repairState, error) {
	st := &repairState{}
	h := &st.h
	if err := wire.ParseRepair(hdr, h); err != nil {
		return nil, wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	c := &st.cap
	if _, err := x.d.Keys.Open(h.Cap, x.d.Now(), c); err != nil {
		return nil, wire.Errorf(wire.StatusAuth, "%v", err)
	}
	if err := c.Allows(capability.Repair, h.Chunk, 0, h.Len); err != nil {
		return nil, wire.Errorf(wire.StatusAuth, "%v", err)
	}
	switch {
	case c.RankOf(x.d.Self()) != int(h.Unit):
		return nil, wire.Errorf(wire.StatusAuth, "node %v is not unit %d of chunk %v", x.d.Self(), h.Unit, h.Chunk)
	case h.Addrs.Len() != int(c.NReplicas):
		return nil, wire.Errorf(wire.StatusBadRequest, "%d addresses for %d units", h.Addrs.Len(), c.NReplicas)
	}
	return st, nil
}

// memberHeader admits a fence or a drop: cheap, no repair slot.
func (x *repairer) memberHeader(r *engine.Request, hdr []byte) error {
	st, err := x.admitRepair(hdr)
	if err != nil {
		return err
	}
	r.State = st
	return nil
}

func (x *repairer) rebuildHeader(r *engine.Request, hdr []byte) error {
	st, err := x.admitRepair(hdr)
	if err != nil {
		return err
	}
	h, c := &st.h, &st.cap
	ec := c.Fanout == plan.FanoutEC
	switch {
	case h.Mode == wire.RepairCopy && ec:
		return wire.Errorf(wire.StatusBadRequest, "chunk %v is erasure-coded: its units are rebuilt, not copied", h.Chunk)
	case h.Mode != wire.RepairCopy && !ec:
		return wire.Errorf(wire.StatusBadRequest, "chunk %v is not erasure-coded", h.Chunk)
	case h.Mode != wire.RepairCopy && len(h.Survivors) < int(c.Data):
		return wire.Errorf(wire.StatusBadRequest, "%d survivors for %d units of which %d data", len(h.Survivors), c.NReplicas, c.Data)
	case h.Version == 0:
		return wire.Errorf(wire.StatusBadRequest, "rebuilding version 0")
	}
	select {
	case x.slots <- struct{}{}:
	default:
		return wire.Errorf(wire.StatusBusy, "repairs in progress on this node")
	}
	for i := range h.Addrs.Len() {
		st.addrs = append(st.addrs, string(h.Addrs.At(i)))
	}
	for _, u := range h.Survivors {
		st.survivors = append(st.survivors, survivor{unit: int(u), node: c.Replicas[u]})
	}
	h.Cap = append([]byte(nil), h.Cap...)
	h.Survivors, h.Addrs = nil, wire.Addrs{}
	r.State = st
	return nil
}

// fence raises the member's fence and reports its state.
func (x *repairer) fence(r *engine.Request) {
	st := r.State.(*repairState)
	go func() {
		fs, err := x.d.Store.Fence(st.h.Chunk, st.cap.Epoch)
		if err == nil && fs.Doubt && st.h.Version != 0 && fs.Info.Version == st.h.Version {
			// Every member holds this version now: the doubt is over.
			if err = x.d.Store.ResolveDoubt(st.h.Chunk, st.h.Version); err == nil {
				fs.Doubt = false
			}
		}
		if err != nil {
			r.Finish(wire.AppendError(nil, storeError(err)))
			return
		}
		// A copy known to hold bad blocks says so: the reconciliation
		// heals it even if meta has not heard yet.
		corrupt := len(x.d.Store.Suspect(st.h.Chunk, fs.Info.Version)) > 0
		r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: fs.Info.Version,
			ChunkLen: uint64(fs.Info.Length), Partial: fs.Doubt, Corrupt: corrupt}, nil, ""))
	}()
}

func (x *repairer) dropCompletion(r *engine.Request) {
	st := r.State.(*repairState)
	go func() {
		if err := x.drop(st); err != nil {
			r.Finish(wire.AppendError(nil, err))
			return
		}
		r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK}, nil, ""))
	}()
}

func (x *repairer) rebuildCompletion(r *engine.Request) {
	st := r.State.(*repairState)
	go func() {
		defer func() { <-x.slots }()
		info, err := x.rebuild(st)
		if err != nil {
			r.Finish(wire.AppendError(nil, err))
			return
		}
		r.Finish(wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length)}, nil, ""))
	}()
}

// drop discards this member's copy for a reconciliation that found no
// complete write to the chunk: only under the reconciliation's fence,
// and only if the member still holds what fencing found.
func (x *repairer) drop(st *repairState) error {
	if err := x.d.Store.DropAt(st.h.Chunk, st.cap.Epoch, st.h.Version); err != nil {
		return storeError(err)
	}
	return nil
}

// errReplaceWhole: a member asked to heal holds a copy that cannot be
// healed block by block; it is rebuilt whole instead.
var errReplaceWhole = errors.New("copy must be replaced whole")

func (x *repairer) rebuild(st *repairState) (store.Info, error) {
	h, c := &st.h, &st.cap
	k := int(c.Data)
	var code *erasure.Code
	var err error
	if h.Mode == wire.RepairCopy {
		k = 1
	} else if code, err = x.codes.Get(k, int(c.NReplicas)-k); err != nil {
		return store.Info{}, wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	for i := range st.survivors {
		sv := &st.survivors[i]
		if sv.addr, err = x.d.peerAddr(sv.node, []byte(st.addrs[sv.unit]), fmt.Sprintf("unit %d's node", sv.unit)); err != nil {
			return store.Info{}, err
		}
	}
	// No write planned before this repair may land here from now on; and
	// a repair planned before the member's fence (a newer one has run)
	// must not touch its copy.
	fs, err := x.d.Store.Fence(h.Chunk, c.Epoch)
	if err != nil {
		return store.Info{}, storeError(err)
	}
	if c.Epoch < fs.Fence {
		return store.Info{}, wire.Errorf(wire.StatusFenced, "chunk %v is fenced at epoch %d, this repair was planned on %d", h.Chunk, fs.Fence, c.Epoch)
	}
	if h.Flags&wire.RepairHeal != 0 {
		info, err := x.heal(st, code)
		if !errors.Is(err, errReplaceWhole) {
			return info, err
		}
		x.d.Logger.Warn("repair: the copy to heal is unreadable as a whole; replacing it", "chunk", h.Chunk, "unit", h.Unit)
	}
	var coef []byte
	if h.Mode == wire.RepairDistributed {
		units := make([]int, k)
		for i := range units {
			units[i] = st.survivors[i].unit
		}
		if coef, err = code.DecodeCoefficients(int(h.Unit), units); err != nil {
			return store.Info{}, wire.Errorf(wire.StatusBadRequest, "%v", err)
		}
	}
	// What this node holds of the unit (stale, corrupt or half-written)
	// is replaced whole.
	if err := x.d.Store.Delete(h.Chunk); err != nil {
		return store.Info{}, storeError(err)
	}
	w, err := x.d.Store.BeginFollow(h.Chunk, 0, int64(h.Len), h.Version, 0)
	if err != nil {
		return store.Info{}, storeError(err)
	}
	if err := planned(w, c.Epoch); err != nil {
		return store.Info{}, err
	}
	// Two rounds in flight: the next piece is fetched from the first K
	// survivors (the first one, for a copy) while this one is combined and
	// stored. A piece they cannot give whole — a block failing its
	// checksum, a survivor gone — is gathered from every survivor instead,
	// block by block from those intact there.
	type round struct {
		off, n  int64
		bufs    [][]byte
		regions []*fabric.Region
		failed  bool
	}
	ep := x.d.Forward.Endpoint()
	free := make(chan *round, 2)
	for range 2 {
		rd := &round{bufs: make([][]byte, k), regions: make([]*fabric.Region, k)}
		for i := range k {
			rd.bufs[i] = make([]byte, repairPiece)
			rd.regions[i] = ep.Register(rd.bufs[i], fabric.RemoteWrite)
			defer ep.Deregister(rd.regions[i])
		}
		free <- rd
	}
	fetched := make(chan *round, 2)
	stop := make(chan struct{})
	defer close(stop)
	var fastBroken atomic.Bool // a first-K survivor failed: gather the rest
	go func() {
		defer close(fetched)
		for off := int64(0); off < int64(h.Len); off += repairPiece {
			var rd *round
			select {
			case rd = <-free:
			case <-stop:
				return
			}
			rd.off, rd.n, rd.failed = off, min(repairPiece, int64(h.Len)-off), fastBroken.Load()
			if !rd.failed {
				bad := make([]bool, k)
				var wg sync.WaitGroup
				for i := range k {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rh := wire.ReadHeader{Chunk: h.Chunk, Off: uint64(rd.off), Len: uint64(rd.n), RegionKey: rd.regions[i].Key(), Cap: h.Cap}
						if coef != nil {
							rh.Scaled, rh.Coef = true, coef[i]
						}
						sv := &st.survivors[i]
						blocks, err := x.fetch(sv.addr, &rh, h.Version, rd.bufs[i][:rd.n])
						bad[i] = err != nil || len(blocks) > 0
						if err != nil && !softFailure(err) {
							fastBroken.Store(true)
							x.d.Logger.Warn("repair: a survivor failed; gathering from the others", "chunk", h.Chunk, "unit", sv.unit, "addr", sv.addr, "err", err)
						}
					}()
				}
				wg.Wait()
				rd.failed = slices.Contains(bad, true)
			}
			fetched <- rd
		}
	}()
	out := make([]byte, repairPiece)
	var shards [][]byte
	if code != nil {
		shards = make([][]byte, code.Units())
	}
	whole := make(extent.List, 1)
	for rd := range fetched {
		res := out[:rd.n]
		switch {
		case rd.failed:
			whole[0] = extent.Extent{Off: rd.off, Len: rd.n}
			if err := x.gather(st, code, rd.off, rd.n, whole, res); err != nil {
				w.Abort()
				return store.Info{}, wire.Errorf(wire.StatusReplica, "rebuilding unit %d of chunk %v: %v", h.Unit, h.Chunk, err)
			}
		case code == nil: // a copy
			res = rd.bufs[0][:rd.n]
		case coef != nil:
			copy(res, rd.bufs[0][:rd.n])
			for i := 1; i < k; i++ {
				erasure.XOR(res, rd.bufs[i][:rd.n])
			}
		default:
			clear(shards)
			for i := range k {
				shards[st.survivors[i].unit] = rd.bufs[i][:rd.n]
			}
			if err := reconstructInto(code, shards, int(h.Unit), res); err != nil {
				w.Abort()
				return store.Info{}, wire.Errorf(wire.StatusIO, "decoding unit %d of chunk %v: %v", h.Unit, h.Chunk, err)
			}
		}
		if err := w.Place(rd.off, res); err != nil {
			w.Abort()
			return store.Info{}, storeError(err)
		}
		free <- rd
	}
	if err := w.Sync(); err != nil {
		w.Abort()
		return store.Info{}, storeError(err)
	}
	info, err := w.Commit()
	if err != nil {
		return store.Info{}, storeError(err)
	}
	// Read the rebuilt unit back against the checksums just stored.
	if _, err := x.d.Store.Verify(h.Chunk); err != nil {
		return store.Info{}, wire.Errorf(wire.StatusIO, "rebuilt unit %d of chunk %v does not verify: %v", h.Unit, h.Chunk, err)
	}
	return info, nil
}
