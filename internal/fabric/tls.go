package fabric

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
)

// TLS on the fabric (`--fabric-tls`): a connection is wrapped in TLS 1.3
// right after the TCP connect or accept, before the hello; everything
// after runs unchanged over the encrypted stream. Who is acceptable is
// the configurations' business (Options.ServerTLS, DialTLS): storage
// nodes check that a peer's certificate names the node they meant to
// reach. The handshake is bounded by HandshakeTimeout like the hello,
// and an accepted connection counts against MaxConns while in it.

// serverTLS wraps an accepted connection when the endpoint serves TLS;
// the handshake runs on its first read or write, inside the hello's
// deadline.
func serverTLS(o *Options, nc net.Conn) net.Conn {
	if o.ServerTLS == nil {
		return nc
	}
	return tls.Server(nc, o.ServerTLS)
}

// clientTLS runs the TLS handshake on a dialled connection when the
// endpoint dials with TLS, so a refused peer is reported as such.
func clientTLS(ctx context.Context, o *Options, nc net.Conn, addr string) (net.Conn, error) {
	if o.DialTLS == nil {
		return nc, nil
	}
	cfg, err := o.DialTLS(addr)
	if err != nil {
		nc.Close()
		return nil, err
	}
	tc := tls.Client(nc, cfg)
	hctx, cancel := context.WithTimeout(ctx, o.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		nc.Close()
		var rec tls.RecordHeaderError
		if errors.As(err, &rec) {
			return nil, fmt.Errorf("TLS: the peer does not speak TLS (a node without --fabric-tls?): %w", err)
		}
		return nil, fmt.Errorf("TLS: %w", err)
	}
	return tc, nil
}

// explainPlain adds a hint to a plain connection's failed hello: a peer
// serving TLS reads the hello as a bad handshake and hangs up.
func explainPlain(err error, tlsOn bool) error {
	if !tlsOn && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)) {
		return fmt.Errorf("%w (does the peer run with --fabric-tls?)", err)
	}
	return err
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "read"
}

// tlsWriter returns a writer batching writes into full TLS records for
// a TLS connection (writev cannot: each piece would be a record of its
// own, a 32-byte header sealed alone), nil for others.
func tlsWriter(nc net.Conn) *bufio.Writer {
	if _, ok := nc.(*tls.Conn); !ok {
		return nil
	}
	return bufio.NewWriterSize(nc, 16<<10)
}
