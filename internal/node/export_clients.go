package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/expcache"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/policy"
)

// Per-process exported caches (issue 19 item 6, over shared memory). A
// peer on the node's host maps what it is granted and copies it with no
// check by the node, so a cache it maps must hold nothing it may not
// read: each peer process (as the kernel names it, SO_PEERCRED: the
// fabric.Conn.PeerProcess) gets a cache of its own, in
// shared memory, that only the reads on that process's connections fill
// (with blocks their capabilities allowed) and only those connections
// may map (RegisterAllowed). Not one per client: a capability is a bearer
// token, and another process that once showed one naming a client must
// not see what that client reads later. Not one per connection: a
// client's pool has several, and a reference learnt on one is read on
// another. A slot lasts until the capability it was read under expires;
// a cache is revoked — its region deregistered, the node never writing
// it again, its memory freed — once all its slots have expired or all
// its connections have closed (so a reused pid finds none), when the node
// needs room for another, or when the node stops. A capability with less
// than minCacheLife left makes no cache (its references would not last).

// maxClientCaches bounds the peer processes with a cache of their own at
// once.
const maxClientCaches = 64

// minCacheLife is the least lifetime a capability must have left to make
// a new cache: caches made and revoked at once would only churn memory.
const minCacheLife = int64(10 * time.Second)

// DefaultExportClientCache is a client's own cache unless set (at most
// the node's export cache).
const DefaultExportClientCache = 16 << 20

// clientExports implements policy.ClientExports.
type clientExports struct {
	ep    *fabric.Endpoint
	size  int
	block int
	epoch uint64
	now   func() int64

	mu      sync.Mutex
	m       map[int32]*clientCache // by peer process
	stopped bool                   // no cache is made once the node stops
	bg      sync.WaitGroup         // revocations under way
}

type clientCache struct {
	x      *policy.Export
	region *fabric.Region
	mem    []byte
	until  atomic.Int64 // the latest expiry of a capability it was filled under
	used   atomic.Int64 // when it was last filled (for eviction)

	// Fills hold fill shared; revocation takes it alone and sets gone,
	// so no fill writes the memory once it is revoked.
	fill sync.RWMutex
	gone bool
}

// For implements policy.ClientExports.
func (cs *clientExports) For(c *fabric.Conn, until int64) (*policy.Export, func()) {
	peer, ok := c.PeerProcess()
	if !ok {
		return nil, nil // no process to tell apart: no cache
	}
	cs.mu.Lock()
	cc := cs.m[peer]
	if cc == nil {
		if cs.stopped || until-cs.now() < minCacheLife {
			cs.mu.Unlock()
			return nil, nil
		}
		if cc = cs.newLocked(); cc == nil {
			cs.mu.Unlock()
			return nil, nil
		}
		cs.m[peer] = cc
	}
	// Before the sweep can see it: a connection allowed, and a lifetime.
	cc.region.Allow(c)
	for u := cc.until.Load(); u < until && !cc.until.CompareAndSwap(u, until); u = cc.until.Load() {
	}
	cs.mu.Unlock()
	cc.fill.RLock()
	if cc.gone {
		cc.fill.RUnlock()
		return nil, nil
	}
	cc.used.Store(cs.now())
	return cc.x, func() { cc.fill.RUnlock() }
}

// newLocked makes a peer process's cache, evicting the least recently
// filled one if there are too many; nil if shared memory cannot be had.
func (cs *clientExports) newLocked() *clientCache {
	if len(cs.m) >= maxClientCaches {
		var oldest int32
		var at int64 = 1<<63 - 1
		for k, cc := range cs.m {
			if u := cc.used.Load(); u < at {
				oldest, at = k, u
			}
		}
		cs.revokeLocked(oldest)
	}
	mem, err := cs.ep.AllocReadOnly(cs.size)
	if err != nil {
		return nil
	}
	c, err := expcache.New(mem, cs.block, uint64(cs.now())<<1)
	if err != nil {
		cs.ep.Free(mem)
		return nil
	}
	r := cs.ep.RegisterAllowed(mem, fabric.RemoteRead)
	return &clientCache{x: &policy.Export{Cache: c, Region: r.Key(), Epoch: cs.epoch}, region: r, mem: mem}
}

// revokeLocked revokes peer's cache: no fill writes it after this, its
// region is refused to everyone, and its memory is freed once no peer is
// inside a copy of it (in the background: that can take a while).
func (cs *clientExports) revokeLocked(peer int32) {
	cc := cs.m[peer]
	if cc == nil {
		return
	}
	delete(cs.m, peer)
	cc.fill.Lock()
	cc.gone = true
	cc.fill.Unlock()
	cs.bg.Add(1)
	go func() {
		defer cs.bg.Done()
		cs.ep.Deregister(cc.region)
		cs.ep.Free(cc.mem)
	}()
}

// InvalidateChunk implements policy.ClientExports.
func (cs *clientExports) InvalidateChunk(chunk ids.ChunkID) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, cc := range cs.m {
		cc.x.Cache.InvalidateChunk(chunk)
	}
}

// sweep drops expired slots, and revokes the caches whose every slot has
// expired or whose connection has closed.
func (cs *clientExports) sweep() {
	now := cs.now()
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for peer, cc := range cs.m {
		if cc.until.Load() < now || !cc.region.Allowed() {
			cs.revokeLocked(peer)
			continue
		}
		cc.x.Cache.Expire(now)
	}
}

// run sweeps every second until stop is closed, then revokes every cache.
func (cs *clientExports) run(stop <-chan struct{}, done func()) {
	defer done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			cs.sweep()
		case <-stop:
			cs.mu.Lock()
			cs.stopped = true
			for id := range cs.m {
				cs.revokeLocked(id)
			}
			cs.mu.Unlock()
			cs.bg.Wait()
			return
		}
	}
}
