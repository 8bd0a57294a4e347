package fabric

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// blockingHandler blocks in HandlePacket until released, and records when
// Closed runs.
type blockingHandler struct {
	entered chan *Conn
	release chan struct{}
	closed  chan struct{}
}

func (h *blockingHandler) HandlePacket(p *Packet) {
	h.entered <- p.Conn
	<-h.release
	p.Release()
}

func (h *blockingHandler) Closed(*Conn, error) { close(h.closed) }

// TestEndpointCloseWaitsForEveryReader: Endpoint.Close must not return
// while a reader goroutine of one of its connections can still call the
// Handler. A connection that was failed before Close (idle sweeper, stall
// watchdog, CloseWithError, peer EOF...) is already gone from e.conns, so
// Close neither closes nor waits for it; its reader later runs
// HandlePacket/Closed after Close returned. The node closes the engine
// right after ep.Close, so that late Closed sends on a closed worker
// channel: "send on closed channel" panic (seen as a flaky race in
// TestStaleReplicaRefusesAndHeadAborts).
func TestEndpointCloseWaitsForEveryReader(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		h := &blockingHandler{entered: make(chan *Conn, 1), release: make(chan struct{}), closed: make(chan struct{})}
		srv, err := NewEndpoint(Options{transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		addr, err := srv.Listen("127.0.0.1:0", h)
		if err != nil {
			t.Fatal(err)
		}
		cli, _ := NewEndpoint(Options{transport: tr})
		defer cli.Close()
		pc, err := NewPool(cli, 1).Get(context.Background(), addr.String())
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.Send(pc.NewID(), []byte("hello")); err != nil {
			t.Fatal(err)
		}
		sc := <-h.entered                              // the server's reader is inside HandlePacket
		sc.CloseWithError(errors.New("idle too long")) // e.g. the engine's idle sweeper

		closeDone := make(chan struct{})
		go func() { srv.Close(); close(closeDone) }()
		select {
		case <-closeDone:
			// Close returned while the reader is still inside the handler and
			// Closed has not run yet: the handler's owner may now tear down
			// what the late callbacks use.
			select {
			case <-h.closed:
			default:
				close(h.release)
				<-h.closed
				t.Fatal("Endpoint.Close returned while a reader goroutine was still in HandlePacket; Closed ran after Close")
			}
		case <-time.After(2 * time.Second):
			// Close is waiting for the reader, as it should.
			close(h.release)
			<-closeDone
		}
	})
}

// TestAcceptLoopSurvivesEMFILE: running out of file descriptors for a
// moment (a burst of connections, many handshakes in flight — they are not
// counted against MaxConns) must not stop the endpoint from accepting
// forever. acceptLoop returns on any non-timeout Accept error, EMFILE
// included.
func TestAcceptLoopSurvivesEMFILE(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Skip(err)
	}
	srv, err := NewEndpoint(Options{HandshakeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0", discard{})
	if err != nil {
		t.Fatal(err)
	}
	// Use up every descriptor but one, then connect: the client's socket
	// takes the last one and the server's Accept fails with EMFILE.
	low := lim
	low.Cur = uint64(countFDs(t) + 16)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Skip(err)
	}
	var fill []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		fill = append(fill, f)
	}
	fill[len(fill)-1].Close()
	fill = fill[:len(fill)-1]
	raw, derr := net.DialTimeout("tcp", addr.String(), 200*time.Millisecond)
	time.Sleep(300 * time.Millisecond) // the server's Accept runs out of descriptors
	if derr == nil {
		raw.Close()
	}
	for _, f := range fill {
		f.Close()
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond) // pending handshakes time out
	cli, _ := NewEndpoint(Options{HandshakeTimeout: 2 * time.Second})
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := cli.Dial(ctx, addr.String(), discard{})
	if err != nil {
		t.Fatalf("endpoint stopped accepting after a transient EMFILE: %v", err)
	}
	c.Close()
}

func countFDs(t *testing.T) int {
	n := 0
	for fd := 0; fd < 65536; fd++ {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			n = fd + 1
		}
	}
	return n
}

