package fabric

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/connlimit"
)

// Options configure an endpoint.
type Options struct {
	// MTU is the largest packet payload this endpoint receives (announced
	// to peers) and sends. Default DefaultMTU.
	MTU int
	// Quota is the number of receive buffers per connection. Default 16.
	Quota int
	// WriteTimeout fails a connection whose peer stops reading. Default
	// 30s. On Linux over TCP, PeerTimeout cuts such a peer first.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds the TCP connect of a Dial and the hello
	// exchange, each. Default 5s.
	HandshakeTimeout time.Duration
	// PeerTimeout fails a connection whose peer leaves what was sent
	// to it unacknowledged (at the TCP level) this long: a peer cut off
	// from the network, and on Linux 5.11 and later one whose receive
	// window stays closed this long (it has stopped reading). Default
	// DefaultPeerTimeout; negative: the kernel's (minutes).
	PeerTimeout time.Duration
	// MaxConns bounds inbound connections, those still in their hello
	// included; more are refused. Default 4096; negative: no bound.
	MaxConns int
	// MaxConnsPerHost bounds inbound connections from one host (IPv4
	// address, IPv6 /64), so one host cannot take every slot. Default
	// DefaultMaxConnsPerHost; negative: no bound.
	MaxConnsPerHost int
	// IdleTimeout closes an inbound connection that has carried no packet
	// either way for this long, so idle connections do not hold slots
	// for ever. It is announced in the hello: a Pool stops reusing a
	// connection well before the peer would close it. Default
	// DefaultIdleTimeout; negative: never.
	IdleTimeout time.Duration
	// StallTimeout closes a connection whose peer stops sending in the
	// middle of a packet for this long. Default 10s.
	StallTimeout time.Duration
	// Link, if set, emulates a network link (bandwidth and delay) for
	// everything this endpoint sends; endpoints may share one (a node's).
	Link *Link
	// ServerTLS, if set, has connections Listen accepts speak TLS
	// (tls.go); DialTLS, if set, gives the TLS configuration for a
	// connection Dial makes to addr — it decides which peer is
	// acceptable there. Either side without them speaks plain TCP.
	ServerTLS *tls.Config
	DialTLS   func(addr string) (*tls.Config, error)
	Logger    *slog.Logger
	// Dial, if set, opens the TCP connections Dial makes (an NFS client
	// binds a reserved source port with it); default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// Fabric selects how connections are made (FabricTCP if empty):
	// FabricAuto uses shared memory to peers on this host and TCP to
	// others, FabricShm refuses peers elsewhere. With TLS (ServerTLS,
	// DialTLS) or a Dial function, connections are TCP: the TLS peer
	// check is the admission, and Dial is asked for TCP.
	Fabric Fabric

	// transport, if set, replaces TCP (transport.go); tests run the
	// fabric over another backend with it. Dial, PeerTimeout and the TLS
	// options are TCP's.
	transport transport
}

