package fabric

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Handler receives the two-sided messages arriving on a connection.
// Both methods run on the connection's reader goroutine, in arrival order:
// HandlePacket must not block for long (blocking it stalls only this
// connection) and must Release every packet it is given.
type Handler interface {
	HandlePacket(p *Packet)
	// Closed is called once, after the last HandlePacket, when the
	// connection ends; err says why (io.EOF for a clean close by the peer).
	Closed(c *Conn, err error)
}

// Placer is implemented by Handlers that can receive a data packet's
// payload straight into its final location (direct placement) instead of
// a receive buffer. The reader goroutine calls PlaceBegin with the
// packet's message id, offset within the message data and length before
// reading its payload; a non-nil result (exactly n bytes) is filled from
// the socket, then PlaceEnd is called, then HandlePacket gets a packet
// whose Data is that slice. Both run on the reader goroutine and must not
// block.
type Placer interface {
	PlaceBegin(c *Conn, id uint64, off int64, n int) []byte
	PlaceEnd(c *Conn)
}

// ErrClosed is returned by operations on a closed connection.
var ErrClosed = errors.New("fabric: connection closed")

// AccessError is a one-sided operation refused by the target.
type AccessError struct{ Reason string }

func (e *AccessError) Error() string { return "fabric: remote access error: " + e.Reason }

// maxBatch bounds the packets sent by one writev.
const maxBatch = 64

// Conn is one connection (a queue pair). Sends are serialised: a message's
// packets are written contiguously. It is safe for concurrent use.
type Conn struct {
	ep *Endpoint
	nc net.Conn // the transport's (transport.go)
	// remote names the peer (link.RemoteAddr).
	remote net.Addr
	br     *bufio.Reader
	// tlsw coalesces a batch's small pieces (headers) into full TLS
	// records; nil for plain TCP, where writev does that.
	tlsw *bufio.Writer
	// direct is the transport's, if it reaches the peer's regions
	// itself: one-sided operations then send no packets.
	direct  directAccess
	handler Handler
	placer  Placer // the handler, if it places directly
	quota   *quota
	sendMTU int // the peer's receive MTU, capped by ours
	recvMTU int

	sendMu   sync.Mutex
	hdrs     []byte   // header scratch for one batch, under sendMu
	pre      []byte   // one-sided prefix scratch for one batch, under sendMu
	iov      [][]byte // iovec scratch, under sendMu
	deadline time.Time
	lazy     []byte // packets (headers included) to go with the next send, under sendMu
	lazyDue  bool   // a timer will flush lazy, under sendMu

	nextID atomic.Uint64

	opsMu sync.Mutex
	ops   map[uint64]*op // one-sided operations we initiated

	ctrl chan ctrlMsg // small sends on behalf of the reader goroutine

	readSem   chan struct{} // bounds remote READs served concurrently
	readSlots chan struct{} // bounds our READs outstanding at the peer (its readSem)
	peerQuota int           // receive buffers the peer announced
	inbound   bool          // accepted, not dialed: the idle timeout applies
	release   func()        // frees an inbound connection's slot (nil if dialed)
	peerIdle  time.Duration // the idle timeout the peer announced (0: none)

	wire *wire // emulated link delivery, if the endpoint has a Link

	// busySince is the coarse time a packet began arriving, 0 between
	// packets: the endpoint's watchdog closes connections stalled mid-packet.
	busySince atomic.Int64
	// lastActive is the coarse time a packet last began to arrive or was
	// sent: the watchdog closes inbound connections idle past IdleTimeout.
	lastActive atomic.Int64

	// Reader-goroutine state for the message being received, and its
	// timer for emulated ingress (made on first need).
	inTimer *wireTimer
	inMsg   bool
	inID    uint64
	inOff   int64

	// Local is for the Handler's per-connection state. Only the reader
	// goroutine (HandlePacket, Closed) may touch it.
	Local any

	closeOnce  sync.Once
	done       chan struct{}
	readerDone chan struct{}
	err        error
}

type op struct {
	dst  []byte // READ destination
	got  int
	done chan error
}

type ctrlMsg struct {
	kind  Kind
	flags uint8
	id    uint64
	data  []byte
	flush chan struct{} // if set: a marker, closed once everything before it is sent
}

// flushCtrl waits (at most d) until the small sends queued so far are out.
func (c *Conn) flushCtrl(d time.Duration) {
	done := make(chan struct{})
	select {
	case c.ctrl <- ctrlMsg{flush: done}:
	default:
		return
	}
	select {
	case <-done:
	case <-c.done:
	case <-time.After(d):
	}
}

