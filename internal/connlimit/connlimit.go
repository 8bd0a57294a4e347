// Package connlimit bounds the connections a server holds, in all and per
// remote host, so that one host (a flood of idle or garbage connections
// from one address) cannot take every slot and starve the others. It is
// the one admission counter of the storage node's fabric, meta's HTTP
// server and the NFS gateway: they ask Admit as they accept, before any
// byte is read (a connection still in its handshake holds a slot), and
// release the slot when the connection ends.
package connlimit

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/lograte"
)

// Defaults of the storage node's fabric and of meta: one host may take a
// quarter of the slots, which leaves room for a busy legitimate one (a
// node forwarding its request table's worth of writes to a peer, a
// gateway host) while a flood from one host leaves the rest to others.
const (
	DefaultMax     = 4096
	DefaultPerHost = 1024
)

// Limiter counts admitted connections. The zero value is not usable; use
// New.
type Limiter struct {
	max, perHost int

	mu    sync.Mutex
	total int
	hosts map[netip.Prefix]int
	peers map[netip.Prefix]bool // see SetPeers
	// Refusals are reported at most once a second (a flood would
	// otherwise flood the log too).
	report lograte.Limiter
}

// New returns a limiter admitting at most max connections in all and at
// most perHost from one host; a bound <= 0 is no bound.
func New(max, perHost int) *Limiter {
	return &Limiter{max: max, perHost: perHost, hosts: make(map[netip.Prefix]int)}
}

// Host is the key connections are counted under: an IPv4 address, or the
// /64 an IPv6 address is in (one host or site usually holds a whole /64,
// and could otherwise take a slot per address). Addresses that are not IP
// (a Unix socket) share one key.
func Host(addr net.Addr) netip.Prefix {
	var ip netip.Addr
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap()
	switch {
	case ip.Is4():
		return netip.PrefixFrom(ip, 32)
	case ip.Is6():
		p, _ := ip.Prefix(64)
		return p
	}
	return netip.Prefix{}
}

// Refused is why a connection was not admitted.
type Refused struct {
	Host    netip.Prefix
	PerHost bool // the host's bound, not the total
	Limit   int
	// Report is set on at most one refusal a second: log that one (with
	// Suppressed, the refusals since the last report) and not the others.
	Report     bool
	Suppressed int
}

func (r *Refused) Error() string {
	if r.PerHost {
		return fmt.Sprintf("too many connections from %s (at most %d from one host)", r.Host, r.Limit)
	}
	return fmt.Sprintf("too many connections (at most %d)", r.Limit)
}

// Admit takes a slot for a connection from remote, or refuses it. The
// returned release frees the slot; it may be called more than once.
func (l *Limiter) Admit(remote net.Addr) (release func(), err error) {
	h := Host(remote)
	l.mu.Lock()
	defer l.mu.Unlock()
	var r *Refused
	switch {
	case l.max > 0 && l.total >= l.max && !l.peers[h]:
		r = &Refused{Host: h, Limit: l.max}
	case l.perHost > 0 && l.hosts[h] >= l.perHost:
		r = &Refused{Host: h, PerHost: true, Limit: l.perHost}
	}
	if r != nil {
		r.Report, r.Suppressed = l.report.Allow(time.Now())
		return nil, r
	}
	l.total++
	l.hosts[h]++
	var once sync.Once
	return func() { once.Do(func() { l.release(h) }) }, nil
}

// SetPeers names the hosts of the cluster's own members (storage nodes,
// from addresses "ip:port"): their connections are admitted past the
// total bound — only their own host's bound applies — so strangers from
// many hosts filling every slot cannot cut the cluster's replica traffic
// or nodes' heartbeats. (Telling a peer by its address is as good as the
// network's routing: the connection itself is authenticated later.)
func (l *Limiter) SetPeers(addrs []string) {
	peers := make(map[netip.Prefix]bool, len(addrs))
	for _, a := range addrs {
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			continue // a host name: not a peer by address
		}
		peers[Host(net.TCPAddrFromAddrPort(ap))] = true
	}
	l.mu.Lock()
	l.peers = peers
	l.mu.Unlock()
}

func (l *Limiter) release(h netip.Prefix) {
	l.mu.Lock()
	l.total--
	if l.hosts[h]--; l.hosts[h] <= 0 {
		delete(l.hosts, h)
	}
	l.mu.Unlock()
}

// Counts reports the connections admitted and not yet released, in all
// and from host h.
func (l *Limiter) Counts(h netip.Prefix) (total, host int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.hosts[h]
}
