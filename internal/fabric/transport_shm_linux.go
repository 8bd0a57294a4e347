package fabric

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The shared-memory backend, for peers on one host. An endpoint listens
// on TCP as always and also on an abstract unix socket named after its
// TCP address (shmName): abstract names live in the network namespace,
// so only peers in the same one reach it. A dial to an address of this
// host connects there; the framed packets then move on the unix socket
// (writev, as on TCP), and one-sided operations on regions in shared
// memory (Alloc) are copies by the initiator (shm_direct_linux.go).
//
// Each link has two control sockets beside it (socket pairs the dialer
// makes and passes in its preamble), one per direction, on which a side
// asks the other for a region's memory and receives it by SCM_RIGHTS;
// keeping them off the packet stream leaves its reader (a bufio.Reader
// on plain reads, which would drop descriptors) as it is.

// shmTransport dials over shared memory when the mode and the peer allow
// it, else over TCP.
type shmTransport struct {
	tcp  tcpTransport
	mode Fabric
}

func (t shmTransport) withOptions(o *Options) transport {
	return shmTransport{tcp: tcpTransport{opts: o}, mode: t.mode}
}

// shmName is the abstract socket of a TCP listener's address: its IP, or
// "*" for a wildcard one.
func shmName(ip net.IP, port int) string {
	host := "*"
	if ip != nil && !ip.IsUnspecified() {
		host = ip.String()
	}
	return "@sluice-fabric:" + net.JoinHostPort(host, strconv.Itoa(port))
}

var preambleMagic = [8]byte{'S', 'L', 'F', 'S', 'H', 'M', 1, 0}

func (t shmTransport) listen(addr string) (listener, error) {
	tl, err := t.tcp.listen(addr)
	if err != nil || t.mode == FabricTCP || t.tcp.opts.ServerTLS != nil {
		// With TLS the peer's certificate is what admits it: a unix
		// socket beside would let a local peer in without one.
		return tl, err
	}
	ta := tl.addr().(*net.TCPAddr)
	ux, err := net.ListenUnix("unix", &net.UnixAddr{Name: shmName(ta.IP, ta.Port), Net: "unix"})
	if err != nil {
		tl.close()
		return nil, fmt.Errorf("shared-memory socket beside %s: %w", ta, err)
	}
	l := &shmListener{tcp: tl, ux: ux, t: t, ch: make(chan acceptResult), done: make(chan struct{}),
		sem: make(chan struct{}, 64)}
	go l.acceptTCP()
	go l.acceptUnix()
	return l, nil
}

type acceptResult struct {
	l   link
	err error
}

type shmListener struct {
	tcp  listener
	ux   *net.UnixListener
	t    shmTransport
	ch   chan acceptResult
	once sync.Once
	done chan struct{}
	sem  chan struct{} // unix connections in their preamble
}

func (l *shmListener) accept() (link, error) {
	select {
	case r := <-l.ch:
		return r.l, r.err
	case <-l.done:
		return link{}, fmt.Errorf("accept: %w", net.ErrClosed)
	}
}

func (l *shmListener) addr() net.Addr { return l.tcp.addr() }

func (l *shmListener) close() error {
	l.once.Do(func() { close(l.done) })
	l.ux.Close()
	return l.tcp.close()
}

// deliver hands r to accept, or closes its link if the listener closed.
func (l *shmListener) deliver(r acceptResult) bool {
	select {
	case l.ch <- r:
		return true
	case <-l.done:
		if r.l.Conn != nil {
			r.l.close()
		}
		return false
	}
}

// retry reports whether to go on after accept error err, after a pause:
// transient errors (descriptors exhausted) are passed to the endpoint's
// loop, which logs them.
func (l *shmListener) retry(err error, backoff *time.Duration) bool {
	if errors.Is(err, net.ErrClosed) || !l.deliver(acceptResult{err: err}) {
		return false
	}
	*backoff = min(max(2**backoff, 5*time.Millisecond), time.Second)
	select {
	case <-time.After(*backoff):
		return true
	case <-l.done:
		return false
	}
}

func (l *shmListener) acceptTCP() {
	var backoff time.Duration
	for {
		tl, err := l.tcp.accept()
		if err != nil {
			if l.retry(err, &backoff) {
				continue
			}
			return
		}
		backoff = 0
		if l.t.mode == FabricShm {
			if ta, ok := tl.RemoteAddr().(*net.TCPAddr); !ok || !isLocalIP(ta.IP) {
				l.t.tcp.opts.Logger.Debug("fabric: refusing a peer not on this host (fabric shm)", "peer", tl.RemoteAddr())
				tl.Close()
				continue
			}
		}
		if !l.deliver(acceptResult{l: tl}) {
			return
		}
	}
}

func (l *shmListener) acceptUnix() {
	var backoff time.Duration
	for {
		uc, err := l.ux.AcceptUnix()
		if err != nil {
			if l.retry(err, &backoff) {
				continue
			}
			return
		}
		backoff = 0
		select {
		case l.sem <- struct{}{}:
			go func() {
				defer func() { <-l.sem }()
				s, err := readPreamble(uc, l.t.tcp.opts)
				if err != nil {
					l.t.tcp.opts.Logger.Debug("fabric: shared-memory preamble failed", "err", err)
					uc.Close()
					return
				}
				l.deliver(acceptResult{l: link{Conn: uc, direct: s, remote: peerAddr(uc)}})
			}()
		default:
			uc.Close() // too many half-open: as a full accept queue
		}
	}
}

// shmAddr names a shared-memory peer: the address it was dialed at, or
// its process.
type shmAddr string

