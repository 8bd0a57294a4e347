// Package node runs a storage node: the chunk store (host side), the
// handler engine with the DFS policies installed (the software SmartNIC),
// the fabric endpoint clients and other nodes send to, and the control
// loop that registers with meta, heartbeats, and deletes chunks meta has
// released.
package node

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/policy"
	"github.com/sluicefs/sluice/internal/privfs"
	"github.com/sluicefs/sluice/internal/store"
)

// Options configure a storage node.
type Options struct {
	DataDir  string
	MetaAddr string
	// Join is the join token a new node joins the cluster with
	// (join.go); a node that has joined ignores it.
	Join string
	// Listen is the fabric address. Default 127.0.0.1:0.
	Listen string
	// Advertise is the address registered with meta. Default: the bound
	// Listen address.
	Advertise string
	// ID is the node id a new node asks for when it joins (0: meta
	// picks); a node that has an id must have this one.
	ID ids.NodeID
	// Domain is the node's failure domain (rack, host...).
	Domain string
	Fabric fabric.Options
	// FabricTLS runs the fabric over TLS with the node's certificate
	// (join.go's fabricTLS).
	FabricTLS bool
	Engine    engine.Options
	// Accumulators is the number of parity accumulator slots (see
	// policy.Deps); 0 for the default.
	Accumulators int
	// ReserveTimeout bounds a flat or erasure-coded write's version
	// reservation (policy.Deps); 0 for the default. Tests shorten it.
	ReserveTimeout time.Duration
	// BlockSize is the checksum block size of a new store.
	BlockSize int
	// AllowRaw accepts unauthenticated "raw" writes: only for benchmarks
	// measuring the cost of authentication; never in a normal cluster.
	AllowRaw bool
	// ScrubInterval is how often the node re-reads all its chunks
	// against their checksums (0: never), at most ScrubRate bytes a
	// second (0: as fast as it can).
	ScrubInterval time.Duration
	ScrubRate     int64
	// InventoryInterval is how often the node lists its chunks to meta,
	// which answers the copies no file needs (inventory.go); 0:
	// DefaultInventoryInterval, negative: only when meta asks.
	InventoryInterval time.Duration
	// ExportCache: bytes of exported cache (0: none), blocks of ExportBlock (export.go);
	// ExportClientCache: of each same-host client's own (export_clients.go).
	ExportCache       int64
	ExportBlock       int
	ExportClientCache int64
	Logger            *slog.Logger
}

// Node is a running storage node.
type Node struct {
	opts   Options
	log    *slog.Logger
	store  *store.Store
	ep     *fabric.Endpoint
	fwd    *fabric.Endpoint
	pool   *fabric.Pool
	eng    *engine.Engine
	pol    *policy.Policies
	meta   *metaapi.Client
	creds  credentials
	keys   *capability.Keyring // swapped as meta says (capkeys.go)
	addr   string
	id     atomic.Uint32 // ids.NodeID; 0 until registered
	cancel context.CancelFunc
	wg     sync.WaitGroup

	registered  atomic.Bool
	interval    atomic.Int64                          // heartbeat interval meta asked for, ns
	peers       atomic.Pointer[map[ids.NodeID]string] // the cluster map, from heartbeats
	refresh     chan struct{}                         // asks the control loop to heartbeat now
	refreshMu   sync.Mutex
	lastRefresh time.Time
	fatal       chan error // errors the node cannot recover from by itself
	closeOnce   sync.Once
	closeErr    error
	mu          sync.Mutex
	hbMu        sync.Mutex            // one heartbeat at a time
	deleted     []ids.ChunkID         // deletions to report with the next heartbeat
	corrupt     []metaapi.CorruptCopy // copies found with bad blocks, not yet reported (Node 0: this node's)

	inventoryNow chan struct{} // meta asked for an inventory round
	verifyNext   atomic.Bool   // ... reading every block
	lastSweep    time.Time     // of expired tombstones (control loop only)
	capKeysMu    sync.Mutex    // one change of the keyring (and its file) at a time
	export       atomic.Pointer[policy.Export]
	exportStop   chan struct{} // stops the per-client caches' sweeper
}

