package fabric

import (
	"context"
	"errors"
	"net"
)

// The transport seam. A Conn's semantics — packet framing and headers,
// the hello, receive quotas, message ordering, the region table with its
// keys, bounds, bindings and revocation, one-sided completion and access
// errors, link emulation, idle and stall timeouts — are the fabric's own
// and written once (conn*.go, endpoint.go, region.go). What differs
// between ways of reaching a peer is narrower, and is a transport's:
//
//   - how a connection is opened (dial) and accepted (listen), with what
//     socket options and security (TCP: a net.Dialer, TCP_USER_TIMEOUT,
//     TLS; shared memory: a unix socket to a same-host peer);
//   - what carries the bytes of the framed packets (a net.Conn);
//   - optionally, how a one-sided operation reaches the target's region
//     (directAccess): without it a Conn sends READ and WRITE packets that
//     the target's reader serves; a transport that can reach the target's
//     memory itself (shared memory: the initiator copies, the target's CPU
//     does nothing) performs them directly.
//
// TCP (transport_tcp.go) is the one production backend; a shared-memory
// backend is added beside it, and selected per endpoint or per peer,
// without the layers above (engine, policy, fabricrpc) changing: they see
// only Endpoint, Conn, Region and Packet.
//
// The interfaces are unexported: backends live in this package, and the
// per-packet path is what it was, a writev on the connection's net.Conn,
// with nothing boxed per packet.

// transport opens connections.
type transport interface {
	// listen accepts connections at addr (host:port for TCP).
	listen(addr string) (listener, error)
	// dial opens a connection to the listener at addr, bounded by ctx
	// and, for its set-up, by the endpoint's HandshakeTimeout.
	dial(ctx context.Context, addr string) (link, error)
}

// listener accepts connections.
type listener interface {
	// accept returns the next connection; after close it returns an
	// error wrapping net.ErrClosed. Other errors are transient (the
	// endpoint retries with a backoff).
	accept() (link, error)
	addr() net.Addr
	close() error
}

// link is a connection a transport opened.
//
// Its bytes move on a net.Conn: a reliable, ordered, full-duplex stream
// carrying the framed packets (TCP, TLS over TCP, a unix socket). The
// Conn writes each batch of packets with net.Buffers.WriteTo, one writev
// on a socket, exactly as before there was a seam: a stream interface of
// our own would put a frame more on the send path, and a READ is served
// on a goroutine of its own whose stack would then grow on every READ
// (measured: +16% CPU per 4 KiB READ). A backend that wraps its socket
// to add behaviour loses the writev (net.Buffers only uses it on the
// net package's own types): keep the socket itself here.
type link struct {
	net.Conn
	// direct, if set, performs one-sided operations without packets.
	direct directAccess
	// remote, if set, names the peer instead of the net.Conn's address
	// (a unix socket's says nothing).
	remote net.Addr
}

// close closes a link no Conn was made of: its net.Conn, and what the
// transport keeps beside it.
func (l link) close() {
	l.Conn.Close()
	if a, ok := l.direct.(interface{ abort() }); ok {
		a.abort()
	}
}

// RemoteAddr names the peer.
func (l link) RemoteAddr() net.Addr {
	if l.remote != nil {
		return l.remote
	}
	return l.Conn.RemoteAddr()
}

// directAccess is implemented by transports that reach the peer's
// registered regions themselves. Conn.Read and Conn.Write then call it
// instead of sending READ and WRITE packets for the target's reader to
// serve. The target's regions keep their semantics: key, conn binding
// (RegisterFor), permission and bounds are checked as regions.access
// does, and a revoked region is never touched after Deregister returns.
// An access refused returns an error wrapping ErrNoRegion, ErrBounds or
// ErrPerm: the Conn turns it into an *AccessError and fails the
// connection, as on TCP. Any other error is the connection's failure.
// Both calls return once the bytes are placed, so a WRITE is ordered
// before any later send on the connection. errNotDirect says the region
// is not one the transport can reach (its memory is not shared: a
// buffer registered from the heap, say): the Conn then sends packets, and
// the target serves them as over TCP.
type directAccess interface {
	readRegion(ctx context.Context, key, off uint64, dst []byte) error
	writeRegion(ctx context.Context, key, off uint64, src []byte) error
}

var errNotDirect = errors.New("fabric: region not reachable directly")

// connBinder is implemented by directAccess values that must know the
// Conn they belong to (to serve the peer's direct accesses against its
// endpoint's regions and its RegisterFor bindings); newConn calls bind
// before the connection carries anything.
type connBinder interface {
	bind(c *Conn)
}
