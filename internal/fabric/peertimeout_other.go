//go:build !linux

package fabric

import (
	"net"
	"time"
)

// setPeerTimeout: only Linux has TCP_USER_TIMEOUT; elsewhere a cut-off
// peer is noticed by the callers' own timeouts.
func setPeerTimeout(net.Conn, time.Duration) {}
