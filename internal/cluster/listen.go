package cluster

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DefaultNodeListen is where the nodes of `sluice up` and `sluice bench`
// listen unless told otherwise: loopback, ports the system picks.
const DefaultNodeListen = "127.0.0.1"

// NodeListenAddr is the listen address of the i-th node (from 1) of a
// cluster whose nodes listen at spec: a host alone (every node on a port
// the system picks) or HOST:PORT (node i on PORT+i-1, for firewalls that
// open a known range; port 0 is the system's pick again).
func NodeListenAddr(spec string, i int) (string, error) {
	if spec == "" {
		spec = DefaultNodeListen
	}
	host, port, err := net.SplitHostPort(spec)
	if err != nil {
		// A host alone; an IPv6 address may come bracketed or not.
		host, port = strings.TrimSuffix(strings.TrimPrefix(spec, "["), "]"), "0"
	}
	if host == "" || strings.ContainsAny(host, "/ []") {
		return "", fmt.Errorf("node listen address %q: want HOST or HOST:PORT", spec)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return "", fmt.Errorf("node listen address %q: bad port %q", spec, port)
	}
	if p != 0 {
		if p += i - 1; p > 65535 {
			return "", fmt.Errorf("node listen address %q: node %d would need port %d", spec, i, p)
		}
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), nil
}
