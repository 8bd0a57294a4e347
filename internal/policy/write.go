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
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// writer is what every write execution context of the node shares: the
// reservations, host-memory budget and buffers, parity aggregations, and
// the goroutines finishing writes in the background. Each kind of write
// is its own context with its own state, matched on the header's mode and
// flags (seed 000: "the request carries information on how to progress the
// communication"; writeContexts lists them):
//
//   - stream (ring, tree, flat data): capability checked in the header
//     handler, every packet placed and forwarded to the children as it
//     arrives (streamWrites, write_stream.go);
//   - host (host-ring, host-tree, rpc, per-chunk encode): store-and-forward,
//     the CPU-centric baseline (hostWrites, host.go);
//   - pull (rpc-pull): the node pulls the data from the client's
//     registered buffer with one-sided READs (pullWrites, pull.go);
//   - reserve: a flat write's version reservation at rank 0 (reserveWrites,
//     reserve.go);
//   - encode: an erasure-coded data unit that stores every packet and sends
//     its partial parities (encodeWrites, encode.go);
//   - parity: a partial parity joining its write's aggregation at a parity
//     unit (parityWrites, ec.go).
//
// The rules every kind shares stay here, called by each: parsing and the
// capability check (admitWrite, check), "already applied" (alreadyApplied),
// the store write's epoch (planned), and the outcome (publish, abort).
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

// Where a write header's mode and flags are (wire.AppendWrite's layout):
// the bytes the write contexts match on. TestContextsMatchHeaders checks
// them against the encoder.
const (
	writeModeAt  = 6
	writeFlagsAt = 7
)

// writeContexts are the write execution contexts in matching order: the
// engine gives a write to the first whose header fields it carries.
// Streaming comes last and takes the rest, malformed headers included
// (its header handler refuses them).
func (x *writer) writeContexts() []*engine.Context {
	mode := func(m plan.Mode) engine.Field {
		return engine.Field{At: writeModeAt, Mask: 0xff, Value: byte(m)}
	}
	flag := func(f uint8) engine.Field { return engine.Field{At: writeFlagsAt, Mask: f, Value: f} }
	return []*engine.Context{
		writeContext("write-host", hostWrites{x}, mode(plan.Host)),
		writeContext("write-pull", pullWrites{x}, mode(plan.Pull)),
		writeContext("write-reserve", reserveWrites{x}, mode(plan.Stream), flag(wire.FlagReserve)),
		writeContext("write-parity", parityWrites{x}, mode(plan.Stream), flag(wire.FlagPartial)),
		writeContext("write-encode", encodeWrites{x}, mode(plan.Stream), flag(wire.FlagEncode)),
		writeContext("write-stream", streamWrites{x}),
	}
}

// writeKind is one kind of write request's handlers; its state is its
// own (the request's State, set by its header handler).
type writeKind interface {
	header(r *engine.Request, hdr []byte) error
	payload(r *engine.Request, p *fabric.Packet) error
	completion(r *engine.Request)
	cleanup(r *engine.Request, reason error)
}

// placing is a writeKind whose data packets are received in place, in
// the chunk file's mapped pages (engine.Handlers.Direct).
type placing interface {
	direct(state any, off int64, n int) []byte
	directDone(state any)
}

