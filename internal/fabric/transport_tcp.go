package fabric

import (
	"bufio"
	"context"
	"fmt"
	"net"
)

// The TCP backend: a connection is a TCP connection (TLS on it if the
// endpoint's options ask), and one-sided operations are READ and WRITE
// packets on it, served by the target's reader — the emulation of an
// RDMA NIC over a network without one.

// tcpTransport dials and accepts TCP connections with the endpoint's
// options: Dial, HandshakeTimeout, PeerTimeout, ServerTLS, DialTLS.
type tcpTransport struct{ opts *Options }

func (t tcpTransport) listen(addr string) (listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return tcpListener{ln: ln, opts: t.opts}, nil
}

func (t tcpTransport) dial(ctx context.Context, addr string) (stream, error) {
	dial := t.opts.Dial
	if dial == nil {
		// A peer whose host is cut off answers nothing: without a bound
		// the kernel retries the SYN for minutes, while another replica
		// could serve.
		d := net.Dialer{Timeout: t.opts.HandshakeTimeout}
		dial = d.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", addr, err)
	}
	setPeerTimeout(nc, t.opts.PeerTimeout)
	if nc, err = clientTLS(ctx, t.opts, nc, addr); err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return newNetStream(nc), nil
}

// explainHello adds a hint to a failed hello (tls.go).
func (t tcpTransport) explainHello(err error) error {
	return explainPlain(err, t.opts.DialTLS != nil)
}

type tcpListener struct {
	ln   net.Listener
	opts *Options
}

// accept returns an accepted connection, wrapped in TLS if the endpoint
// serves it; the TLS handshake runs on its first read or write, inside
// the hello's deadline (and its admission slot).
func (l tcpListener) accept() (stream, error) {
	nc, err := l.ln.Accept()
	if err != nil {
		return nil, err
	}
	setPeerTimeout(nc, l.opts.PeerTimeout)
	return newNetStream(serverTLS(l.opts, nc)), nil
}

func (l tcpListener) addr() net.Addr { return l.ln.Addr() }
func (l tcpListener) close() error   { return l.ln.Close() }

// netStream is a stream over a net.Conn: TCP, TLS over TCP, or any other
// connected socket a backend carries packets on (a unix socket).
type netStream struct {
	net.Conn
	// tlsw coalesces a batch's small pieces (headers) into full TLS
	// records; nil for plain TCP, where writev does that.
	tlsw *bufio.Writer
}

func newNetStream(nc net.Conn) *netStream {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return &netStream{Conn: nc, tlsw: tlsWriter(nc)}
}

// writev writes the batch with one writev system call on a plain socket.
func (s *netStream) writev(iov [][]byte) error {
	bufs := net.Buffers(iov)
	if s.tlsw != nil {
		if _, err := bufs.WriteTo(s.tlsw); err != nil {
			return err
		}
		return s.tlsw.Flush()
	}
	_, err := bufs.WriteTo(s.Conn)
	return err
}
