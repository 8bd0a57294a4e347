package fabric

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// Perm is what remote peers may do to a registered region.
type Perm uint8

const (
	RemoteRead  Perm = 1 << 0
	RemoteWrite Perm = 1 << 1
	// permOptimistic asks access for an optimistic READ: allowed by
	// RemoteRead, or by the region's Guard (which then decides alone).
	permOptimistic Perm = 1 << 7
)

// Region is memory registered with an endpoint so peers can READ or WRITE
// it one-sidedly, naming it by Key. The key is random so a peer cannot
// guess another region's key; Deregister revokes it at once.
//
// As with RDMA, a region's bytes may change under a remote WRITE at any
// time: the owner reads them only after the peer has signalled (with a
// later message on the same connection, which is delivered after the
// WRITE's data is placed).
type Region struct {
	key  uint64
	buf  []byte
	perm Perm
	// guard, if set, admits each optimistic READ (RegisterGuarded); the
	// region then allows no plain one-sided operation and is never
	// mapped by a shared-memory peer.
	guard    Guard
	guardMax uint64 // the largest read guard is asked to serve
	conn     *Conn  // if set, the only connection that may access it
	// restricted: only the connections in allowed may access it
	// (RegisterAllowed); allowed is guarded by mu.
	restricted bool
	allowed    map[*Conn]struct{}
	// mem is the shared memory buf is, if an Alloc whole: a
	// shared-memory peer is granted it to copy itself (shm_direct.go).
	mem *shmMem

	// One-sided operations using the memory now: deregistering revokes
	// the key at once, but the memory is the owner's again only when the
	// last of them is done (onIdle).
	mu     sync.Mutex
	inUse  int
	gone   bool
	onIdle []func()
	idle   chan struct{} // closed at idle, for Deregister; made only if it must wait
	// grants are the shared-memory peers given mem, each with a shared
	// revoked flag and in-use count (shm_direct.go); revoking sets the
	// flags under mu, with gone.
	grants []shmGrant
	// memDone: the registration on mem is given back (once, however
	// often the region is deregistered).
	memDone bool
}

// use marks an operation on the region's memory; false once revoked.
func (r *Region) use() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gone {
		return false
	}
	r.inUse++
	return true
}

// unuse ends an operation begun by use.
func (r *Region) unuse() {
	r.mu.Lock()
	r.inUse--
	var run []func()
	if r.inUse == 0 && r.gone {
		run, r.onIdle = r.onIdle, nil
		if r.idle != nil {
			close(r.idle)
			r.idle = nil
		}
	}
	r.mu.Unlock()
	for _, f := range run {
		f()
	}
}

// revokeWait marks the region gone and returns a channel closed once no
// operation uses its memory, or nil if none does now.
func (r *Region) revokeWait() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gone = true
	revokeGrants(r.grants)
	if r.inUse == 0 {
		return nil
	}
	if r.idle == nil {
		r.idle = make(chan struct{})
	}
	return r.idle
}

// revoke marks the region gone and runs idle (if not nil) once no
// operation uses its memory.
func (r *Region) revoke(idle func()) {
	r.mu.Lock()
	r.gone = true
	revokeGrants(r.grants)
	now := r.inUse == 0
	if !now && idle != nil {
		r.onIdle = append(r.onIdle, idle)
	}
	r.mu.Unlock()
	if now && idle != nil {
		idle()
	}
}

// Allow lets connection c access a region registered with
// RegisterAllowed (and forgets connections that have closed).
func (r *Region) Allow(c *Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.allowed[c]; ok {
		return
	}
	for o := range r.allowed {
		if o.Err() != nil {
			delete(r.allowed, o)
		}
	}
	r.allowed[c] = struct{}{}
}

// Allowed reports whether any connection allowed is still open.
func (r *Region) Allowed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for o := range r.allowed {
		if o.Err() == nil {
			return true
		}
	}
	return false
}

// sees reports whether connection c may see the region.
func (r *Region) sees(c *Conn) bool {
	if r.conn != nil && r.conn != c {
		return false
	}
	if !r.restricted {
		return true
	}
	r.mu.Lock()
	_, ok := r.allowed[c]
	r.mu.Unlock()
	return ok
}

// Key names the region to peers.
func (r *Region) Key() uint64 { return r.key }

// Bytes is the registered memory.
func (r *Region) Bytes() []byte { return r.buf }

// Len is the region's size.
func (r *Region) Len() int { return len(r.buf) }

// Errors a one-sided operation can fail with on the target.
var (
	ErrNoRegion = errors.New("fabric: no region with that key")
	ErrBounds   = errors.New("fabric: access outside region bounds")
	ErrPerm     = errors.New("fabric: region does not allow that access")
)

// keyShared is set in the key of a region in shared memory (Alloc) and
// clear in others: a shared-memory peer asks for the memory of the first
// kind only, and sends packets for the rest without a round trip. The
// other 63 bits are random.
const keyShared = 1 << 63

// regions is an endpoint's region table.
type regions struct {
	mu sync.RWMutex
	m  map[uint64]*Region
}

// register gives r (its memory and rules set, not yet seen by anyone) a
// fresh random key and enters it in the table.
func (t *regions) register(r *Region) *Region {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = make(map[uint64]*Region)
	}
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			panic(fmt.Sprintf("fabric: reading random region key: %v", err))
		}
		k := binary.LittleEndian.Uint64(b[:]) &^ keyShared
		if r.mem != nil {
			k |= keyShared
		}
		if _, dup := t.m[k]; k != 0 && !dup {
			r.key = k
			t.m[k] = r
			return r
		}
	}
}

func (t *regions) deregister(r *Region, idle func()) {
	t.unmap(r)
	r.revoke(idle)
}

func (t *regions) unmap(r *Region) {
	t.mu.Lock()
	delete(t.m, r.key)
	t.mu.Unlock()
}

// lookup returns the live region key as connection c may see it, or nil.
func (t *regions) lookup(c *Conn, key uint64) *Region {
	t.mu.RLock()
	r := t.m[key]
	t.mu.RUnlock()
	if r == nil || !r.sees(c) {
		return nil
	}
	return r
}

// access returns the slice [off, off+n) of the region key if perm allows
// it, and the region, marked in use: the caller calls unuse when done
// with the memory.
func (t *regions) access(c *Conn, key, off, n uint64, perm Perm) (*Region, []byte, error) {
	t.mu.RLock()
	r := t.m[key]
	t.mu.RUnlock()
	if r == nil || !r.sees(c) || !r.use() {
		return nil, nil, fmt.Errorf("%w %#x", ErrNoRegion, key)
	}
	if perm == permOptimistic && (r.guard != nil || r.perm&RemoteRead != 0) {
		perm = r.perm & RemoteRead
	}
	if perm == permOptimistic || r.perm&perm != perm {
		r.unuse()
		return nil, nil, ErrPerm
	}
	end := off + n
	if end < off || end > uint64(len(r.buf)) {
		r.unuse()
		return nil, nil, fmt.Errorf("%w: [%d,+%d) of %d bytes", ErrBounds, off, n, len(r.buf))
	}
	return r, r.buf[off:end], nil
}
