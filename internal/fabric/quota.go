package fabric

import "sync"

// quota is a connection's fixed set of receive buffers. The reader takes
// one per packet and blocks when all are held by handlers, which stops
// reading from the socket and lets TCP flow control slow the sender: the
// software analogue of a NIC with a bounded receive pool. Buffers are
// allocated lazily up to the limit and reused, so steady-state receiving
// does not allocate.
type quota struct {
	mu      sync.Mutex
	cond    sync.Cond
	free    []*Packet
	made    int
	limit   int
	size    int
	closed  bool
	waiting bool
}

func newQuota(limit, size int) *quota {
	q := &quota{limit: limit, size: size}
	q.cond.L = &q.mu
	return q
}

// get returns a free packet, blocking while the quota is exhausted. It
// returns nil once the quota is closed.
func (q *quota) get() *Packet {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return nil
		}
		if n := len(q.free); n > 0 {
			p := q.free[n-1]
			q.free = q.free[:n-1]
			return p
		}
		if q.made < q.limit {
			q.made++
			return &Packet{buf: make([]byte, q.size)}
		}
		q.waiting = true
		q.cond.Wait()
	}
}

func (q *quota) put(p *Packet) {
	q.mu.Lock()
	q.free = append(q.free, p)
	if q.waiting {
		q.waiting = false
		q.cond.Broadcast()
	}
	q.mu.Unlock()
}

// close wakes a blocked get; buffers still held are dropped on release.
func (q *quota) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// inUse reports buffers currently held by handlers (for tests and metrics).
func (q *quota) inUse() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.made - len(q.free)
}
