package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure an endpoint.
type Options struct {
	// MTU is the largest packet payload this endpoint receives (announced
	// to peers) and sends. Default DefaultMTU.
	MTU int
	// Quota is the number of receive buffers per connection. Default 16.
	Quota int
	// WriteTimeout fails a connection whose peer stops reading. Default 30s.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds the hello exchange. Default 5s.
	HandshakeTimeout time.Duration
	// MaxConns bounds inbound connections; more are refused. Default 4096.
	MaxConns int
	// MaxConnsPerHost, if positive, bounds inbound connections from one
	// IP address, so one client cannot take every slot.
	MaxConnsPerHost int
	// StallTimeout closes a connection whose peer stops sending in the
	// middle of a packet for this long. Default 10s.
	StallTimeout time.Duration
	// Link, if set, emulates a network link (bandwidth and delay) for
	// everything this endpoint sends; endpoints may share one (a node's).
	Link   *Link
	Logger *slog.Logger
	// Dial, if set, opens the TCP connections Dial makes (an NFS client
	// binds a reserved source port with it); default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (o *Options) fill() error {
	if o.MTU == 0 {
		o.MTU = DefaultMTU
	}
	if o.MTU < MinMTU || o.MTU > MaxMTU {
		return fmt.Errorf("fabric: MTU %d outside [%d, %d]", o.MTU, MinMTU, MaxMTU)
	}
	if o.Quota == 0 {
		o.Quota = 16
	}
	if o.Quota < 2 || o.Quota > 4096 {
		return fmt.Errorf("fabric: receive quota %d outside [2, 4096]", o.Quota)
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.MaxConns == 0 {
		o.MaxConns = 4096
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Endpoint is one fabric attachment (a NIC): it owns the region table,
// accepts and dials connections.
type Endpoint struct {
	opts    Options
	regions regions

	mu          sync.Mutex
	lns         []net.Listener
	conns       map[*Conn]struct{}
	handshaking int            // accepted connections still in their hello
	hosts       map[string]int // inbound connections by peer IP (with MaxConnsPerHost)
	closed      bool
	wg          sync.WaitGroup
	// readers counts connections whose reader goroutine has not exited:
	// a failed connection leaves conns at once but its reader may still be
	// calling its handler, and Close must wait for that.
	readers sync.WaitGroup
	stop    chan struct{}
	clock   atomic.Int64 // coarse unix nanoseconds, advanced by watch
}

// NewEndpoint creates an endpoint.
func NewEndpoint(opts Options) (*Endpoint, error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	e := &Endpoint{opts: opts, conns: make(map[*Conn]struct{}), hosts: make(map[string]int), stop: make(chan struct{})}
	e.clock.Store(time.Now().UnixNano())
	e.wg.Add(1)
	go e.watch()
	return e, nil
}

// ErrStalled is why a connection whose peer stopped mid-packet is closed.
var ErrStalled = errors.New("fabric: peer stalled in the middle of a packet")

// watch advances the coarse clock and closes connections stalled
// mid-packet: without it, a peer could pin a connection (and its receive
// quota) forever by sending half a packet, and enough such peers would
// exhaust the endpoint's connections.
func (e *Endpoint) watch() {
	defer e.wg.Done()
	t := time.NewTicker(max(e.opts.StallTimeout/8, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.clock.Store(now.UnixNano())
			limit := now.Add(-e.opts.StallTimeout).UnixNano()
			e.mu.Lock()
			var stalled []*Conn
			for c := range e.conns {
				if b := c.busySince.Load(); b != 0 && b < limit {
					stalled = append(stalled, c)
				}
			}
			e.mu.Unlock()
			for _, c := range stalled {
				e.opts.Logger.Info("fabric: closing stalled connection", "peer", c.RemoteAddr())
				c.CloseWithError(ErrStalled)
			}
		}
	}
}

// Options returns the endpoint's effective options.
func (e *Endpoint) Options() Options { return e.opts }

// Register makes buf accessible to peers with perm.
func (e *Endpoint) Register(buf []byte, perm Perm) *Region { return e.regions.register(buf, perm, nil) }

// RegisterFor registers buf for the peer of connection c alone: other
// connections of the endpoint are refused it even with its key (as an
// RDMA memory window bound to one queue pair).
func (e *Endpoint) RegisterFor(c *Conn, buf []byte, perm Perm) *Region {
	return e.regions.register(buf, perm, c)
}

// Deregister revokes a region: later accesses fail with an access error.
// It returns once no one-sided operation that began before is using the
// memory (a READ response still being written from it, a WRITE still
// being placed), so the caller may reuse it.
func (e *Endpoint) Deregister(r *Region) {
	e.regions.unmap(r)
	if idle := r.revokeWait(); idle != nil {
		<-idle
	}
}

// Release revokes r's key, like Deregister, and calls idle once no
// one-sided operation that began before is still using its memory (at
// once if none is): only then may the owner reuse or free it. idle may
// run on another goroutine.
func (e *Endpoint) Release(r *Region, idle func()) { e.regions.deregister(r, idle) }

// Listen accepts connections on addr (host:port) and hands their messages
// to h. It returns the bound address.
func (e *Endpoint) Listen(addr string, h Handler) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fabric: listening on %s: %w", addr, err)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		ln.Close()
		return nil, ErrClosed
	}
	e.lns = append(e.lns, ln)
	e.mu.Unlock()
	e.wg.Add(1)
	go e.acceptLoop(ln, h)
	return ln.Addr(), nil
}

// acceptLoop accepts until the listener is closed. Errors such as running
// out of file descriptors are survived with a backoff (as net/http does):
// a moment of exhaustion must not stop the node accepting for good.
// Connections still in their hello count against MaxConns, so a flood of
// bare TCP connects cannot pile up goroutines and descriptors.
func (e *Endpoint) acceptLoop(ln net.Listener, h Handler) {
	defer e.wg.Done()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			e.mu.Lock()
			closed := e.closed
			e.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			e.opts.Logger.Warn("fabric: accept failed, retrying", "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-e.stop:
				return
			}
			continue
		}
		backoff = 0
		var host string
		if e.opts.MaxConnsPerHost > 0 {
			host = nc.RemoteAddr().String()
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
		}
		e.mu.Lock()
		full := len(e.conns)+e.handshaking >= e.opts.MaxConns
		hostFull := host != "" && e.hosts[host] >= e.opts.MaxConnsPerHost
		if !full && !hostFull {
			e.handshaking++
			if host != "" {
				e.hosts[host]++
			}
		}
		e.mu.Unlock()
		if full || hostFull {
			e.opts.Logger.Warn("fabric: refusing connection, too many open", "peer", nc.RemoteAddr(), "max", e.opts.MaxConns,
				"from_this_host", hostFull)
			nc.Close()
			continue
		}
		go func() {
			_, err := e.handshake(nc, h, host)
			e.mu.Lock()
			e.handshaking--
			if err != nil {
				e.unhost(host)
			}
			e.mu.Unlock()
			if err != nil {
				e.opts.Logger.Debug("fabric: handshake failed", "peer", nc.RemoteAddr(), "err", err)
			}
		}()
	}
}

