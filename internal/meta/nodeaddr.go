package meta

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// Node addresses: a node listening on every interface (0.0.0.0:PORT,
// [::]:PORT) without --advertise says so when it registers, and meta
// records the address its call came from with the node's port: the one
// meta, at least, reaches it at. An address meta records is then dialled
// once (ProbeNodeAddr), so a node no one can reach is refused with the
// address named rather than taken into layouts every write would fail on.

// DefaultProbeTimeout bounds the dial of a registering node's address.
const DefaultProbeTimeout = 3 * time.Second

// reachableAddr is the address meta records for a node that says it is at
// addr and whose call came from remote (an http.Request's RemoteAddr):
// addr itself, unless its host is unspecified (or missing), then
// remote's host with addr's port.
func reachableAddr(addr, remote string) (string, error) {
	if err := validNodeAddr(addr); err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(addr)
	if ip, err := netip.ParseAddr(host); host != "" && (err != nil || !ip.IsUnspecified()) {
		return addr, nil // a name, or a specific address
	}
	rhost, _, err := net.SplitHostPort(remote)
	if err != nil || rhost == "" {
		return "", metaapi.Errorf(metaapi.EINVAL, "node address %s names no host and the call's source %q is unknown: start the node with --advertise", addr, remote)
	}
	if ip, err := netip.ParseAddr(rhost); err == nil {
		if ip.IsUnspecified() {
			return "", metaapi.Errorf(metaapi.EINVAL, "node address %s names no host and the call came from %s: start the node with --advertise", addr, rhost)
		}
		rhost = ip.Unmap().String() // an IPv4 node seen through a dual-stack listener
	}
	return net.JoinHostPort(rhost, port), nil
}

// DialProbe returns a ProbeNodeAddr that opens a TCP connection to the
// address (within timeout) and closes it again.
func DialProbe(timeout time.Duration) func(addr string) error {
	return func(addr string) error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// probeNodeAddr checks that meta reaches a registering node at addr, if
// the Service was told how (Options.ProbeNodeAddr).
func (s *Service) probeNodeAddr(addr string) error {
	if s.opts.ProbeNodeAddr == nil {
		return nil
	}
	if err := s.opts.ProbeNodeAddr(addr); err != nil {
		return metaapi.Errorf(metaapi.EINVAL, "meta cannot reach this node at %s (%v): give the node --advertise HOST:PORT that meta and clients reach it at, or open the port in the firewall", addr, err)
	}
	return nil
}

// registerFrom is Register for a node whose call came from remote.
func (s *Service) registerFrom(req metaapi.RegisterReq, remote string) (metaapi.RegisterResp, error) {
	addr, err := reachableAddr(req.Addr, remote)
	if err != nil {
		return metaapi.RegisterResp{}, err
	}
	if addr != req.Addr {
		s.log.Debug("node listens on every interface: registering the address its call came from", "said", req.Addr, "addr", addr)
	}
	if err := s.probeNodeAddr(addr); err != nil {
		s.log.Warn("storage node refused: unreachable", "node", req.ID, "addr", addr, "err", fmt.Sprint(err))
		return metaapi.RegisterResp{}, err
	}
	req.Addr = addr
	return s.Register(req)
}

// heartbeatFrom is Heartbeat for a node whose call came from remote. A
// new address is probed like a registering node's; one meta cannot
// reach (a node on every interface calling from another one, or through
// NAT) is not taken: the node keeps the address it has, and stays up.
func (s *Service) heartbeatFrom(req metaapi.HeartbeatReq, remote string) (metaapi.HeartbeatResp, error) {
	if req.Addr != "" {
		addr, err := reachableAddr(req.Addr, remote)
		if err != nil {
			return metaapi.HeartbeatResp{}, err
		}
		req.Addr = addr
		s.mu.RLock()
		m := s.nodes[req.ID]
		moved := m != nil && m.rec.Addr != addr
		s.mu.RUnlock()
		if moved {
			if err := s.probeNodeAddr(addr); err != nil {
				s.log.Warn("storage node's heartbeat names an address meta cannot reach: kept at its address", "node", req.ID, "addr", addr, "err", fmt.Sprint(err))
				req.Addr = ""
			}
		}
	}
	return s.Heartbeat(req)
}
