package meta

import (
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"

	"github.com/sluicefs/sluice/internal/config"
)

// StartOptions configure Start: the service (Options) and how it is
// served, the one start-up `sluice meta` and a whole-cluster process
// (package cluster) share.
type StartOptions struct {
	// Options are the service's (Open). ProbeNodeAddr defaults to
	// DialProbe(DefaultProbeTimeout): a served meta checks that it
	// reaches a registering node.
	Options
	// Listen is the TCP address the HTTP API is served on over TLS.
	Listen string
	// Advertise is HOST or HOST:PORT that clients and nodes reach meta
	// at (ResolveAdvertise); empty: the listen address.
	Advertise string
	// ConfPath is where the operator's client configuration is written;
	// default Dir/client.conf (WriteClientConf).
	ConfPath string
	// RepairParallel chunks are repaired at once through the Repairer
	// NewRepairer makes for meta's own client configuration (SystemConf);
	// 0 or no NewRepairer: meta repairs nothing by itself. Its closer is
	// closed after the service.
	RepairParallel int
	NewRepairer    func(conf config.ClientConf) (Repairer, io.Closer, error)
}

// Server is a meta service being served (Start).
type Server struct {
	Service *Service
	// Addr is the address clients and nodes reach meta at (written into
	// the client configuration); ListenAddr the one it listens on.
	Addr       string
	ListenAddr net.Addr
	ConfPath   string // the operator's client configuration

	errc   chan error
	repair io.Closer
}

// Start opens the service in opts.Dir, listens, writes the operator's
// client configuration, starts repair and serves in the background until
// Close. Nothing is made if the advertised address is invalid.
func Start(opts StartOptions) (*Server, error) {
	if _, err := ResolveAdvertise(opts.Advertise, &net.TCPAddr{}); err != nil {
		return nil, err // before anything is made
	}
	if opts.ProbeNodeAddr == nil {
		opts.ProbeNodeAddr = DialProbe(DefaultProbeTimeout)
	}
	ms, err := Open(opts.Options)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		ms.Close()
		return nil, fmt.Errorf("meta: listening on %s: %w", opts.Listen, err)
	}
	s := &Server{Service: ms, ListenAddr: ln.Addr(), ConfPath: opts.ConfPath, errc: make(chan error, 1)}
	if s.Addr, err = ResolveAdvertise(opts.Advertise, ln.Addr()); err != nil {
		ln.Close()
		ms.Close()
		return nil, err
	}
	ms.SetMetaAddr(s.Addr)
	if s.ConfPath == "" {
		s.ConfPath = filepath.Join(opts.Dir, config.FileName)
	}
	if err := ms.SaveClientConf(s.ConfPath, s.Addr); err != nil {
		ln.Close()
		ms.Close()
		return nil, err
	}
	if opts.RepairParallel > 0 && opts.NewRepairer != nil {
		r, closer, err := opts.NewRepairer(ms.SystemConf(s.Addr))
		if err != nil {
			ln.Close()
			ms.Close()
			return nil, err
		}
		ms.StartRepair(r, opts.RepairParallel)
		s.repair = closer
	}
	go func() { s.errc <- ms.Serve(ln) }()
	return s, nil
}

// Err yields the error the server stopped serving with (nil after Close).
func (s *Server) Err() <-chan error { return s.errc }

// Close stops serving (calls in progress get a few seconds), closes the
// service, then its repair worker.
func (s *Server) Close() error {
	err := s.Service.Close()
	if s.repair != nil {
		if rerr := s.repair.Close(); err == nil {
			err = rerr
		}
	}
	return err
}

// ResolveAdvertise is the address meta tells clients: advertise (its
// port defaulting to the one meta listens on, ln's), else the listen
// address (AdvertiseAddr).
func ResolveAdvertise(advertise string, ln net.Addr) (string, error) {
	if advertise == "" {
		return AdvertiseAddr(ln.String()), nil
	}
	_, lport, _ := net.SplitHostPort(ln.String())
	host, port, err := net.SplitHostPort(advertise)
	if err != nil {
		host, port = advertise, lport // a host alone
	}
	if port == "" || port == "0" {
		port = lport
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("--advertise %q: give an address other hosts can reach meta at, not an unspecified one", advertise)
	}
	if strings.ContainsAny(host, "/ ") {
		return "", fmt.Errorf("--advertise %q: not a host name or address", advertise)
	}
	return net.JoinHostPort(host, port), nil
}
