package fabric

import (
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

func (t tcpTransport) dial(ctx context.Context, addr string) (link, error) {
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
		return link{}, fmt.Errorf("dialing %s: %w", addr, err)
	}
	setPeerTimeout(nc, t.opts.PeerTimeout)
	if nc, err = clientTLS(ctx, t.opts, nc, addr); err != nil {
		return link{}, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return tcpLink(nc), nil
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
func (l tcpListener) accept() (link, error) {
	nc, err := l.ln.Accept()
	if err != nil {
		return link{}, err
	}
	setPeerTimeout(nc, l.opts.PeerTimeout)
	return tcpLink(serverTLS(l.opts, nc)), nil
}

func (l tcpListener) addr() net.Addr { return l.ln.Addr() }
func (l tcpListener) close() error   { return l.ln.Close() }

func tcpLink(nc net.Conn) link {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	return link{Conn: nc}
}
