// Package engine is the storage node's software SmartNIC, after sPIN
// (seed 000 §II–III): execution contexts that match a message class and
// run a header handler on the first packet, a payload handler on every
// data packet, a completion handler after the last one, and a cleanup
// handler when a request is abandoned mid-message. Handlers run on a
// fixed pool of workers (the HPUs). In-flight requests live in a bounded
// request table; when it is full, a new request is refused at once with a
// retryable NACK — never queued without bound.
//
// Scheduling: every request is bound to one worker when its header
// arrives, and all its packets run there in arrival order, like flow
// affinity (RSS) on a NIC. That gives sPIN's guarantees (header before
// payload, completion after every payload) without locks on the per-packet
// path, and spreads different requests over the workers. Workers never
// block on the network: policies that send (forwarding, replies) hand the
// bytes to a sender, so one slow peer cannot stall unrelated requests.
//
// The engine talks to the host side only through the handlers it is given
// (which place data in the store) and an event callback.
package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/wire"
)

// Answered is returned by a header handler that has answered the request
// itself (e.g. "already applied"): the engine sends Reply and drops the
// rest of the message; the request counts as completed, not refused.
type Answered struct{ Reply []byte }

func (a *Answered) Error() string { return "answered by the header handler" }

// Handlers is an execution context's handler set.
type Handlers struct {
	// Header runs on the header packet: validate, set r.State. An error
	// refuses the request: the engine replies with the error's status and
	// drops the rest of the message.
	Header func(r *Request, hdr []byte) error
	// Payload runs on every data packet, in order. The engine releases p
	// after it returns; Retain it to keep it longer. An error aborts the
	// request: the engine replies with it and runs Cleanup.
	Payload func(r *Request, p *fabric.Packet) error
	// Completion runs after the last packet's payload handler (or after
	// Header for a header-only message). It must eventually call
	// r.Finish, from any goroutine; the table entry is held until then.
	Completion func(r *Request)
	// Direct, if set, offers the destination for data packet [off, off+n)
	// of an accepted request so the fabric receives it in place (direct
	// placement); nil means "use a receive buffer". It is given the
	// request's State as the header handler left it, runs on the
	// connection's reader goroutine, concurrently with the request's other
	// handlers (even its cleanup), and must not block. DirectDone follows
	// each non-nil Direct once the bytes are in.
	Direct     func(state any, off int64, n int) []byte
	DirectDone func(state any)
	// Cleanup runs when an accepted request ends before its last packet:
	// its client went silent or disconnected, or Payload failed. It frees
	// the policy's state (aborts the store write, the forward).
	Cleanup func(r *Request, reason error)
}

// Context is an execution context: the handlers and per-request state of
// one message class. A class is the header's first byte (its op) and,
// within the op, the header fields in Match — as sPIN matches a message
// class on header fields, so each kind of request has its own handlers
// instead of one set switching on the header in every handler.
type Context struct {
	Name  string
	Class wire.Op
	// Match are further header fields the message must carry; nil matches
	// every message of the op. Contexts of one op are tried in the order
	// given to New, and the first that matches takes the message: the one
	// without Match (if any) comes last and takes the rest.
	Match []Field
	Handlers
}

// Field is one header byte a context matches: hdr[At]&Mask == Value. A
// header too short to hold it does not match.
type Field struct {
	At          int
	Mask, Value byte
}

// matches reports whether header packet hdr is of c's class (hdr[0] is
// c's op already).
func (c *Context) matches(hdr []byte) bool {
	for _, f := range c.Match {
		if f.At >= len(hdr) || hdr[f.At]&f.Mask != f.Value {
			return false
		}
	}
	return true
}

// Options configure an engine.
type Options struct {
	// Workers is the number of handler workers. Default GOMAXPROCS.
	Workers int
	// TableSize bounds in-flight requests. Default 1024.
	TableSize int
	// QueueDepth is each worker's task queue. Default 1024.
	QueueDepth int
	// IdleTimeout: a request that receives no packet for this long
	// mid-message is cleaned up and its connection closed. Default 10s.
	IdleTimeout time.Duration
	// OnEvent receives events for the host side; it must not block.
	OnEvent func(Event)
	Logger  *slog.Logger
}

