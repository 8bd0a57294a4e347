package policy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/admit"
	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// writer is the write execution context. One message class, several ways
// of handling it, chosen by the request's own header (seed 000: "the
// request carries information on how to progress the communication"):
//
//   - stream mode (ring, tree, flat): capability checked in the header
//     handler, every packet placed and forwarded to the children as it
//     arrives (write.go);
//   - host mode (host-ring, host-tree, rpc): store-and-forward, the
//     CPU-centric baseline (host.go);
//   - pull mode (rpc-pull): the node pulls the data from the client's
//     registered buffer with one-sided READs (pull.go);
//   - flat writes reserve their version at rank 0 first (reserve.go).
type writer struct {
	d         *Deps
	reserved  *reservations
	hostBytes atomic.Int64 // bytes buffered by host-mode writes
	hostBufs  bufPools
	bg        sync.WaitGroup // writes finishing or aborting in the background
	codes     erasure.Codes
	outBufs   outBufs
	aggs      *aggregations
}

// background runs fn off the worker, tracked so close can wait for it.
// Only handlers call it, so never after the engine has closed.
func (x *writer) background(fn func()) {
	x.bg.Add(1)
	go func() {
		defer x.bg.Done()
		fn()
	}()
}

func (x *writer) close(timeout time.Duration) error {
	x.aggs.failAll()
	done := make(chan struct{})
	go func() {
		x.bg.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-time.After(timeout):
		err = fmt.Errorf("policy: writes still finishing after %s", timeout)
	}
	x.reserved.closeAll()
	return err
}

// writeState is the per-request state (the sPIN write descriptor). Only
// fixed-size values survive the header handler: the header packet's
// bytes are released when it returns.
type writeState struct {
	mode     wire.Mode
	chunk    ids.ChunkID
	chunkOff int64 // where the write starts in the chunk
	length   int64
	got      int64 // stream mode: data bytes received
	w        *store.Write
	fwds     []*forward // stream mode: one per child (none at a leaf)
	reserve  bool       // a flat write's version reservation
	// head: this node chose the write's version (rank 0), so it records
	// a doubt if the write fails after a replica may have committed it.
	head bool
	// flat: a flat write's data at rank 0. The client writes the other
	// replicas itself, so any failure here may leave them ahead.
	flat bool

	host *hostState // host mode
	pull *pullState // pull mode

	enc *encodeState // an erasure-coded data unit sending partial parities
	agg *aggregation // a partial parity for a parity unit
	src uint8        // the data unit whose partial parity agg gets
}

func newWriter(d *Deps) *writer {
	return &writer{d: d, reserved: newReservations(d.ReserveTimeout, d.Logger), aggs: newAggregations(d.Accumulators)}
}

func (x *writer) context() *engine.Context {
	return &engine.Context{Name: "write", Class: wire.OpWrite, Handlers: engine.Handlers{
		Header:     x.header,
		Payload:    x.payload,
		Completion: x.completion,
		Cleanup:    x.cleanup,
		Direct:     x.direct,
		DirectDone: x.directDone,
	}}
}

// header admits a write. Its state is not pooled: the fabric's reader may
// still be finishing a direct placement when a failed request is cleaned
// up, and must find the state intact (the store makes the late placement
// harmless).
func (x *writer) header(r *engine.Request, hdr []byte) error {
	var h wire.WriteHeader
	if err := wire.ParseWrite(hdr, &h); err != nil {
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	st := &writeState{mode: h.Mode, chunk: h.Chunk, chunkOff: int64(h.Off), length: int64(h.Len)}
	if h.Mode == wire.ModeHost {
		// Store-and-forward validates only once the whole request is in.
		if err := x.hostHeader(st, &h, hdr); err != nil {
			return err
		}
		r.State = st
		return nil
	}
	var c capability.Capability
	if err := x.check(&h, &c); err != nil {
		return err
	}
	var err error
	switch {
	case h.Flags&wire.FlagReserve != 0 && h.Version != 0:
		x.reserved.release(h.Chunk, h.Version, h.WriteID, c.Client)
		return &engine.Answered{Reply: wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: h.Version}, nil, "released")}
	case h.Flags&wire.FlagReserve != 0:
		err = x.reserveHeader(st, &h, &c)
	case h.Mode == wire.ModePull:
		err = x.pullHeader(st, &h, c.Epoch)
	default:
		err = x.streamHeader(st, &h, &c)
	}
	if err != nil {
		return err
	}
	r.State = st
	return nil
}