// Dial connects to a peer endpoint; h receives the messages the peer
// sends on this connection (typically replies).
func (e *Endpoint) Dial(ctx context.Context, addr string, h Handler) (*Conn, error) {
	dial := e.opts.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fabric: dialing %s: %w", addr, err)
	}
	c, err := e.handshake(nc, h, "")
	if err != nil {
		return nil, fmt.Errorf("fabric: connecting to %s: %w", addr, err)
	}
	return c, nil
}

const helloSize = 16

var helloMagic = [4]byte{'S', 'L', 'F', 1}

// handshake opens a connection; inHost is the peer's IP for an inbound
// connection counted against MaxConnsPerHost ("" otherwise).
func (e *Endpoint) handshake(nc net.Conn, h Handler, inHost string) (*Conn, error) {
	var hello [helloSize]byte
	copy(hello[:], helloMagic[:])
	binary.LittleEndian.PutUint32(hello[4:], uint32(e.opts.MTU))
	binary.LittleEndian.PutUint32(hello[8:], uint32(e.opts.Quota))
	nc.SetDeadline(time.Now().Add(e.opts.HandshakeTimeout))
	if _, err := nc.Write(hello[:]); err != nil {
		nc.Close()
		return nil, err
	}
	var peer [helloSize]byte
	if _, err := io.ReadFull(nc, peer[:]); err != nil {
		nc.Close()
		return nil, err
	}
	if [4]byte(peer[:4]) != helloMagic {
		nc.Close()
		return nil, fmt.Errorf("%w: bad hello %q", ErrProtocol, peer[:4])
	}
	mtu := int(binary.LittleEndian.Uint32(peer[4:]))
	if mtu < MinMTU || mtu > MaxMTU {
		nc.Close()
		return nil, fmt.Errorf("%w: peer MTU %d", ErrProtocol, mtu)
	}
	pq := int(binary.LittleEndian.Uint32(peer[8:]))
	if pq < 2 || pq > 4096 {
		nc.Close()
		return nil, fmt.Errorf("%w: peer receive quota %d", ErrProtocol, pq)
	}
	nc.SetDeadline(time.Time{})
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		nc.Close()
		return nil, ErrClosed
	}
	e.readers.Add(1)
	c := newConn(e, nc, h, mtu, pq, inHost)
	e.conns[c] = struct{}{}
	e.mu.Unlock()
	return c, nil
}

func (e *Endpoint) forget(c *Conn) {
	e.mu.Lock()
	if _, ok := e.conns[c]; ok {
		delete(e.conns, c)
		e.unhost(c.inHost)
	}
	e.mu.Unlock()
}

// unhost uncounts an inbound connection from host. Caller holds e.mu.
func (e *Endpoint) unhost(host string) {
	if host == "" {
		return
	}
	if e.hosts[host]--; e.hosts[host] <= 0 {
		delete(e.hosts, host)
	}
}

// Close stops listening and closes every connection.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if !e.closed {
		close(e.stop)
	}
	e.closed = true
	lns := e.lns
	conns := make([]*Conn, 0, len(e.conns))
	for c := range e.conns {
		conns = append(conns, c)
	}
	e.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
	e.wg.Wait()
	e.readers.Wait() // including connections that failed before Close
	return nil
}