// TestMaxConnsPerHost: inbound connections from one IP beyond the bound
// are refused, another IP is still served, and a closed connection frees
// its host's slot.
func TestMaxConnsPerHost(t *testing.T) {
	srv, err := NewEndpoint(Options{MaxConnsPerHost: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0", newCollector())
	if err != nil {
		t.Fatal(err)
	}
	cli, _ := NewEndpoint(Options{HandshakeTimeout: 2 * time.Second})
	defer cli.Close()
	from := func(ip net.IP) (*Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
		nc, err := d.Dial("tcp", addr.String())
		if err != nil {
			t.Skipf("cannot dial from %s: %v", ip, err)
		}
		c, err := cli.handshake(tcpLink(nc), newCollector(), nil)
		if err != nil {
			return nil, err
		}
		// A refused connection may pass the hello before the server
		// closes it: check it stays up.
		select {
		case <-c.Done():
			return nil, c.Err()
		case <-time.After(100 * time.Millisecond):
			return c, nil
		}
	}
	lo := net.IPv4(127, 0, 0, 1)
	a, err := from(lo)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := from(lo); err != nil {
		t.Fatal(err)
	}
	if _, err := from(lo); err == nil {
		t.Fatal("a third connection from one host was accepted with MaxConnsPerHost 2")
	}
	if _, err := from(net.IPv4(127, 0, 0, 2)); err != nil {
		t.Fatalf("another host refused: %v", err)
	}
	a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := from(lo); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no slot freed by closing a connection")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDeregisterWaitsForUse: Deregister revokes the key at once but
// returns only when an operation already using the memory is done;
// Release calls back then.
func TestDeregisterWaitsForUse(t *testing.T) {
	ep, err := NewEndpoint(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	for _, wait := range []bool{true, false} {
		r := ep.Register(make([]byte, 64), RemoteRead)
		got, _, err := ep.regions.access(nil, r.Key(), 0, 64, RemoteRead)
		if err != nil || got != r {
			t.Fatal("access", err)
		}
		done := make(chan struct{})
		if wait {
			go func() { ep.Deregister(r); close(done) }()
		} else {
			ep.Release(r, func() { close(done) })
		}
		time.Sleep(50 * time.Millisecond)
		if _, _, err := ep.regions.access(nil, r.Key(), 0, 64, RemoteRead); !errors.Is(err, ErrNoRegion) {
			t.Fatalf("the key still works after revoking: %v", err)
		}
		select {
		case <-done:
			t.Fatal("the memory was given back while in use")
		default:
		}
		r.unuse()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("not given back once unused")
		}
	}
	// Unused: at once.
	r := ep.Register(make([]byte, 8), RemoteRead)
	ep.Deregister(r)
	called := false
	r2 := ep.Register(make([]byte, 8), RemoteRead)
	ep.Release(r2, func() { called = true })
	if !called {
		t.Fatal("Release of an unused region did not call back at once")
	}
}

// TestDialSilentPeerTimesOut: a peer that answers no SYN (here: a
// listener whose accept queue is full; a host cut off from the network
// behaves alike) fails a Dial within HandshakeTimeout rather than after
// the kernel's minutes of SYN retries.
func TestDialSilentPeerTimesOut(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // never accepted from
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	// Fill the accept queue: later SYNs are dropped.
	for range 4 {
		d := net.Dialer{Timeout: 200 * time.Millisecond}
		if c, err := d.Dial("tcp", addr); err == nil {
			defer c.Close()
		}
	}
	ep, err := NewEndpoint(Options{HandshakeTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	start := time.Now()
	c, err := ep.Dial(ctx, addr, discard{})
	if err == nil {
		c.Close()
		t.Fatal("dial of a silent peer succeeded")
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("dial of a silent peer failed after %s (%v), want within about HandshakeTimeout", took, err)
	}
}

// TestPeerTimeoutSet: connections an endpoint dials and accepts carry
// the peer timeout (TCP_USER_TIMEOUT), so a peer cut off from the network
// fails them in seconds. (Cutting a peer off takes a network namespace:
// cmd/sluice's TestDeployOnHosts does.)
func TestPeerTimeoutSet(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("TCP_USER_TIMEOUT is Linux's")
	}
	srv, err := NewEndpoint(Options{PeerTimeout: 7 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0", discard{})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewEndpoint(Options{PeerTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	c, err := cli.Dial(context.Background(), addr.String(), discard{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := userTimeout(t, c); got != 3000 {
		t.Errorf("dialed connection: TCP_USER_TIMEOUT %d ms, want 3000", got)
	}
	// The server side may register the connection a moment after the
	// dialler's hello exchange is done.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		srv.mu.Lock()
		n := len(srv.conns)
		srv.mu.Unlock()
		if n > 0 {
			break
		}
	}
	srv.mu.Lock()
	for sc := range srv.conns {
		if got := userTimeout(t, sc); got != 7000 {
			t.Errorf("accepted connection: TCP_USER_TIMEOUT %d ms, want 7000", got)
		}
	}
	if len(srv.conns) != 1 {
		t.Errorf("%d accepted connections, want 1", len(srv.conns))
	}
	srv.mu.Unlock()
}

func userTimeout(t *testing.T, c *Conn) int {
	t.Helper()
	raw, err := c.nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT) })
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}