// check authenticates a write header and checks it is consistent: the
// capability, this node's rank, the version rules of the strategy. Every
// mode runs it — stream mode at once, host mode after buffering.
func (x *writer) check(h *wire.WriteHeader, c *capability.Capability) error {
	if h.Flags&wire.FlagRaw != 0 {
		if !x.d.AllowRaw {
			return wire.Errorf(wire.StatusAuth, "raw (unauthenticated) writes are disabled on this node")
		}
		if h.Addrs.Len() != 1 || h.Rank != 0 || h.Version != 0 || h.Mode != wire.ModeStream || h.Flags != wire.FlagRaw {
			return wire.Errorf(wire.StatusBadRequest, "raw writes are single-replica streaming writes")
		}
		return nil
	}
	// Authentication: no round trip, no per-client state.
	if _, err := x.d.Keys.Open(h.Cap, x.d.Now(), c); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	if err := c.Allows(capability.Write, h.Chunk, h.Off, h.Len); err != nil {
		return wire.Errorf(wire.StatusAuth, "%v", err)
	}
	rank := c.RankOf(x.d.Self())
	if rank != int(h.Rank) {
		return wire.Errorf(wire.StatusAuth, "node %v is not replica rank %d of chunk %v", x.d.Self(), h.Rank, h.Chunk)
	}
	if h.Addrs.Len() != int(c.NReplicas) {
		return wire.Errorf(wire.StatusBadRequest, "%d replica addresses for %d replicas", h.Addrs.Len(), c.NReplicas)
	}
	// Who may write this replica: the client only at rank 0, unless the
	// file is client-replicated (flat); below rank 0 only another node,
	// whose seal a client cannot make. Otherwise a client could send two
	// replicas different bytes as the same version.
	sealed := h.Flags&wire.FlagSealed != 0 && x.d.Keys.CheckSeal(h.Sealed, h.Seal)
	flat, ec := h.Strategy == wire.StrategyFlat, h.Strategy == wire.StrategyEC
	switch {
	case flat != (c.Fanout == capability.FanoutClient) || ec != (c.Fanout == capability.FanoutEC):
		return wire.Errorf(wire.StatusAuth, "chunk %v is %s; a %v write is not allowed", h.Chunk, fanoutName(c.Fanout), h.Strategy)
	case !flat && !ec && rank != 0 && !sealed:
		return wire.Errorf(wire.StatusAuth, "replica rank %d of chunk %v takes a %v write only as forwarded by rank %d's node",
			rank, h.Chunk, h.Strategy, parentRank(h.Strategy, rank))
	case !ec && h.Flags&(wire.FlagEncode|wire.FlagPartial) != 0:
		return wire.Errorf(wire.StatusBadRequest, "encode and partial-parity flags are for erasure-coded writes")
	case ec:
		if err := checkEC(h, c, rank, sealed); err != nil {
			return err
		}
	}
	reserve := h.Flags&wire.FlagReserve != 0
	switch h.Strategy {
	case wire.StrategyRing, wire.StrategyTree:
		// Rank 0 assigns the version; every other rank is told it.
		if reserve || (rank == 0) != (h.Version == 0) {
			return wire.Errorf(wire.StatusBadRequest, "version %d at rank %d of a %v write", h.Version, rank, h.Strategy)
		}
	case wire.StrategyFlat, wire.StrategyEC:
		// The client reserves the version at rank 0, then writes every
		// replica (unit) with it.
		// (A reservation with a version releases it: see reserve.go.)
		if reserve && (rank != 0 || h.Mode != wire.ModeStream) || !reserve && h.Version == 0 {
			return wire.Errorf(wire.StatusBadRequest, "%v write: version %d at rank %d (reserve %v)", h.Strategy, h.Version, rank, reserve)
		}
		if h.Mode != wire.ModeStream && !(h.Mode == wire.ModeHost && h.Flags&wire.FlagEncode != 0) {
			return wire.Errorf(wire.StatusBadRequest, "%v writes stream", h.Strategy)
		}
	default:
		return wire.Errorf(wire.StatusBadRequest, "unknown replication strategy %v", h.Strategy)
	}
	if h.Mode == wire.ModePull && (c.NReplicas != 1 || h.Strategy != wire.StrategyRing) {
		return wire.Errorf(wire.StatusBadRequest, "pulled writes are single-replica")
	}
	return nil
}