// MaxReads is how many one-sided READs a connection serves at once (an
// RDMA queue pair's responder resources). Read waits for a slot rather
// than exceed it at the peer, where it would be a fatal access error.
const MaxReads = 8

func newConn(ep *Endpoint, l link, h Handler, peerMTU, peerQuota int, peerIdle time.Duration, release func()) *Conn {
	o := ep.opts
	c := &Conn{
		ep:         ep,
		nc:         l.Conn,
		remote:     l.RemoteAddr(),
		br:         bufio.NewReaderSize(l.Conn, 8<<10),
		tlsw:       tlsWriter(l.Conn),
		direct:     l.direct,
		handler:    h,
		quota:      newQuota(o.Quota, o.MTU),
		sendMTU:    min(peerMTU, o.MTU),
		recvMTU:    o.MTU,
		hdrs:       make([]byte, HeaderSize*maxBatch),
		pre:        make([]byte, oneSidedPrefix*maxBatch),
		iov:        make([][]byte, 0, 3*maxBatch),
		ops:        make(map[uint64]*op),
		ctrl:       make(chan ctrlMsg, 64),
		readSem:    make(chan struct{}, MaxReads),
		readSlots:  make(chan struct{}, MaxReads),
		peerQuota:  peerQuota,
		inbound:    release != nil,
		release:    release,
		peerIdle:   peerIdle,
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	c.placer, _ = h.(Placer)
	if b, ok := l.direct.(connBinder); ok {
		b.bind(c)
	}
	c.lastActive.Store(ep.clock.Load())
	if o.Link != nil {
		c.wire = &wire{}
		c.wire.cond.L = &c.wire.mu
		go c.runWire()
	}
	go c.readLoop()
	go c.ctrlLoop()
	return c
}

// NewID returns a message or operation id unique on this connection.
func (c *Conn) NewID() uint64 { return c.nextID.Add(1) }

// MTU is the largest packet payload this connection sends.
func (c *Conn) MTU() int { return c.sendMTU }

// Shared reports whether the peer reaches this endpoint's memory itself
// (the shared-memory transport): what it is granted of a region in
// shared memory (Alloc) it copies without this endpoint's CPU.
func (c *Conn) Shared() bool { return c.direct != nil }

// PeerQuota is the number of receive buffers (each of MTU bytes) the peer
// posted for this connection, from its hello: an upper layer keeps the
// messages it has outstanding at the peer within it, as credits.
func (c *Conn) PeerQuota() int { return c.peerQuota }

// PeerIdleTimeout is how long the peer keeps this connection open with
// nothing sent either way, as its hello announced (0: no limit).
func (c *Conn) PeerIdleTimeout() time.Duration { return c.peerIdle }

// Stale reports whether the connection has carried nothing either way
// for half the idle timeout the peer announced: the peer may be closing
// it, and a request sent now could cross its close, so a caller with a
// choice dials a new one. The time of the last packet is coarse (the
// endpoint's clock lags by up to a watchdog tick), which errs towards
// stale.
func (c *Conn) Stale() bool {
	return c.peerIdle > 0 && time.Now().UnixNano()-c.lastActive.Load() >= int64(c.peerIdle/2)
}

// active records traffic for the idle timeout; it stores only when the
// coarse clock moved, to keep the per-packet cost a load.
func (c *Conn) active() {
	if now := c.ep.clock.Load(); c.lastActive.Load() != now {
		c.lastActive.Store(now)
	}
}

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// PeerProcess is the process at the other end of a connection accepted
// over shared memory, as the kernel reports it (SO_PEERCRED); false for
// any other connection.
func (c *Conn) PeerProcess() (pid int32, ok bool) {
	p, ok := c.remote.(shmPeer)
	return p.pid, ok
}

// Done is closed when the connection has failed or been closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it is open).
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Close closes the connection. Pending operations fail with ErrClosed.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	return nil
}

// CloseWithError closes the connection, recording why; handlers see the
// reason in Closed.
func (c *Conn) CloseWithError(err error) { c.fail(err) }

// Wait blocks until the reader goroutine has exited (after Close or a
// failure), so no handler or READ placement runs any more.
func (c *Conn) Wait() { <-c.readerDone }

func (c *Conn) fail(err error) {
	c.closeOnce.Do(func() {
		if err == nil {
			err = ErrClosed
		}
		c.err = err
		close(c.done)
		c.nc.Close()
		c.quota.close()
		if c.wire != nil {
			c.wire.close()
		}
		c.opsMu.Lock()
		for id, o := range c.ops {
			delete(c.ops, id)
			o.done <- fmt.Errorf("%w: %v", ErrClosed, err)
		}
		c.opsMu.Unlock()
		c.ep.forget(c)
	})
}