// EventKind classifies events raised to the host side.
type EventKind int

const (
	// EventAborted: an accepted request was cleaned up before completing.
	EventAborted EventKind = iota + 1
	// EventRefused: a request was refused by its header handler.
	EventRefused
	// EventTableFull: a request was refused because the table was full.
	EventTableFull
	// EventUnknownClass: a message of a class no context handles.
	EventUnknownClass
)

func (k EventKind) String() string {
	switch k {
	case EventAborted:
		return "aborted"
	case EventRefused:
		return "refused"
	case EventTableFull:
		return "table-full"
	case EventUnknownClass:
		return "unknown-class"
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Event is raised to the host side.
type Event struct {
	Kind    EventKind
	Context string
	ID      uint64
	Peer    string
	Reason  error
}

// Stats are counters since start.
type Stats struct {
	Accepted, Completed, Refused, RefusedBusy, Aborted, UnknownClass uint64
	InFlight, TableSize                                              int
}

// Engine dispatches packets to handlers. It is a fabric.Handler.
type Engine struct {
	opts     Options
	contexts [256][]*Context // by op, in matching order
	table    table
	workers  []*worker
	next     atomic.Uint32
	clock    atomic.Int64 // coarse time for idleness, updated by the sweeper
	stop     chan struct{}
	wg       sync.WaitGroup

	accepted, completed, refused, refusedBusy, aborted, unknown atomic.Uint64
}

// New starts an engine with the given execution contexts.
func New(opts Options, contexts ...*Context) (*Engine, error) {
	if opts.Workers <= 0 {
		opts.Workers = runtime.GOMAXPROCS(0)
	}
	if opts.TableSize <= 0 {
		opts.TableSize = 1024
	}
	if opts.QueueDepth <= 0 {
		opts.QueueDepth = 1024
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.OnEvent == nil {
		opts.OnEvent = func(Event) {}
	}
	e := &Engine{opts: opts, stop: make(chan struct{})}
	for _, c := range contexts {
		if err := e.install(c); err != nil {
			return nil, err
		}
	}
	e.table.init(e, opts.TableSize)
	e.clock.Store(time.Now().UnixNano())
	for i := 0; i < opts.Workers; i++ {
		w := &worker{e: e, q: make(chan task, opts.QueueDepth)}
		e.workers = append(e.workers, w)
		e.wg.Add(1)
		go w.run()
	}
	e.wg.Add(1)
	go e.sweep()
	return e, nil
}

// install adds c after the contexts of its op, refusing one no message
// could reach.
func (e *Engine) install(c *Context) error {
	if c.Header == nil || c.Completion == nil {
		return fmt.Errorf("engine: context %s needs header and completion handlers", c.Name)
	}
	for _, f := range c.Match {
		if f.At < 1 || f.Value&^f.Mask != 0 {
			return fmt.Errorf("engine: context %s matches byte %d with mask %#x on %#x, which no header can", c.Name, f.At, f.Mask, f.Value)
		}
	}
	for _, o := range e.contexts[c.Class] {
		if len(o.Match) == 0 || slices.Equal(o.Match, c.Match) {
			return fmt.Errorf("engine: context %s is unreachable: %s takes every message of class %v it would", c.Name, o.Name, c.Class)
		}
	}
	e.contexts[c.Class] = append(e.contexts[c.Class], c)
	return nil
}

// match returns the context of header packet hdr (not empty), or nil.
func (e *Engine) match(hdr []byte) *Context {
	for _, c := range e.contexts[hdr[0]] {
		if c.matches(hdr) {
			return c
		}
	}
	return nil
}

// Close stops the workers and the sweeper. Connections must be closed
// first (their Closed callbacks still need the workers).
func (e *Engine) Close() {
	close(e.stop)
	for _, w := range e.workers {
		close(w.q)
	}
	e.wg.Wait()
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	return Stats{
		Accepted: e.accepted.Load(), Completed: e.completed.Load(), Refused: e.refused.Load(),
		RefusedBusy: e.refusedBusy.Load(), Aborted: e.aborted.Load(), UnknownClass: e.unknown.Load(),
		InFlight: e.table.inUse(), TableSize: e.opts.TableSize,
	}
}

func (e *Engine) event(ev Event) { e.opts.OnEvent(ev) }

// ---- dispatch (on each connection's reader goroutine) ----

// connState is the engine's per-connection state: the message being
// received (its request, the generation of that request's table entry,
// its worker), or that the rest of a refused message is being dropped.
// Only the connection's reader goroutine touches it.
type connState struct {
	cur     *Request
	gen     uint64
	id      uint64
	w       *worker
	discard bool
	placing *directState // a Direct placement is in progress
}

// current returns the request the next data packet belongs to, or nil if
// it was refused or failed meanwhile (its entry freed, perhaps reused):
// then the rest of the message is dropped here.
func (cs *connState) current(p *fabric.Packet) *Request {
	r := cs.cur
	if r.gen.Load() == cs.gen {
		return r
	}
	cs.cur, cs.discard = nil, !p.Last()
	return nil
}

// PlaceBegin implements fabric.Placer: a data packet of an accepted
// request is received where its context says it belongs.
func (e *Engine) PlaceBegin(c *fabric.Conn, id uint64, off int64, n int) []byte {
	cs, _ := c.Local.(*connState)
	if cs == nil || cs.discard || cs.cur == nil || cs.id != id {
		return nil
	}
	// The header handler runs on a worker; until it has accepted the
	// request and published its state, packets take the normal path. The
	// generation is checked after the load so the state is this request's,
	// not that of a later request reusing the entry. Nothing else of the
	// entry is read here: it may be being reused.
	r := cs.cur
	ds := r.direct.Load()
	if ds == nil || r.gen.Load() != cs.gen {
		return nil
	}
	b := ds.ctx.Direct(ds.state, off, n)
	if b != nil {
		cs.placing = ds
	}
	return b
}

// PlaceEnd implements fabric.Placer.
func (e *Engine) PlaceEnd(c *fabric.Conn) {
	cs := c.Local.(*connState)
	ds := cs.placing
	cs.placing = nil
	ds.ctx.DirectDone(ds.state)
}

// HandlePacket implements fabric.Handler.
func (e *Engine) HandlePacket(p *fabric.Packet) {
	cs, _ := p.Conn.Local.(*connState)
	if cs == nil {
		cs = &connState{}
		p.Conn.Local = cs
	}
	if p.First() {
		e.start(cs, p)
		return
	}
	if cs.discard {
		if p.Last() {
			cs.discard = false
		}
		p.Release()
		return
	}
	r := cs.current(p)
	if r == nil {
		p.Release()
		return
	}
	r.lastActive.Store(e.clock.Load())
	if p.Last() {
		cs.cur = nil
	}
	cs.w.q <- task{r: r, gen: cs.gen, p: p, kind: taskPayload}
}

func (e *Engine) start(cs *connState, p *fabric.Packet) {
	last := p.Last()
	refuse := func(s wire.Status, msg string) {
		p.Conn.Post(p.ID, wire.AppendStatus(nil, s, msg))
		p.Release()
		cs.discard = !last
	}
	if len(p.Data) == 0 {
		refuse(wire.StatusBadRequest, "empty header packet")
		return
	}
	ctx := e.match(p.Data)
	if ctx == nil {
		e.unknown.Add(1)
		msg := fmt.Sprintf("no handler for message class %d", p.Data[0])
		if len(e.contexts[p.Data[0]]) > 0 {
			msg += " with these header fields"
		}
		e.event(Event{Kind: EventUnknownClass, ID: p.ID, Peer: peer(p.Conn), Reason: errors.New(msg)})
		refuse(wire.StatusUnknownOp, msg)
		return
	}
	w := e.workers[int(e.next.Add(1))%len(e.workers)]
	r := e.table.alloc(p.Conn, p.ID, ctx)
	if r == nil {
		e.refusedBusy.Add(1)
		e.event(Event{Kind: EventTableFull, Context: ctx.Name, ID: p.ID, Peer: peer(p.Conn)})
		refuse(wire.StatusBusy, fmt.Sprintf("request table full (%d entries)", e.opts.TableSize))
		return
	}
	e.accepted.Add(1)
	gen := r.gen.Load()
	if !last {
		cs.cur, cs.gen, cs.id, cs.w = r, gen, p.ID, w
	}
	w.q <- task{r: r, gen: gen, p: p, kind: taskHeader}
}

// Closed implements fabric.Handler: a request cut off mid-message is
// aborted on its worker, after the packets already queued.
func (e *Engine) Closed(c *fabric.Conn, err error) {
	cs, _ := c.Local.(*connState)
	if cs == nil || cs.cur == nil {
		return
	}
	r, gen, w := cs.cur, cs.gen, cs.w
	cs.cur = nil
	if err == nil {
		err = errors.New("connection closed")
	}
	w.q <- task{r: r, gen: gen, kind: taskAbort, reason: err}
}

func peer(c *fabric.Conn) string { return c.RemoteAddr().String() }

// ---- workers ----

type taskKind uint8

const (
	taskHeader taskKind = iota + 1
	taskPayload
	taskAbort
)

type task struct {
	r      *Request
	gen    uint64 // the request's generation when the task was queued
	p      *fabric.Packet
	kind   taskKind
	reason error
}

type worker struct {
	e *Engine
	q chan task
}

func (w *worker) run() {
	defer w.e.wg.Done()
	for t := range w.q {
		w.do(t)
	}
}

// do runs one task. A refused or failed request gives its table entry back
// at once; tasks still queued for it (and later packets, see
// connState.current) see its generation has moved on and are dropped.
func (w *worker) do(t task) {
	r := t.r
	if r.gen.Load() != t.gen {
		if t.p != nil {
			t.p.Release()
		}
		return
	}
	switch t.kind {
	case taskHeader:
		last := t.p.Last()
		err := r.ctx.Header(r, t.p.Data)
		t.p.Release()
		if err != nil {
			var ans *Answered
			if errors.As(err, &ans) {
				r.Conn.Post(r.ID, ans.Reply)
				r.e.completed.Add(1)
			} else {
				r.refuse(err)
			}
			r.free()
			return
		}
		if r.ctx.Direct != nil {
			r.direct.Store(&directState{ctx: r.ctx, state: r.State})
		}
		r.setPhase(phaseReceiving)
		if last {
			r.complete()
		}
	case taskPayload:
		last := t.p.Last()
		var err error
		if r.ctx.Payload != nil {
			err = r.ctx.Payload(r, t.p)
		} else {
			err = wire.Errorf(wire.StatusBadRequest, "%s requests carry no data", r.ctx.Name)
		}
		t.p.Release()
		if err != nil {
			r.fail(err)
			r.free()
			return
		}
		if last {
			r.complete()
		}
	case taskAbort:
		r.e.aborted.Add(1)
		if r.ctx.Cleanup != nil {
			r.ctx.Cleanup(r, t.reason)
		}
		r.e.event(Event{Kind: EventAborted, Context: r.ctx.Name, ID: r.ID, Peer: peer(r.Conn), Reason: t.reason})
		r.free()
	}
}

// sweep advances the coarse clock and closes connections whose current
// request has been idle too long; the close aborts the request.
func (e *Engine) sweep() {
	defer e.wg.Done()
	tick := time.NewTicker(max(e.opts.IdleTimeout/8, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-tick.C:
			e.clock.Store(now.UnixNano())
			limit := now.Add(-e.opts.IdleTimeout).UnixNano()
			for _, c := range e.table.idle(limit) {
				c.CloseWithError(fmt.Errorf("request idle for more than %s mid-message", e.opts.IdleTimeout))
			}
		}
	}
}