func fanoutName(f capability.Fanout) string {
	switch f {
	case capability.FanoutClient:
		return "client-replicated"
	case capability.FanoutEC:
		return "erasure-coded"
	}
	return "node-replicated"
}

// checkEC checks the unit-specific rules of an erasure-coded write: only
// data units encode, only parity units take partial parities, and those
// only from a data unit's node.
func checkEC(h *wire.WriteHeader, c *capability.Capability, rank int, sealed bool) error {
	k := int(c.Data)
	switch {
	case h.Flags&wire.FlagEncode != 0 && (rank >= k || h.Flags&wire.FlagReserve != 0):
		return wire.Errorf(wire.StatusBadRequest, "unit %d of chunk %v is not a data unit (%d data units) and cannot encode", rank, h.Chunk, k)
	case h.Flags&wire.FlagPartial == 0:
		return nil
	case rank < k:
		return wire.Errorf(wire.StatusBadRequest, "unit %d of chunk %v is a data unit, not a parity unit", rank, h.Chunk)
	case int(h.Src) >= k:
		return wire.Errorf(wire.StatusBadRequest, "partial parity from unit %d of chunk %v, which is not a data unit", h.Src, h.Chunk)
	case !sealed:
		return wire.Errorf(wire.StatusAuth, "parity unit %d of chunk %v takes partial parities only from a data unit's node", rank, h.Chunk)
	case h.Mode != wire.ModeStream || h.Flags&wire.FlagReserve != 0:
		return wire.Errorf(wire.StatusBadRequest, "partial parities stream")
	}
	return nil
}

// parentRank is the rank that forwards to rank in strategy s (rank > 0).
func parentRank(s wire.Strategy, rank int) int {
	if s == wire.StrategyTree {
		return (rank - 1) / 2
	}
	return rank - 1
}

// forwardHeader is the sealed header for child rank k.
func (x *writer) forwardHeader(h *wire.WriteHeader, k child, w *store.Write) []byte {
	return wire.SealForward(wire.AppendForward(nil, h, uint8(k.rank), w.Version(), w.Base()), x.d.Keys.Seal)
}

// children resolves the replicas this node forwards to: their rank, node
// id and address — from this node's cluster map, never from the header
// the client wrote (the ids are covered by the capability's MAC).
func (x *writer) children(h *wire.WriteHeader, c *capability.Capability) ([]child, error) {
	return x.resolve(h, c, h.Strategy.Children(int(h.Rank), h.Addrs.Len()), "replica")
}

// resolve turns ranks of h's replica set into children to send to.
func (x *writer) resolve(h *wire.WriteHeader, c *capability.Capability, ranks []int, what string) ([]child, error) {
	var out []child
	for _, rank := range ranks {
		ch := child{rank: rank}
		if c.NReplicas > 0 {
			ch.node = c.Replicas[rank]
		}
		var err error
		if ch.addr, err = x.d.peerAddr(ch.node, h.Addrs.At(rank), what); err != nil {
			return nil, err
		}
		out = append(out, ch)
	}
	return out, nil
}

type child struct {
	rank int
	node ids.NodeID
	addr string
}

