// Package policy holds the storage node's DFS policies written as engine
// handler sets (seed 000 Listing 1): capability authentication in the
// header handler, ring and tree replication that forward every packet to
// the children as it arrives, direct placement of each packet into the
// chunk store at its offset with its block checksum computed on the way,
// and reads served by one-sided WRITEs straight into the client's
// registered buffer. Each kind of request is its own execution context
// with its own state, matched by the engine on the header's fields (op,
// mode, flags; writer lists the write contexts): besides streaming, the
// seed's baselines — store-and-forward in host memory (host.go), pulling
// the data with one-sided READs (pull.go), client-driven flat replication
// (reserve.go) — and erasure coding's encode and parity aggregation
// (encode.go, ec.go); reads (read.go) and repairs (repair.go).
//
// Ordering: the rank-0 replica of a chunk admits one write at a time (the
// store's per-chunk write lock; a second concurrent writer gets a
// retryable busy NACK), assigns it the chunk's next version and forwards
// that version to its children (for flat writes, the client reserves it
// there first). Every other replica accepts a write only if
// it is exactly the version after its own (StatusStale otherwise). So all
// replicas apply the writes of a chunk in one order, and a replica that
// missed a write refuses later ones instead of silently diverging.
//
// Durability: a replica replies OK only after its own data is durable and
// published AND its downstream replica has replied OK, so the head's OK
// means every replica has the write. Data is made durable (Sync) while the
// downstream works, and published (Commit) only after the downstream's OK:
// a write refused downstream (busy, stale, auth) is aborted upstream too
// and leaves no replica ahead of the others.
package policy

import (
	"log/slog"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/store"
	"github.com/sluicefs/sluice/internal/wire"
)

// Deps are what the policies need from the node.
type Deps struct {
	// Self returns this node's id (0 until meta has assigned one, which
	// no capability names, so nothing is accepted before).
	Self    func() ids.NodeID
	Keys    *capability.Keyring
	Store   *store.Store
	Forward *fabric.Pool // connections to other storage nodes
	// ForwardQuota is the receive quota of the node's inbound connections:
	// a forward never holds more packets than that.
	ForwardQuota int
	// ReplyTimeout bounds waiting for a downstream replica. Default 60s.
	ReplyTimeout time.Duration
	// MaxReadLen bounds one read request. Default 16 MiB.
	MaxReadLen int
	// ReadSlots bounds reads served at once (each holds one buffer).
	// Default 32.
	ReadSlots int
	// Export, if set, is the node's exported cache: small reads fill it
	// and their replies carry references to its blocks.
	Export *Export
	// ReplicaAddr maps a node id to its fabric address from this node's
	// view of the cluster map. A forward goes to that address for the next
	// replica's id (which the capability's MAC covers), never to the
	// address the client wrote in the header; a node the map does not know
	// yet gets a retryable busy answer. Nil means "trust the header" (for
	// tools and tests without a cluster map).
	ReplicaAddr func(ids.NodeID) (string, bool)
	// RefreshMap, if set, fetches the cluster map from meta now (bounded
	// in time): used when a replica cannot be reached at the address the
	// map gave, which may be from before that node restarted.
	RefreshMap func()
	// AllowRaw accepts writes without any capability (wire.FlagRaw): the
	// speed-of-light reference for benchmarks. Never set in a normal
	// cluster.
	AllowRaw bool
	// HostBuffer bounds the bytes all store-and-forward (host mode) writes
	// may hold in memory at once. Default 256 MiB.
	HostBuffer int64
	// JoinTimeout is how long a parity unit waits, from the first data
	// unit's partial parity of a write, for the others to begin (they all
	// begin at once); then it refuses the write busy and the client starts
	// it over. Default 2s.
	JoinTimeout time.Duration
	// ReserveTimeout is how long a flat write's version reservation waits
	// for its data. Default 10s.
	ReserveTimeout time.Duration
	// Accumulators is the number of parity accumulator slots (64 KiB
	// each) for erasure-coded writes; past them, aggregation uses host
	// memory (HostBuffer). Default 256.
	Accumulators int
	// ReportCorrupt, if set, passes on to meta that node's copy of chunk
	// at version holds bad, blocks failing their checksums (found by a
	// repair reading it). It must not block.
	ReportCorrupt func(chunk ids.ChunkID, node ids.NodeID, version uint64, bad extent.List)
	// Now returns unix nanoseconds (for capability expiry).
	Now    func() int64
	Logger *slog.Logger
}

