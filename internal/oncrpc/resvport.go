package oncrpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"syscall"
)

// ResvPort says whether a client binds a reserved source port (below
// 1024), as NFS clients running as root do (bindresvport), so that
// servers whose exports are "secure" (the default) take its calls.
type ResvPort int

const (
	// ResvAuto binds a reserved port if the process may (root, or
	// CAP_NET_BIND_SERVICE), else any port.
	ResvAuto ResvPort = iota
	// ResvRequired fails where no reserved port can be bound.
	ResvRequired
	// ResvNone binds any port.
	ResvNone
)

// ParseResvPort reads auto, yes or no.
func ParseResvPort(s string) (ResvPort, error) {
	switch s {
	case "auto":
		return ResvAuto, nil
	case "yes":
		return ResvRequired, nil
	case "no":
		return ResvNone, nil
	}
	return 0, fmt.Errorf("%q: auto, yes or no", s)
}

// Reserved ports are tried from 512 to 1023, as glibc's bindresvport and
// libnfs do (below 512 are well-known services).
const (
	resvLow  = 512
	resvHigh = 1023
)

// errNoResvPort: every reserved port was in use.
var errNoResvPort = errors.New("oncrpc: no reserved port (512-1023) free")

// DialTCP connects to addr over TCP from a reserved source port as resv
// says. SO_REUSEADDR lets a port whose last connection is in TIME_WAIT
// be bound again (connect then fails only for the same peer, and the
// next port is tried).
func DialTCP(ctx context.Context, network, addr string, resv ResvPort) (net.Conn, error) {
	if resv == ResvNone {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	start := rand.IntN(resvHigh - resvLow + 1)
	for i := range resvHigh - resvLow + 1 {
		port := resvLow + (start+i)%(resvHigh-resvLow+1)
		d := net.Dialer{LocalAddr: &net.TCPAddr{Port: port}, Control: reuseAddr}
		nc, err := d.DialContext(ctx, network, addr)
		switch {
		case err == nil:
			return nc, nil
		case errors.Is(err, syscall.EADDRINUSE), errors.Is(err, syscall.EADDRNOTAVAIL):
			continue
		case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
			if resv == ResvRequired {
				return nil, fmt.Errorf("oncrpc: binding a reserved source port (the server's exports are secure by default; run as root or with CAP_NET_BIND_SERVICE): %w", err)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		default:
			return nil, err
		}
	}
	if resv == ResvRequired {
		return nil, errNoResvPort
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func reuseAddr(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	return serr
}

// DialResv connects over TCP from a reserved source port as resv says.
func DialResv(ctx context.Context, addr string, resv ResvPort) (*Client, error) {
	nc, err := DialTCP(ctx, "tcp", addr, resv)
	if err != nil {
		return nil, fmt.Errorf("oncrpc: %w", err)
	}
	return NewClient(nc), nil
}
