package meta

import (
	"cmp"
	"net"

	"github.com/sluicefs/sluice/internal/connlimit"
)

// limitConns bounds the connections Serve holds, in all and from one
// host (Options.MaxConns and MaxConnsPerHost; 0: connlimit's defaults,
// negative: no bound), counted from their accept, so a flood from one
// host leaves nodes' heartbeats and other clients served. Serve's HTTP
// timeouts close what is idle: 10 s for a request's header, 2 minutes
// between requests (clients drop theirs after 90 s, so they never send
// on one meta is closing), and 5 minutes to write a reply (clients give
// up after 30 s).
func (s *Service) limitConns(ln net.Listener) net.Listener {
	lim := connlimit.New(cmp.Or(s.opts.MaxConns, connlimit.DefaultMax), cmp.Or(s.opts.MaxConnsPerHost, connlimit.DefaultPerHost))
	s.connLim.Store(lim)
	s.admitPeers()
	return connlimit.NewListener(ln, lim, s.log, "meta")
}

// admitPeers lets the storage nodes' hosts past the total bound (the
// sweeper keeps it current), so strangers filling every slot cannot stop
// nodes' heartbeats.
func (s *Service) admitPeers() {
	lim := s.connLim.Load()
	if lim == nil {
		return
	}
	s.mu.RLock()
	addrs := make([]string, 0, len(s.nodes))
	for _, a := range s.addrsLocked() {
		addrs = append(addrs, a)
	}
	s.mu.RUnlock()
	lim.SetPeers(addrs)
}

// AdvertiseAddr turns a listen address into one clients can dial: an
// unspecified host (":7000", "0.0.0.0:7000", "[::]:7000") becomes
// loopback.
func AdvertiseAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