// peerAddr is the fabric address of another replica or unit: the one
// this node's cluster map has for node (whose id the capability's MAC
// covers), never the one the client claimed — except without a cluster
// map (tools and tests). A node the map does not know yet is a retryable
// busy answer; what says which role it plays in the message.
func (d *Deps) peerAddr(node ids.NodeID, claimed []byte, what string) (string, error) {
	if d.ReplicaAddr == nil {
		return string(claimed), nil
	}
	a, ok := d.ReplicaAddr(node)
	if !ok {
		return "", wire.Errorf(wire.StatusBusy, "%s %v is not in this node's cluster map yet", what, node)
	}
	return a, nil
}

func (d *Deps) fill() {
	if d.ReplyTimeout == 0 {
		d.ReplyTimeout = 60 * time.Second
	}
	if d.MaxReadLen == 0 {
		d.MaxReadLen = 16 << 20
	}
	if d.ReadSlots == 0 {
		d.ReadSlots = 32
	}
	if d.ForwardQuota == 0 {
		d.ForwardQuota = 16
	}
	if d.HostBuffer == 0 {
		d.HostBuffer = 256 << 20
	}
	if d.Accumulators == 0 {
		d.Accumulators = 256
	}
	if d.JoinTimeout == 0 {
		d.JoinTimeout = 2 * time.Second
	}
	if d.ReserveTimeout == 0 {
		d.ReserveTimeout = 10 * time.Second
	}
	if d.Now == nil {
		d.Now = func() int64 { return time.Now().UnixNano() }
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
}

// Policies is a node's set of policies.
type Policies struct {
	w   *writer
	r   *reader
	rep *repairer
}

// New builds the policies over d.
func New(d Deps) *Policies {
	d.fill()
	w := newWriter(&d)
	r := newReader(&d)
	r.codes = &w.codes
	rep := &repairer{d: &d, codes: &w.codes, slots: make(chan struct{}, 2),
		pieces: sync.Pool{New: func() any { b := make([]byte, repairPiece); return &b }}}
	return &Policies{w: w, r: r, rep: rep}
}

// Stats are counters of a node's policies.
type Stats struct {
	// ParityBytes is the partial-parity bytes aggregated; ParityFallbacks
	// the accumulator slots taken from host memory because the pool was
	// empty.
	ParityBytes, ParityFallbacks int64
}

// Stats returns the policies' counters.
func (p *Policies) Stats() Stats {
	return Stats{ParityBytes: p.w.aggs.Accumulated.Load(), ParityFallbacks: p.w.aggs.Fallbacks.Load()}
}

// Contexts returns the execution contexts to install in the node's engine.
func (p *Policies) Contexts() []*engine.Context {
	cs := p.w.writeContexts()
	cs = append(cs, p.r.contexts()...)
	return append(cs, p.rep.contexts()...)
}

// Close settles every write still in progress before the store closes:
// it waits (up to timeout) for writes finishing in the background, and
// records each outstanding flat reservation as a doubt — its client may
// have written the other replicas — so a restart does not reissue its
// version. Call it after the engine is closed (no handler runs any more)
// and before the store.
func (p *Policies) Close(timeout time.Duration) error { return p.w.close(timeout) }

// Contexts returns the execution contexts of a fresh set of policies (for
// tests that never close them).
func Contexts(d Deps) []*engine.Context { return New(d).Contexts() }