func (o *Options) fill() error {
	switch o.Fabric {
	case "":
		o.Fabric = FabricTCP
	case FabricTCP, FabricAuto:
	case FabricShm:
		if o.ServerTLS != nil || o.DialTLS != nil {
			return errors.New("fabric: shared-memory fabric with TLS: TLS connections are TCP")
		}
		if o.Dial != nil {
			return errors.New("fabric: shared-memory fabric with a Dial function: it dials TCP")
		}
	default:
		return fmt.Errorf("fabric: unknown fabric %q (auto, tcp or shm)", o.Fabric)
	}
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
	if o.PeerTimeout == 0 {
		o.PeerTimeout = DefaultPeerTimeout
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxConnsPerHost == 0 {
		o.MaxConnsPerHost = DefaultMaxConnsPerHost
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.IdleTimeout > 0 && o.IdleTimeout < time.Millisecond || o.IdleTimeout > maxIdleTimeout {
		return fmt.Errorf("fabric: idle timeout %s outside [1ms, %s]", o.IdleTimeout, maxIdleTimeout)
	}
	if o.StallTimeout == 0 {
		o.StallTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Defaults of Options.
const (
	DefaultMaxConns        = connlimit.DefaultMax
	DefaultMaxConnsPerHost = connlimit.DefaultPerHost
	DefaultIdleTimeout     = 5 * time.Minute
	// DefaultPeerTimeout: see Options.PeerTimeout. Longer than a node's
	// default silence before meta marks it down (10 s).
	DefaultPeerTimeout = 15 * time.Second
	// maxIdleTimeout is what the hello can announce (milliseconds in 32
	// bits).
	maxIdleTimeout = time.Duration(1<<32-1) * time.Millisecond
)

// ErrIdle is why an inbound connection idle for IdleTimeout is closed.
var ErrIdle = errors.New("fabric: connection idle too long")

// Endpoint is one fabric attachment (a NIC): it owns the region table,
// accepts and dials connections.
type Endpoint struct {
	opts    Options
	tr      transport
	regions regions
	mems    shmMems // shared memory from Alloc
	// guardBufs hold guarded optimistic reads' copies (*[]byte).
	guardBufs sync.Pool

	// admit counts inbound connections, from their accept to their end.
	admit *connlimit.Limiter

	mu     sync.Mutex
	lns    []listener
	conns  map[*Conn]struct{}
	closed bool
	wg     sync.WaitGroup
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
	e := &Endpoint{opts: opts, conns: make(map[*Conn]struct{}), stop: make(chan struct{}),
		admit: connlimit.New(opts.MaxConns, opts.MaxConnsPerHost)}
	e.tr = opts.transport
	if e.tr == nil {
		e.tr = newTransport(&e.opts)
	}
	if t, ok := e.tr.(interface{ withOptions(*Options) transport }); ok {
		e.tr = t.withOptions(&e.opts)
	}
	e.clock.Store(time.Now().UnixNano())
	e.wg.Add(1)
	go e.watch()
	return e, nil
}

// ErrStalled is why a connection whose peer stopped mid-packet is closed.
var ErrStalled = errors.New("fabric: peer stalled in the middle of a packet")

// watch advances the coarse clock and closes connections stalled
// mid-packet, and inbound ones idle between packets: without it, a peer
// could pin a connection (and its receive quota) forever by sending half
// a packet, or nothing, and enough such peers would exhaust the
// endpoint's connections.
func (e *Endpoint) watch() {
	defer e.wg.Done()
	tick := e.opts.StallTimeout
	if e.opts.IdleTimeout > 0 {
		tick = min(tick, e.opts.IdleTimeout)
	}
	t := time.NewTicker(max(tick/8, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			e.clock.Store(now.UnixNano())
			stallLimit := now.Add(-e.opts.StallTimeout).UnixNano()
			idleLimit := now.Add(-e.opts.IdleTimeout).UnixNano()
			type closing struct {
				c   *Conn
				err error
			}
			var victims []closing
			e.mu.Lock()
			for c := range e.conns {
				switch b := c.busySince.Load(); {
				case b != 0 && b < stallLimit:
					victims = append(victims, closing{c, ErrStalled})
				case b == 0 && c.inbound && e.opts.IdleTimeout > 0 && c.lastActive.Load() < idleLimit:
					victims = append(victims, closing{c, ErrIdle})
				}
			}
			e.mu.Unlock()
			for _, x := range victims {
				// Debug: a peer could otherwise write the log at will.
				e.opts.Logger.Debug("fabric: closing connection", "peer", x.c.RemoteAddr(), "why", x.err)
				x.c.CloseWithError(x.err)
			}
		}
	}
}

// Options returns the endpoint's effective options.
func (e *Endpoint) Options() Options { return e.opts }

// Register makes buf accessible to peers with perm.
func (e *Endpoint) Register(buf []byte, perm Perm) *Region {
	return e.regions.register(&Region{buf: buf, perm: perm, mem: e.mems.lookup(buf)})
}

// Regions is how many regions are registered now (a leak shows here).
func (e *Endpoint) Regions() int {
	e.regions.mu.RLock()
	defer e.regions.mu.RUnlock()
	return len(e.regions.m)
}

// RegisterGuarded registers buf for optimistic READs alone, each of at
// most maxRead bytes (larger ones are refused before any buffer is
// taken) and admitted by guard (which checks the initiator's
// authenticator): peers cannot READ or WRITE it with plain one-sided
// operations, and a shared-memory peer is never given its memory (it
// reads it by packets, through the guard).
func (e *Endpoint) RegisterGuarded(buf []byte, maxRead int, guard Guard) *Region {
	return e.regions.register(&Region{buf: buf, guard: guard, guardMax: uint64(min(maxRead, maxGuardedRead))})
}

// RegisterAllowed registers buf for the connections later passed to the
// region's Allow alone; others are refused it even with its key. A
// storage node gives each peer process on its host a region of its own
// this way, allowing that process's connections.
func (e *Endpoint) RegisterAllowed(buf []byte, perm Perm) *Region {
	return e.regions.register(&Region{buf: buf, perm: perm, mem: e.mems.lookup(buf), restricted: true, allowed: map[*Conn]struct{}{}})
}

// RegisterFor registers buf for the peer of connection c alone: other
// connections of the endpoint are refused it even with its key (as an
// RDMA memory window bound to one queue pair).
func (e *Endpoint) RegisterFor(c *Conn, buf []byte, perm Perm) *Region {
	return e.regions.register(&Region{buf: buf, perm: perm, conn: c, mem: e.mems.lookup(buf)})
}

// Deregister revokes a region: later accesses fail with an access error.
// It returns once no one-sided operation that began before is using the
// memory (a READ response still being written from it, a WRITE still
// being placed), so the caller may reuse it.
//
// A region in shared memory (Alloc) that shared-memory peers were granted
// is theirs to copy without this endpoint's CPU: Deregister then also
// waits until none of them is inside a copy (shm_direct.go), failing a
// connection whose peer holds one longer than WriteTimeout.
func (e *Endpoint) Deregister(r *Region) {
	e.regions.unmap(r)
	if idle := r.revokeWait(); idle != nil {
		<-idle
	}
	e.releaseGrants(r)
}

// Release revokes r's key, like Deregister, and calls idle once no
// one-sided operation that began before is still using its memory (at
// once if none is): only then may the owner reuse or free it. idle may
// run on another goroutine.
func (e *Endpoint) Release(r *Region, idle func()) {
	if r.mem == nil {
		e.regions.deregister(r, idle)
		return
	}
	e.regions.deregister(r, func() {
		if !r.granted() {
			e.releaseGrants(r)
			if idle != nil {
				idle()
			}
			return
		}
		// Peers' copies are waited for by polling their shared counts:
		// not on the goroutine that ended the last local use.
		go func() {
			e.releaseGrants(r)
			if idle != nil {
				idle()
			}
		}()
	})
}

// Listen accepts connections on addr (host:port) and hands their messages
// to h. It returns the bound address.
func (e *Endpoint) Listen(addr string, h Handler) (net.Addr, error) {
	ln, err := e.tr.listen(addr)
	if err != nil {
		return nil, fmt.Errorf("fabric: listening on %s: %w", addr, err)
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		ln.close()
		return nil, ErrClosed
	}
	e.lns = append(e.lns, ln)
	e.mu.Unlock()
	e.wg.Add(1)
	go e.acceptLoop(ln, h)
	return ln.addr(), nil
}

// acceptLoop accepts until the listener is closed. Errors such as running
// out of file descriptors are survived with a backoff (as net/http does):
// a moment of exhaustion must not stop the node accepting for good.
// Connections still in their hello count against MaxConns, so a flood of
// bare TCP connects cannot pile up goroutines and descriptors.
func (e *Endpoint) acceptLoop(ln listener, h Handler) {
	defer e.wg.Done()
	var backoff time.Duration
	for {
		l, err := ln.accept()
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
		release, err := e.admit.Admit(l.RemoteAddr())
		if err != nil {
			connlimit.Log(e.opts.Logger, "fabric", l.RemoteAddr(), err)
			l.close()
			continue
		}
		go func() {
			if _, err := e.handshake(l, h, release); err != nil {
				release()
				e.opts.Logger.Debug("fabric: handshake failed", "peer", l.RemoteAddr(), "err", err)
			}
		}()
	}
}

// Dial connects to a peer endpoint; h receives the messages the peer
// sends on this connection (typically replies).
func (e *Endpoint) Dial(ctx context.Context, addr string, h Handler) (*Conn, error) {
	l, err := e.tr.dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	c, err := e.handshake(l, h, nil)
	if err != nil {
		if x, ok := e.tr.(interface{ explainHello(error) error }); ok {
			err = x.explainHello(err)
		}
		return nil, fmt.Errorf("fabric: connecting to %s: %w", addr, err)
	}
	return c, nil
}

const helloSize = 16

var helloMagic = [4]byte{'S', 'L', 'F', 1}

// handshake opens a connection; release frees an inbound connection's
// slot (nil for one dialed), which the connection then owns: the caller
// releases it only if handshake fails.
//
// The hello is the magic, the MTU and receive quota, and the idle
// timeout in milliseconds (0: none; earlier versions sent 0).
func (e *Endpoint) handshake(l link, h Handler, release func()) (*Conn, error) {
	c, err := e.hello(l, h, release)
	if err != nil {
		l.close() // and the transport's own sockets beside l.Conn
	}
	return c, err
}

func (e *Endpoint) hello(l link, h Handler, release func()) (*Conn, error) {
	nc := l.Conn
	var hello [helloSize]byte
	copy(hello[:], helloMagic[:])
	binary.LittleEndian.PutUint32(hello[4:], uint32(e.opts.MTU))
	binary.LittleEndian.PutUint32(hello[8:], uint32(e.opts.Quota))
	if e.opts.IdleTimeout > 0 {
		binary.LittleEndian.PutUint32(hello[12:], uint32(e.opts.IdleTimeout/time.Millisecond))
	}
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
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		nc.Close()
		return nil, ErrClosed
	}
	peerIdle := time.Duration(binary.LittleEndian.Uint32(peer[12:])) * time.Millisecond
	e.readers.Add(1)
	c := newConn(e, l, h, mtu, pq, peerIdle, release)
	e.conns[c] = struct{}{}
	e.mu.Unlock()
	return c, nil
}

func (e *Endpoint) forget(c *Conn) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
	if c.release != nil {
		c.release()
	}
}

// SetPeers names the cluster's members' addresses, whose connections are
// admitted past MaxConns (connlimit.Limiter.SetPeers).
func (e *Endpoint) SetPeers(addrs []string) { e.admit.SetPeers(addrs) }

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
		ln.close()
	}
	for _, c := range conns {
		c.Close()
	}
	e.wg.Wait()
	e.readers.Wait() // including connections that failed before Close
	e.mems.closeFiles()
	return nil
}