type identity struct {
	ID ids.NodeID `json:"id"`
}

const identityFile = "node.json"

// Start opens the store, registers with meta (a new node waits for meta
// to assign its id) and starts serving.
func Start(ctx context.Context, opts Options) (*Node, error) {
	if !utf8.ValidString(opts.Domain) {
		// Meta's API carries it as JSON text: its bytes that are not
		// UTF-8 would arrive as U+FFFD, merging distinct domains.
		return nil, fmt.Errorf("node: failure domain %q is not UTF-8 text", opts.Domain)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.InventoryInterval == 0 {
		opts.InventoryInterval = DefaultInventoryInterval
	}
	// Everything under the data directory is private to this account,
	// including what an older version left readable by others; one other
	// accounts could write is refused, not repaired.
	if err := privfs.CheckDir(opts.DataDir); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := privfs.MkdirAll(opts.DataDir); err != nil {
		return nil, fmt.Errorf("node: creating data dir: %w", err)
	}
	if err := privfs.Secure(opts.DataDir); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n := &Node{opts: opts, log: opts.Logger, fatal: make(chan error, 1), refresh: make(chan struct{}, 1), inventoryNow: make(chan struct{}, 1)}
	id, err := loadIdentity(opts.DataDir)
	if err != nil {
		return nil, err
	}
	if opts.ID != 0 && id != 0 && opts.ID != id {
		return nil, fmt.Errorf("node: --id %v, but %s is node %v's data directory", opts.ID, opts.DataDir, id)
	}
	var joined bool
	if n.creds, joined, err = loadCredentials(opts.DataDir, id); err != nil {
		return nil, err
	}
	if err := removeOldSecret(opts.DataDir, n.log); err != nil {
		return nil, err
	}
	if !joined {
		switch {
		case opts.Join == "" && id == 0:
			return nil, errors.New("node: not a member of a cluster yet: start it with --join TOKEN (an admin creates one with `sluice join-token`)")
		case opts.Join == "":
			return nil, fmt.Errorf("node: this is node %v but it has no certificate (lost, or set up before TLS): start it with --join TOKEN from `sluice join-token --node %v`", id, id)
		}
		if n.creds, err = join(ctx, opts.DataDir, opts.MetaAddr, opts.Join, id, opts.ID, n.log); err != nil {
			return nil, err
		}
		id = n.creds.id
	}
	n.id.Store(uint32(id))
	tc, err := n.creds.tlsConfig()
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	n.keys = n.newKeyring()
	n.store, err = store.Open(store.Options{Dir: filepath.Join(opts.DataDir, "store"), BlockSize: opts.BlockSize, Logger: opts.Logger,
		OnCorrupt: func(id ids.ChunkID, version uint64, bad extent.List) { n.reportCorrupt(id, 0, version, bad) },
		OnNoSpace: n.reportSoon, OnChange: n.exportChanged})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	if err := n.serve(); err != nil {
		n.Close()
		return nil, err
	}
	n.meta = metaapi.NewClient(opts.MetaAddr, "", tc)
	if !joined {
		// A new node is in the cluster map before it says it serves:
		// clients given it in a layout must find its address.
		if err := n.register(ctx); err != nil {
			n.Close()
			return nil, err
		}
	}
	lctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Add(1)
	go n.controlLoop(lctx)
	if opts.ScrubInterval > 0 {
		n.wg.Add(1)
		go n.scrubLoop(lctx)
	}
	n.wg.Add(1)
	go n.inventoryLoop(lctx)
	n.log.Info("storage node serving", "id", n.ID(), "addr", n.addr, "domain", opts.Domain, "meta", opts.MetaAddr)
	return n, nil
}

func (n *Node) serve() error {
	fo := n.opts.Fabric
	if n.opts.FabricTLS {
		if err := n.fabricTLS(&fo); err != nil {
			return err
		}
	}
	var err error
	if n.ep, err = fabric.NewEndpoint(fo); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if n.fwd, err = fabric.NewEndpoint(fo); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.pool = fabric.NewPool(n.fwd, 64)
	if err := n.startExport(); err != nil {
		return err
	}
	eopts := n.opts.Engine
	eopts.Logger = n.log
	eopts.OnEvent = n.onEvent
	n.pol = policy.New(policy.Deps{
		Self:           n.ID,
		Keys:           n.keys,
		Store:          n.store,
		Forward:        n.pool,
		ForwardQuota:   n.ep.Options().Quota,
		ReplicaAddr:    n.PeerAddr,
		RefreshMap:     n.refreshMap,
		AllowRaw:       n.opts.AllowRaw,
		Accumulators:   n.opts.Accumulators,
		ReserveTimeout: n.opts.ReserveTimeout,
		ReportCorrupt:  n.reportCorrupt,
		Export:         n.export.Load(),
		Logger:         n.log,
	})
	if n.eng, err = engine.New(eopts, n.pol.Contexts()...); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	addr, err := n.ep.Listen(n.opts.Listen, n.eng)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.addr = addr.String()
	if n.opts.Advertise == "" {
		n.opts.Advertise = n.addr
	}
	return nil
}

// PeerAddr resolves a node id with the node's latest cluster map; a miss
// makes the node refresh the map from meta at once.
func (n *Node) PeerAddr(id ids.NodeID) (string, bool) {
	m := n.peers.Load()
	var a string
	ok := false
	if m != nil {
		a, ok = (*m)[id]
	}
	if !ok {
		// A node that joined since the last heartbeat: refresh the map now
		// rather than in a second (the client retries the busy answer).
		select {
		case n.refresh <- struct{}{}:
		default:
		}
	}
	return a, ok
}

// refreshMap heartbeats now (at most every 50ms; concurrent callers share
// one call) so the cluster map is current.
func (n *Node) refreshMap() {
	n.refreshMu.Lock()
	defer n.refreshMu.Unlock()
	if time.Since(n.lastRefresh) < 50*time.Millisecond {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := n.heartbeat(ctx); err != nil {
		n.log.Debug("refreshing the cluster map", "err", err)
	}
	n.lastRefresh = time.Now()
}

// errRefused: meta does not accept this node's credential.
var errRefused = errors.New("meta refused this node's certificate (revoked or replaced, or a node of another cluster?)")

// errRejected: meta refused what the node registers (an address it cannot
// reach, say); the same registration would be refused again.
var errRejected = errors.New("meta refused to register this node")

// Fatal yields an error when the node cannot go on by itself (meta
// refuses its credential); the process should stop.
func (n *Node) Fatal() <-chan error { return n.fatal }

// Addr is the node's fabric address.
func (n *Node) Addr() string { return n.addr }

// ID is the node's id (0 before its first registration).
func (n *Node) ID() ids.NodeID { return ids.NodeID(n.id.Load()) }

// Store is the node's chunk store (for tests and tools).
func (n *Node) Store() *store.Store { return n.store }

// Engine is the node's handler engine.
func (n *Node) Engine() *engine.Engine { return n.eng }

// Close stops the node. It is safe to call more than once.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { n.closeErr = n.close() })
	return n.closeErr
}

func (n *Node) close() error {
	if n.cancel != nil {
		n.cancel()
	}
	if n.exportStop != nil {
		close(n.exportStop)
	}
	n.wg.Wait()
	if n.ep != nil {
		n.ep.Close()
	}
	if n.fwd != nil {
		n.pool.Close()
		n.fwd.Close()
	}
	if n.eng != nil {
		n.eng.Close()
	}
	if n.pol != nil {
		// Writes the closed connections failed settle (and record their
		// doubts) while the store is still open.
		if err := n.pol.Close(30 * time.Second); err != nil {
			n.log.Error("closing", "err", err)
		}
	}
	if n.meta != nil {
		n.meta.Close()
	}
	return n.store.Close()
}

func loadIdentity(dir string) (ids.NodeID, error) {
	raw, err := os.ReadFile(filepath.Join(dir, identityFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("node: reading identity: %w", err)
	}
	var id identity
	if err := json.Unmarshal(raw, &id); err != nil || id.ID == 0 {
		return 0, fmt.Errorf("node: %s is corrupt", filepath.Join(dir, identityFile))
	}
	return id.ID, nil
}

func saveIdentity(dir string, id ids.NodeID) error {
	raw, _ := json.Marshal(identity{ID: id})
	if err := saveFile(dir, identityFile, raw); err != nil {
		return fmt.Errorf("node: saving identity: %w", err)
	}
	return nil
}

// saveFile replaces dir/name by raw, durably and all at once.
func saveFile(dir, name string, raw []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, privfs.FileMode)
	if err != nil {
		return err
	}
	if _, err := f.Write(raw); err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// usage is what the node reports of its space (metaapi.HeartbeatReq):
// what its file system can still hold plus what its store takes there
// (Capacity), what it can still take (Free: free bytes and recycled chunk
// files), what the store takes (Used, allocated bytes) and of that the
// recycled files (Reclaimable), and which file system it is (Disk) and
// its size (FSSize: meta's free-space margin is a share of it).
// Without statfs (not Linux) it reports no size, and meta then places as
// if it had room.
func (n *Node) usage() (sp usage) {
	if st, err := n.store.Space(); err == nil {
		sp.Capacity, sp.Free, sp.Used, sp.Disk = st.Avail+st.Used, st.Free(), st.Used, st.Disk
		sp.Reclaimable = min(st.Recycled, st.Used)
		if st.Total > 0 {
			sp.FSSize = max(st.Total, sp.Free) // two readings: keep them consistent
		}
	} else {
		n.log.Debug("no file system space to report", "err", err)
	}
	_, sp.Chunks = n.store.Usage()
	return sp
}

type usage struct {
	Capacity, Free, Used, Reclaimable, Chunks, FSSize int64
	Disk                                              string
}

// reportSoon has the control loop heartbeat now: the store met a full
// file system, and meta should stop placing chunks here at once rather
// than at the next heartbeat. It never blocks (the store calls it from
// writes).
func (n *Node) reportSoon() {
	select {
	case n.refresh <- struct{}{}:
	default:
	}
}

// register announces the node to meta, retrying until ctx ends.
func (n *Node) register(ctx context.Context) error {
	sp := n.usage()
	req := metaapi.RegisterReq{ID: n.ID(), Addr: n.opts.Advertise, Domain: n.opts.Domain, Capacity: sp.Capacity, Used: sp.Used, Free: sp.Free,
		Reclaimable: sp.Reclaimable, Disk: sp.Disk, FSSize: sp.FSSize, Chunks: sp.Chunks}
	var resp metaapi.RegisterResp
	backoff := 100 * time.Millisecond
	for {
		err := n.meta.Call(ctx, metaapi.OpRegister, req, &resp)
		if err == nil {
			break
		}
		if metaapi.IsCode(err, metaapi.EAUTH) || errors.As(err, new(*metaapi.TLSError)) {
			return fmt.Errorf("node: %w: %w", errRefused, err)
		}
		if metaapi.IsCode(err, metaapi.EINVAL) {
			return fmt.Errorf("node: %w: %w", errRejected, err)
		}
		n.log.Warn("registering with meta", "meta", n.opts.MetaAddr, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("node: registering with meta at %s: %w", n.opts.MetaAddr, err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
	if id := n.ID(); id != 0 && resp.ID != id {
		return fmt.Errorf("node: meta assigned id %v but this node is %v", resp.ID, id)
	}
	if n.ID() == 0 {
		if err := saveIdentity(n.opts.DataDir, resp.ID); err != nil {
			return err
		}
		n.id.Store(uint32(resp.ID))
	}
	if d := time.Duration(resp.HeartbeatInterval); d > 0 {
		n.interval.Store(int64(min(max(d, 10*time.Millisecond), time.Minute)))
	}
	n.applyCapKeys(resp.CapKeys)
	n.registered.Store(true)
	return nil
}

// heartbeatInterval is how often meta asked to hear from this node
// (1s until it says).
func (n *Node) heartbeatInterval() time.Duration {
	if d := n.interval.Load(); d > 0 {
		return time.Duration(d)
	}
	return time.Second
}

// controlLoop heartbeats to meta, applies deletions and drops expired
// tombstones. A node restarted
// with a known id registers here, while it already serves.
func (n *Node) controlLoop(ctx context.Context) {
	defer n.wg.Done()
	for {
		if !n.registered.Load() {
			if err := n.register(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				if errors.Is(err, errRefused) || errors.Is(err, errRejected) {
					// Retrying cannot help: the operator must fix the
					// credentials or the address.
					n.fatal <- err
					return
				}
				n.log.Error("registration failed", "err", err)
			}
		} else if err := n.heartbeat(ctx); err != nil && ctx.Err() == nil {
			if metaapi.IsCode(err, metaapi.EAUTH) {
				// Revoked while running (sluice node revoke, or joined
				// again elsewhere): as at registration, retrying cannot help.
				n.fatal <- fmt.Errorf("node: %w: %w", errRefused, err)
				return
			}
			n.log.Warn("heartbeat to meta failed", "err", err)
		}
		n.expireTombstones(time.Now())
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.heartbeatInterval()):
		case <-n.refresh:
		}
	}
}

func (n *Node) heartbeat(ctx context.Context) error {
	// One at a time (the control loop's, a refresh of the map): each
	// acknowledges what it sent by trimming the queues it read.
	n.hbMu.Lock()
	defer n.hbMu.Unlock()
	sp := n.usage()
	n.mu.Lock()
	deleted := n.deleted
	n.deleted = nil
	corrupt := slices.Clone(n.corrupt)
	for i := range corrupt {
		corrupt[i].Node = cmp.Or(corrupt[i].Node, n.ID())
	}
	n.mu.Unlock()
	req := metaapi.HeartbeatReq{ID: n.ID(), Addr: n.opts.Advertise, Capacity: sp.Capacity, Used: sp.Used, Free: sp.Free,
		Reclaimable: sp.Reclaimable, Disk: sp.Disk, FSSize: sp.FSSize, Chunks: sp.Chunks, Deleted: deleted, Corrupt: corrupt}
	var resp metaapi.HeartbeatResp
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := n.meta.Call(hctx, metaapi.OpHeartbeat, req, &resp); err != nil {
		n.mu.Lock()
		n.deleted = append(n.deleted, deleted...)
		n.mu.Unlock()
		if metaapi.IsCode(err, metaapi.ENOENT) {
			n.registered.Store(false)
		}
		return err
	}
	if len(corrupt) > 0 {
		// Meta has them: report each once (what came in meanwhile stays).
		n.mu.Lock()
		n.corrupt = n.corrupt[min(len(corrupt), len(n.corrupt)):]
		n.mu.Unlock()
	}
	peers := make(map[ids.NodeID]string, len(resp.Nodes))
	addrs := make([]string, 0, len(resp.Nodes)+1)
	for _, p := range resp.Nodes {
		peers[p.ID] = p.Addr
		addrs = append(addrs, p.Addr)
	}
	n.peers.Store(&peers)
	n.ep.SetPeers(addrs) // strangers filling every slot cannot cut replica traffic
	n.applyCapKeys(resp.CapKeys)
	if resp.Inventory {
		n.askInventory(resp.Verify)
	}
	done := n.applyGone(resp.Gone, time.Now().UnixNano())
	done = append(done, n.applyRetired(resp.Delete)...)
	if len(done) > 0 {
		n.mu.Lock()
		n.deleted = append(n.deleted, done...)
		n.mu.Unlock()
	}
	return nil
}