// writeContext is the execution context of one kind of write.
func writeContext(name string, k writeKind, match ...engine.Field) *engine.Context {
	c := &engine.Context{Name: name, Class: wire.OpWrite, Match: match, Handlers: engine.Handlers{
		Header:     k.header,
		Payload:    k.payload,
		Completion: k.completion,
		Cleanup:    k.cleanup,
	}}
	if p, ok := k.(placing); ok {
		c.Direct, c.DirectDone = p.direct, p.directDone
	}
	return c
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

// stored is what a write placing data in this node's store holds,
// whatever its kind: the store write and what a failure must record. Only
// fixed-size values survive a header handler: the header packet's bytes
// are released when it returns. Write states are not pooled: the fabric's
// reader may still be finishing a direct placement when a failed request
// is cleaned up, and must find the state intact (the store makes the late
// placement harmless).
type stored struct {
	chunk    ids.ChunkID
	chunkOff int64 // where the write starts in the chunk
	length   int64
	w        *store.Write
	// head: this node chose the write's version (rank 0), so it records
	// a doubt if the write fails after a replica may have committed it.
	head bool
	// flat: a flat write's data at rank 0. The client writes the other
	// replicas itself, so any failure here may leave them ahead.
	flat bool
}

func storedOf(h *wire.WriteHeader) stored {
	return stored{chunk: h.Chunk, chunkOff: int64(h.Off), length: int64(h.Len)}
}

func newWriter(d *Deps) *writer {
	return &writer{d: d, reserved: newReservations(d.ReserveTimeout, d.Logger), aggs: newAggregations(d.Accumulators)}
}

// parseWrite parses a write header packet.
func parseWrite(hdr []byte, h *wire.WriteHeader) error {
	if err := wire.ParseWrite(hdr, h); err != nil {
		return wire.Errorf(wire.StatusBadRequest, "%v", err)
	}
	return nil
}

// admitWrite parses a write header and checks it (check): the first step
// of every kind's header handler but host mode's, which checks again once
// the data is in.
func (x *writer) admitWrite(hdr []byte) (h wire.WriteHeader, c capability.Capability, err error) {
	if err = parseWrite(hdr, &h); err == nil {
		err = x.check(&h, &c)
	}
	return h, c, err
}

// inBounds refuses a data packet beyond what the header declared (a
// zero-length write carries no data packet at all): the first check of
// every kind's payload handler.
func inBounds(p *fabric.Packet, length int64) error {
	if end := p.Off + int64(len(p.Data)); end > length || (length == 0 && p.Off == 0) {
		return wire.Errorf(wire.StatusBadRequest, "data packet [%d, %d) beyond the write's %d bytes", p.Off, end, length)
	}
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
		if h.Addrs.Len() != 1 || h.Rank != 0 || h.Version != 0 || h.Mode != plan.Stream || h.Flags != wire.FlagRaw {
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
	flat, ec := h.Strategy == plan.Flat, h.Strategy == plan.EC
	switch {
	case h.Strategy.Fanout() != c.Fanout:
		return wire.Errorf(wire.StatusAuth, "chunk %v is %s; a %v write is not allowed", h.Chunk, c.Fanout, h.Strategy)
	case !flat && !ec && rank != 0 && !sealed:
		return wire.Errorf(wire.StatusAuth, "replica rank %d of chunk %v takes a %v write only as forwarded by rank %d's node",
			rank, h.Chunk, h.Strategy, h.Strategy.Parent(rank))
	case !ec && h.Flags&(wire.FlagEncode|wire.FlagPartial) != 0:
		return wire.Errorf(wire.StatusBadRequest, "encode and partial-parity flags are for erasure-coded writes")
	case ec:
		if err := checkEC(h, c, rank, sealed); err != nil {
			return err
		}
	}
	reserve := h.Flags&wire.FlagReserve != 0
	switch h.Strategy {
	case plan.Ring, plan.Tree:
		// Rank 0 assigns the version; every other rank is told it.
		if reserve || (rank == 0) != (h.Version == 0) {
			return wire.Errorf(wire.StatusBadRequest, "version %d at rank %d of a %v write", h.Version, rank, h.Strategy)
		}
	case plan.Flat, plan.EC:
		// The client reserves the version at rank 0, then writes every
		// replica (unit) with it.
		// (A reservation with a version releases it: see reserve.go.)
		if reserve && (rank != 0 || h.Mode != plan.Stream) || !reserve && h.Version == 0 {
			return wire.Errorf(wire.StatusBadRequest, "%v write: version %d at rank %d (reserve %v)", h.Strategy, h.Version, rank, reserve)
		}
		if h.Mode != plan.Stream && !(h.Mode == plan.Host && h.Flags&wire.FlagEncode != 0) {
			return wire.Errorf(wire.StatusBadRequest, "%v writes stream", h.Strategy)
		}
	default:
		return wire.Errorf(wire.StatusBadRequest, "unknown replication strategy %v", h.Strategy)
	}
	if h.Mode == plan.Pull && (c.NReplicas != 1 || h.Strategy != plan.Ring) {
		return wire.Errorf(wire.StatusBadRequest, "pulled writes are single-replica")
	}
	return nil
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
	case h.Mode != plan.Stream || h.Flags&wire.FlagReserve != 0:
		return wire.Errorf(wire.StatusBadRequest, "partial parities stream")
	}
	return nil
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

// errAborted is the reason a forward stops when its request is cleaned up.
var errAborted = errors.New("request aborted")