// alreadyApplied answers a write this replica has committed before: a
// client's retry after a sibling or descendant refused it busy, or after
// a lost reply. A replica publishes only after its children have, so its
// whole subtree has the write too. Rank 0 (which assigns versions) matches
// its latest version; the others the version they are told.
func (x *writer) alreadyApplied(h *wire.WriteHeader) ([]byte, bool) {
	if h.WriteID == 0 {
		return nil, false
	}
	info, err := x.d.Store.Stat(h.Chunk)
	if err != nil || !(admit.Chunk{Version: info.Version, Tag: info.Tag}).Applied(h.WriteID, h.Version) {
		return nil, false
	}
	return wire.AppendReply(nil, &wire.Reply{Status: wire.StatusOK, Version: info.Version, ChunkLen: uint64(info.Length)}, nil, "already applied"), true
}

// streamHeader opens the store write and starts a forward to each child.
func (x *writer) streamHeader(st *writeState, h *wire.WriteHeader, c *capability.Capability) error {
	if reply, ok := x.alreadyApplied(h); ok {
		return &engine.Answered{Reply: reply}
	}
	kids, err := x.children(h, c)
	if err != nil {
		return err
	}
	var code *erasure.Code
	var units []child
	if h.Flags&wire.FlagEncode != 0 {
		if code, units, err = x.encodeTargets(h, c); err != nil {
			return err
		}
	}
	if h.Flags&wire.FlagPartial != 0 {
		// A partial parity: joins its write's aggregation.
		if st.agg, err = x.join(h, int(c.Data), c.Client, c.Epoch); err != nil {
			return err
		}
		st.src = h.Src
		return nil
	}
	switch {
	case (h.Strategy == wire.StrategyFlat || h.Strategy == wire.StrategyEC) && h.Rank == 0:
		// The data of a flat write whose version rank 0 reserved.
		if st.w, err = x.reserved.take(h.Chunk, h.Version, int64(h.Off), int64(h.Len), h.WriteID); err != nil {
			return err
		}
		st.head, st.flat = true, true
	case h.Version == 0:
		// Rank 0 of a ring or tree chooses the version.
		if st.w, err = x.d.Store.BeginHead(h.Chunk, int64(h.Off), int64(h.Len), h.WriteID); err != nil {
			return storeError(err)
		}
		st.head = true
	default:
		if h.Strategy == wire.StrategyFlat || h.Strategy == wire.StrategyEC {
			// An earlier flat write may not have reached this replica yet:
			// busy, not stale (the store decides the rest).
			if err := awaitPredecessor(x.d.Store, h); err != nil {
				return err
			}
		}
		if st.w, err = x.d.Store.BeginFollow(h.Chunk, int64(h.Off), int64(h.Len), h.Version, h.Base); err != nil {
			return storeError(err)
		}
	}
	if err := planned(st.w, c.Epoch); err != nil {
		st.w = nil
		return err
	}
	st.w.SetTag(h.WriteID)
	for _, k := range kids {
		st.fwds = append(st.fwds, startForward(x.d, k.node, k.addr, k.rank, x.forwardHeader(h, k, st.w), h.Len == 0))
	}
	if code != nil {
		x.startEncode(st, h, code, units)
	}
	return nil
}

// encodeTargets resolves what a data unit needs to send partial
// parities — the code and the parity units' addresses — before it takes
// its reservation or opens its write, so a retryable refusal here (a
// parity unit not yet in the cluster map) leaves both for the retry.
func (x *writer) encodeTargets(h *wire.WriteHeader, c *capability.Capability) (*erasure.Code, []child, error) {
	k := int(c.Data)
	code, err := x.ecCode(k, int(c.NReplicas))
	if err != nil {
		return nil, nil, err
	}
	parity := make([]int, 0, code.M)
	for rank := k; rank < int(c.NReplicas); rank++ {
		parity = append(parity, rank)
	}
	units, err := x.resolve(h, c, parity, "parity unit")
	if err != nil {
		return nil, nil, err
	}
	return code, units, nil
}

// startEncode makes a data unit's write send its partial parities: a
// forward to each parity unit, fed per packet by the payload handler.
func (x *writer) startEncode(st *writeState, h *wire.WriteHeader, code *erasure.Code, units []child) {
	st.enc = &encodeState{code: code, src: int(h.Rank), shards: make([][]byte, 1+code.M)}
	for _, u := range units {
		st.fwds = append(st.fwds, startForward(x.d, u.node, u.addr, u.rank, x.partialHeader(h, u, st.w), h.Len == 0))
	}
}

