package engine

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/wire"
)

type phase int32

const (
	phaseFree       phase = iota
	phaseHeader           // allocated, header handler not yet run
	phaseReceiving        // accepted, data packets flowing
	phaseCompleting       // completion handler ran; waiting for Finish
)

// directState is what the reader goroutine needs for direct placement,
// published by the worker once the header handler has accepted.
type directState struct {
	ctx   *Context
	state any
}

// Request is one entry of the request table: the state of an in-flight
// request, reused from a fixed array. Handlers of the request run on one
// worker, so they may use State without locking; Finish may be called
// from any goroutine.
type Request struct {
	ID   uint64
	Conn *fabric.Conn
	// State is the policy's per-request state, set by the header handler.
	State any

	e          *Engine
	ctx        *Context
	index      int
	phase      atomic.Int32
	lastActive atomic.Int64
	finished   atomic.Bool
	// gen changes every time the entry is freed, so references held by
	// the reader goroutine and by queued tasks can tell their request from
	// a later one reusing the entry.
	gen    atomic.Uint64
	direct atomic.Pointer[directState]
}

// Context is the request's execution context name.
func (r *Request) Context() string { return r.ctx.Name }

func (r *Request) getPhase() phase  { return phase(r.phase.Load()) }
func (r *Request) setPhase(p phase) { r.phase.Store(int32(p)) }

// Finish sends reply (a header-only message, at most one MTU; nil for
// none) and releases the table entry. It does not block: the reply is
// queued on the connection. Call it exactly once, after completion.
func (r *Request) Finish(reply []byte) {
	if !r.finished.CompareAndSwap(false, true) {
		panic(fmt.Sprintf("engine: request %d finished twice", r.ID))
	}
	if reply != nil {
		r.Conn.Post(r.ID, reply)
	}
	r.e.completed.Add(1)
	r.free()
}

func (r *Request) complete() {
	r.setPhase(phaseCompleting)
	r.ctx.Completion(r)
}

// refuse answers a header the handler rejected.
func (r *Request) refuse(err error) {
	r.e.refused.Add(1)
	r.Conn.Post(r.ID, wire.AppendError(nil, err))
	r.e.event(Event{Kind: EventRefused, Context: r.ctx.Name, ID: r.ID, Peer: peer(r.Conn), Reason: err})
}

// fail aborts an accepted request whose payload handler failed.
func (r *Request) fail(err error) {
	r.e.aborted.Add(1)
	r.Conn.Post(r.ID, wire.AppendError(nil, err))
	if r.ctx.Cleanup != nil {
		r.ctx.Cleanup(r, err)
	}
	r.e.event(Event{Kind: EventAborted, Context: r.ctx.Name, ID: r.ID, Peer: peer(r.Conn), Reason: err})
}

func (r *Request) free() { r.e.table.free(r) }

// table is the bounded request table.
type table struct {
	mu       sync.Mutex
	slots    []Request
	freeList []int
}

func (t *table) init(e *Engine, n int) {
	t.slots = make([]Request, n)
	t.freeList = make([]int, n)
	for i := range t.slots {
		t.slots[i].e = e
		t.slots[i].index = i
		t.freeList[i] = n - 1 - i
	}
}

func (t *table) alloc(c *fabric.Conn, id uint64, ctx *Context) *Request {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.freeList)
	if n == 0 {
		return nil
	}
	r := &t.slots[t.freeList[n-1]]
	t.freeList = t.freeList[:n-1]
	r.ID, r.Conn, r.ctx, r.State = id, c, ctx, nil
	r.finished.Store(false)
	r.lastActive.Store(r.e.clock.Load())
	r.setPhase(phaseHeader)
	return r
}

func (t *table) free(r *Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.getPhase() == phaseFree {
		panic(fmt.Sprintf("engine: request %d freed twice", r.ID))
	}
	r.setPhase(phaseFree)
	r.direct.Store(nil)
	r.gen.Add(1)
	r.Conn, r.State, r.ctx = nil, nil, nil
	t.freeList = append(t.freeList, r.index)
}

func (t *table) inUse() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.slots) - len(t.freeList)
}

// idle returns the connections of requests still receiving (or being
// refused) that have seen no packet since limit.
func (t *table) idle(limit int64) []*fabric.Conn {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*fabric.Conn
	for i := range t.slots {
		r := &t.slots[i]
		switch r.getPhase() {
		case phaseHeader, phaseReceiving:
			if r.lastActive.Load() < limit {
				out = append(out, r.Conn)
			}
		}
	}
	return out
}
