package fabric

import (
	"context"
	"sync"
)

// Router is the Handler of a dialed connection: it hands each arriving
// message to whoever is waiting for its id (the caller of the request it
// answers). Packets nobody waits for are released and dropped.
type Router struct {
	mu      sync.Mutex
	waiters map[uint64]chan *Packet
	closed  bool
	cap     int
}

// NewRouter returns a router whose waiters can hold depth packets each;
// depth must be at least the connection's receive quota so delivery never
// blocks the reader.
func NewRouter(depth int) *Router {
	return &Router{waiters: make(map[uint64]chan *Packet), cap: depth}
}

// Expect registers interest in message id. The returned channel yields the
// message's packets in order and is closed after its Last packet or when
// the connection ends (then the connection's Err says why).
func (r *Router) Expect(id uint64) <-chan *Packet {
	ch := make(chan *Packet, r.cap)
	r.mu.Lock()
	if r.closed {
		close(ch)
	} else {
		r.waiters[id] = ch
	}
	r.mu.Unlock()
	return ch
}

// Cancel withdraws interest in id and releases anything already delivered.
func (r *Router) Cancel(id uint64) {
	r.mu.Lock()
	ch, ok := r.waiters[id]
	delete(r.waiters, id)
	r.mu.Unlock()
	if ok {
		close(ch)
		for p := range ch {
			p.Release()
		}
	}
}

// Pending reports how many messages are awaited.
func (r *Router) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiters)
}

// HandlePacket implements Handler.
func (r *Router) HandlePacket(p *Packet) {
	r.mu.Lock()
	ch, ok := r.waiters[p.ID]
	if ok && p.Last() {
		delete(r.waiters, p.ID)
	}
	if ok {
		ch <- p // never blocks: capacity >= receive quota
		if p.Last() {
			close(ch)
		}
	}
	r.mu.Unlock()
	if !ok {
		p.Release()
	}
}

// Closed implements Handler.
func (r *Router) Closed(c *Conn, err error) {
	r.mu.Lock()
	r.closed = true
	for id, ch := range r.waiters {
		delete(r.waiters, id)
		close(ch)
	}
	r.mu.Unlock()
}

// PeerConn is a dialed connection with its reply router.
type PeerConn struct {
	*Conn
	Replies *Router
	addr    string
}

// Addr is the address the connection was dialed to.
func (pc *PeerConn) Addr() string { return pc.addr }

// Pool keeps idle connections per peer address. A request checks out a
// connection for its whole exchange, as it would own a queue pair, and
// returns it when the reply is in.
//
// A peer closes a connection idle for its idle timeout (announced in the
// hello); the pool reuses a connection only within half of it (Stale), so a
// request is never sent on one the peer is closing at that moment, and
// dials a new one instead (one the peer already closed is skipped too).
type Pool struct {
	ep      *Endpoint
	maxIdle int

	mu     sync.Mutex
	idle   map[string][]*PeerConn
	closed bool
}

// NewPool returns a pool dialing through ep, keeping up to maxIdle idle
// connections per peer.
func NewPool(ep *Endpoint, maxIdle int) *Pool {
	return &Pool{ep: ep, maxIdle: maxIdle, idle: make(map[string][]*PeerConn)}
}

// Endpoint is the endpoint the pool dials through.
func (p *Pool) Endpoint() *Endpoint { return p.ep }

// Get returns an idle healthy connection to addr or dials a new one.
func (p *Pool) Get(ctx context.Context, addr string) (*PeerConn, error) {
	p.mu.Lock()
	for {
		list := p.idle[addr]
		if len(list) == 0 {
			break
		}
		pc := list[len(list)-1]
		p.idle[addr] = list[:len(list)-1]
		if pc.Err() != nil {
			continue
		}
		if pc.Stale() {
			// Older ones are further down the list: drop them all.
			stale := append([]*PeerConn{pc}, p.idle[addr]...)
			delete(p.idle, addr)
			p.mu.Unlock()
			for _, s := range stale {
				s.Close()
			}
			p.mu.Lock()
			continue
		}
		p.mu.Unlock()
		return pc, nil
	}
	p.mu.Unlock()
	r := NewRouter(p.ep.opts.Quota + 1)
	c, err := p.ep.Dial(ctx, addr, r)
	if err != nil {
		return nil, err
	}
	return &PeerConn{Conn: c, Replies: r, addr: addr}, nil
}

// Put returns a connection; broken ones, ones with replies still awaited,
// and ones beyond the idle limit are closed.
func (p *Pool) Put(pc *PeerConn) {
	if pc.Err() != nil {
		return
	}
	if pc.Replies.Pending() > 0 {
		pc.Close()
		return
	}
	p.mu.Lock()
	if !p.closed && len(p.idle[pc.addr]) < p.maxIdle {
		p.idle[pc.addr] = append(p.idle[pc.addr], pc)
		pc = nil
	}
	p.mu.Unlock()
	if pc != nil {
		pc.Close()
	}
}

// Close closes idle connections; checked-out ones close when returned.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = map[string][]*PeerConn{}
	p.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			pc.Close()
		}
	}
}