// planned declares to the store the epoch a write was planned on (its
// capability's), aborting it if the chunk is fenced past that epoch.
func planned(w *store.Write, epoch uint64) error {
	if err := w.Planned(epoch); err != nil {
		w.Abort()
		return storeError(err)
	}
	return nil
}

// awaitPredecessor refuses busy a flat follower's write whose chunk is
// below the write's base (admit.BeginFollow with Wait).
func awaitPredecessor(s *store.Store, h *wire.WriteHeader) error {
	info, err := s.Stat(h.Chunk)
	if err != nil {
		return nil // the store's own begin reports it
	}
	ev := admit.BeginFollow{Version: h.Version, Base: h.Base, Wait: true}
	if _, d := admit.Step(admit.Chunk{ID: h.Chunk, Version: info.Version}, ev); errors.Is(d.Err, admit.ErrBusy) {
		return storeError(d.Err)
	}
	return nil
}

// storeError maps a store (or admission) failure to the status the
// client should see.
func storeError(err error) error {
	switch {
	case errors.Is(err, admit.ErrMismatch):
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	case errors.Is(err, store.ErrBusy), errors.Is(err, store.ErrInDoubt):
		return wire.Errorf(wire.StatusBusy, "%v", err)
	case errors.Is(err, store.ErrStale):
		return wire.Errorf(wire.StatusStale, "%v", err)
	case errors.Is(err, store.ErrFenced):
		return wire.Errorf(wire.StatusFenced, "%v", err)
	case errors.Is(err, store.ErrDeleted):
		return wire.Errorf(wire.StatusGone, "%v", err)
	case errors.Is(err, store.ErrRange), errors.Is(err, store.ErrIncomplete):
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	return wire.Errorf(wire.StatusIO, "%v", err)
}

// direct runs on the fabric's reader: a data packet in the append region
// is received straight into the chunk file's mapped pages. (The store
// makes this safe even while the request is being aborted.)
func (x *writer) direct(state any, off int64, n int) []byte {
	st := state.(*writeState)
	if st.w == nil { // host mode buffers; nothing to place yet
		return nil
	}
	return st.w.DirectBegin(st.chunkOff+off, n)
}

func (x *writer) directDone(state any) { state.(*writeState).w.DirectEnd() }

// payload is the per-packet path: place the packet in the store at its
// offset (usually it is already there: direct placement), then hand it
// to the forwards, which send it to the children at once. Placing first
// means a packet this replica could not store never reaches the replicas
// after it, so a local failure cannot leave them ahead.
func (x *writer) payload(r *engine.Request, p *fabric.Packet) error {
	st := r.State.(*writeState)
	if end := p.Off + int64(len(p.Data)); end > st.length || (st.length == 0 && p.Off == 0) {
		// Beyond what the header declared (a zero-length write carries no
		// data packet at all).
		return wire.Errorf(wire.StatusBadRequest, "data packet [%d, %d) beyond the write's %d bytes", p.Off, end, st.length)
	}
	switch {
	case st.mode == wire.ModeHost:
		st.host.got += int64(copy(st.host.buf[p.Off:], p.Data))
		return nil
	case st.mode == wire.ModePull:
		return wire.Errorf(wire.StatusBadRequest, "a pulled write carries no data packets")
	case st.reserve:
		return wire.Errorf(wire.StatusBadRequest, "a version reservation carries no data packets")
	case st.agg != nil:
		x.aggs.Accumulated.Add(int64(len(p.Data)))
		return st.agg.add(p.Off, p.Data)
	}
	for _, f := range st.fwds {
		if err := f.failed(); err != nil {
			return err // the ring is broken: stop early, the client learns now
		}
	}
	if err := st.w.Place(st.chunkOff+p.Off, p.Data); err != nil {
		return storeError(err)
	}
	st.got += int64(len(p.Data))
	if st.enc != nil {
		return x.encodePacket(st, p)
	}
	for _, f := range st.fwds {
		p.Retain()
		f.push(p)
	}
	return nil
}

// errAborted is the reason a forward stops when its request is cleaned up.
var errAborted = errors.New("request aborted")