func (a shmAddr) Network() string { return "unix" }
func (a shmAddr) String() string  { return string(a) }

// shmPeer names the process at the other end of an accepted shared-memory
// link, as the kernel reports it (SO_PEERCRED).
type shmPeer struct{ pid int32 }

func (a shmPeer) Network() string { return "unix" }
func (a shmPeer) String() string  { return fmt.Sprintf("shm:pid=%d", a.pid) }

// peerAddr names the process at the other end of uc (SO_PEERCRED).
func peerAddr(uc *net.UnixConn) net.Addr {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	rc.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cred == nil {
		return nil
	}
	return shmPeer{cred.Pid}
}

// readPreamble reads a dialer's preamble: the magic and its two control
// sockets (ours to serve its requests, ours to make requests).
func readPreamble(uc *net.UnixConn, o *Options) (*shmEnd, error) {
	uc.SetReadDeadline(time.Now().Add(o.HandshakeTimeout))
	defer uc.SetReadDeadline(time.Time{})
	var b [len(preambleMagic)]byte
	fds, err := recvWithFds(uc, b[:], 2)
	if err != nil {
		return nil, fmt.Errorf("reading preamble: %w", err)
	}
	if b != preambleMagic || len(fds) != 2 {
		closeFds(fds)
		return nil, fmt.Errorf("%w: bad shared-memory preamble (%d descriptors)", ErrProtocol, len(fds))
	}
	srv, err := fdConn(fds[0])
	if err != nil {
		closeFds(fds[1:])
		return nil, err
	}
	req, err := fdConn(fds[1])
	if err != nil {
		srv.Close()
		return nil, err
	}
	return newShmEnd(o, req, srv), nil
}

// fdConn makes a stream unix socket descriptor a *net.UnixConn, taking
// ownership of fd.
func fdConn(fd int) (*net.UnixConn, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	dom, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil || err2 != nil || typ != unix.SOCK_STREAM || dom != unix.AF_UNIX {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: control descriptor is not a unix stream socket", ErrProtocol)
	}
	f := os.NewFile(uintptr(fd), "sluice-shm-control")
	nc, err := net.FileConn(f) // dups
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	return nc.(*net.UnixConn), nil
}

// useShm decides a dial: the abstract socket names to try (nil: TCP).
func (t shmTransport) useShm(ctx context.Context, addr string) ([]string, error) {
	o := t.tcp.opts
	if t.mode == FabricTCP || o.Dial != nil || o.DialTLS != nil {
		return nil, nil
	}
	host, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, fmt.Errorf("port of %s: %w", addr, err)
	}
	ips := []net.IP{net.ParseIP(host)}
	if ips[0] == nil {
		ias, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			return nil, err
		}
		ips = ips[:0]
		for _, ia := range ias {
			ips = append(ips, ia.IP)
		}
	}
	for _, ip := range ips {
		if isLocalIP(ip) {
			return []string{shmName(ip, port), shmName(nil, port)}, nil
		}
	}
	if t.mode == FabricShm {
		return nil, fmt.Errorf("%s is not on this host, and the fabric is shm only", addr)
	}
	return nil, nil
}

// isLocalIP reports whether ip is one of this host's (network
// namespace's) addresses.
func isLocalIP(ip net.IP) bool {
	if ip.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}

func (t shmTransport) dial(ctx context.Context, addr string) (link, error) {
	names, err := t.useShm(ctx, addr)
	if err != nil {
		return link{}, fmt.Errorf("dialing %s: %w", addr, err)
	}
	for _, name := range names {
		d := net.Dialer{Timeout: t.tcp.opts.HandshakeTimeout}
		nc, err := d.DialContext(ctx, "unix", name)
		if err != nil {
			continue // no such listener: the next name, then TCP
		}
		l, err := t.preamble(nc.(*net.UnixConn))
		if err != nil {
			return link{}, fmt.Errorf("dialing %s over shared memory: %w", addr, err)
		}
		l.remote = shmAddr(addr)
		return l, nil
	}
	if len(names) > 0 && t.mode == FabricShm {
		return link{}, fmt.Errorf("dialing %s: no shared-memory listener there, and the fabric is shm only", addr)
	}
	return t.tcp.dial(ctx, addr)
}

// preamble sends the listener the control sockets of a new link.
func (t shmTransport) preamble(uc *net.UnixConn) (link, error) {
	var mine, theirs [2]int
	for i := range mine {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			closeFds(mine[:i])
			closeFds(theirs[:i])
			uc.Close()
			return link{}, fmt.Errorf("control socket: %w", err)
		}
		mine[i], theirs[i] = p[0], p[1]
	}
	// theirs[0] serves our requests (mine[0]); theirs[1] makes the
	// listener's, which mine[1] serves.
	_, _, err := uc.WriteMsgUnix(preambleMagic[:], unix.UnixRights(theirs[:]...), nil)
	closeFds(theirs[:])
	if err != nil {
		closeFds(mine[:])
		uc.Close()
		return link{}, fmt.Errorf("sending preamble: %w", err)
	}
	req, err := fdConn(mine[0])
	if err != nil {
		unix.Close(mine[1])
		uc.Close()
		return link{}, err
	}
	srv, err := fdConn(mine[1])
	if err != nil {
		req.Close()
		uc.Close()
		return link{}, err
	}
	return link{Conn: uc, direct: newShmEnd(t.tcp.opts, req, srv)}, nil
}

// explainHello adds a hint to a failed hello (tls.go).
func (t shmTransport) explainHello(err error) error { return t.tcp.explainHello(err) }
