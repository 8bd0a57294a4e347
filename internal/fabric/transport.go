package fabric

import (
	"context"
	"io"
	"net"
	"time"
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
//   - how the bytes of framed packets move (a stream);
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
// per-packet path stays one interface call per batch, with nothing boxed
// per packet.

// transport opens streams.
type transport interface {
	// listen accepts connections at addr (host:port for TCP).
	listen(addr string) (listener, error)
	// dial opens a stream to the listener at addr, bounded by ctx and,
	// for its connection set-up, by the endpoint's HandshakeTimeout.
	dial(ctx context.Context, addr string) (stream, error)
}

// listener accepts streams.
type listener interface {
	// accept returns the next stream; after close it returns an error
	// wrapping net.ErrClosed. Other errors are transient (the endpoint
	// retries with a backoff).
	accept() (stream, error)
	addr() net.Addr
	close() error
}

// stream is one connection's reliable, ordered, full-duplex byte stream
// carrying framed packets (packet.go). Reads come from the connection's
// reader goroutine only; writes are serialised by the connection.
type stream interface {
	io.Reader
	// Write writes b whole (the hello, an emulated link's delivery).
	io.Writer
	// writev writes the batch of buffers whole and in order, as few
	// system calls as the transport can: the per-batch send of every
	// packet. It must not retain iov or its buffers after returning.
	writev(iov [][]byte) error
	// SetDeadline bounds the hello; SetWriteDeadline bounds sends (the
	// endpoint's WriteTimeout) so a peer that stops reading fails the
	// connection.
	SetDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
	// RemoteAddr names the peer (admission control counts inbound
	// connections by its host).
	RemoteAddr() net.Addr
	// Close ends the stream; a blocked Read or Write returns.
	Close() error
}

// directAccess is implemented by streams whose transport reaches the
// peer's registered regions itself. Conn.Read and Conn.Write then call
// it instead of sending READ and WRITE packets for the target's reader to
// serve. The target's regions keep their semantics: key, conn binding
// (RegisterFor), permission and bounds are checked as regions.access
// does, and a revoked region is never touched after Deregister returns.
// An access refused returns an error wrapping ErrNoRegion, ErrBounds or
// ErrPerm: the Conn turns it into an *AccessError and fails the
// connection, as on TCP. Any other error is the connection's failure.
// Both calls return once the bytes are placed, so a WRITE is ordered
// before any later send on the connection.
type directAccess interface {
	readRegion(ctx context.Context, key, off uint64, dst []byte) error
	writeRegion(ctx context.Context, key, off uint64, src []byte) error
}

// connBinder is implemented by streams that must know the Conn they carry
// (to serve the peer's direct accesses against its endpoint's regions and
// its RegisterFor bindings); newConn calls bind before the connection
// carries anything.
type connBinder interface {
	bind(c *Conn)
}
