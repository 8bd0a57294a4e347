package fabric

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// setPeerTimeout has the kernel fail a TCP connection whose sent data
// (or keepalive probes) the peer leaves unacknowledged for d
// (TCP_USER_TIMEOUT): a peer whose host is cut off sends no reset, and
// without it a request to it waits out the kernel's retransmissions
// (about 15 minutes) or the caller's own timeout, while another replica
// could answer. A peer that reads slowly still acknowledges and reopens
// its window; one that stops reading altogether (a zero window) is cut
// after d too, as Linux 5.11 and later apply the timeout to zero-window
// probes: a peer stalled that long is treated as gone, sooner than
// WriteTimeout would. Connections that are not TCP are left alone.
func setPeerTimeout(nc net.Conn, d time.Duration) {
	tc, ok := nc.(*net.TCPConn)
	if !ok || d <= 0 {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond))
	})
}
