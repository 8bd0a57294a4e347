package fabric

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// memNet is an in-process transport for tests, in the shape of a
// shared-memory backend: packets move over a unix socket pair (not TCP),
// and one-sided operations are copies by the initiator straight into the
// target endpoint's regions, checked by its region table — the target's
// reader never sees a READ or WRITE packet. The fabric tests run over it
// and over TCP (backends): what the layers above see must not depend on
// which.
type memNet struct {
	mu   sync.Mutex
	lns  map[string]*memListener
	next int
	// direct counts one-sided operations done by copying.
	direct atomic.Int64
}

func newMemNet() *memNet { return &memNet{lns: map[string]*memListener{}} }

// backends runs f over each transport: TCP (nil) and memNet.
func backends(t *testing.T, f func(t *testing.T, tr transport)) {
	t.Run("tcp", func(t *testing.T) { f(t, nil) })
	t.Run("mem", func(t *testing.T) { f(t, newMemNet()) })
}

type memAddr string

func (a memAddr) Network() string { return "mem" }
func (a memAddr) String() string  { return string(a) }

func (n *memNet) listen(string) (listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	l := &memListener{net: n, name: fmt.Sprintf("mem-%d", n.next), ch: make(chan stream, 64), done: make(chan struct{})}
	n.lns[l.name] = l
	return l, nil
}

func (n *memNet) dial(ctx context.Context, addr string) (stream, error) {
	n.mu.Lock()
	l := n.lns[addr]
	n.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("dialing %s: no such listener", addr)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var ends [2]*memStream
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "mem")
		nc, err := net.FileConn(f) // dups fd
		f.Close()
		if err != nil {
			if i == 1 {
				ends[0].Close()
			}
			return nil, err
		}
		ends[i] = &memStream{netStream: newNetStream(nc), net: n, bound: make(chan struct{}), closed: make(chan struct{})}
	}
	fence := new(atomic.Int64)
	ends[0].peer, ends[1].peer = ends[1], ends[0]
	ends[0].fence, ends[1].fence = fence, fence
	select {
	case l.ch <- ends[1]:
		return ends[0], nil
	case <-l.done:
	case <-ctx.Done():
	}
	ends[0].Close()
	ends[1].Close()
	return nil, fmt.Errorf("dialing %s: refused", addr)
}

type memListener struct {
	net  *memNet
	name string
	ch   chan stream
	once sync.Once
	done chan struct{}
}

func (l *memListener) accept() (stream, error) {
	select {
	case s := <-l.ch:
		return s, nil
	case <-l.done:
		return nil, fmt.Errorf("accept on %s: %w", l.name, net.ErrClosed)
	}
}

func (l *memListener) addr() net.Addr { return memAddr(l.name) }

func (l *memListener) close() error {
	l.once.Do(func() {
		l.net.mu.Lock()
		delete(l.net.lns, l.name)
		l.net.mu.Unlock()
		close(l.done)
	})
	return nil
}

// memStream is one end of a memNet connection.
type memStream struct {
	*netStream
	net   *memNet
	peer  *memStream
	conn  *Conn         // set by bind
	bound chan struct{} // closed by bind
	// fence orders a copy into the peer's memory before the packets sent
	// after it, for the race detector (a socket is no synchronisation to
	// it), as a shared-memory ring's release and acquire would.
	fence     *atomic.Int64
	closeOnce sync.Once
	closed    chan struct{}
}

func (s *memStream) bind(c *Conn) { s.conn = c; close(s.bound) }

func (s *memStream) Read(b []byte) (int, error) {
	n, err := s.netStream.Read(b)
	s.fence.Load()
	return n, err
}

func (s *memStream) writev(iov [][]byte) error {
	s.fence.Add(1)
	return s.netStream.writev(iov)
}

func (s *memStream) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	return s.netStream.Close()
}

// target is the peer's Conn, once its hello is done.
func (s *memStream) target(ctx context.Context) (*Conn, error) {
	select {
	case <-s.peer.bound:
		return s.peer.conn, nil
	case <-s.peer.closed:
	case <-s.closed:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, ErrClosed
}

// copyRegion performs a one-sided operation on the target's memory,
// under its region table's checks and revocation.
func (s *memStream) copyRegion(ctx context.Context, key, off uint64, b []byte, perm Perm) error {
	t, err := s.target(ctx)
	if err != nil {
		return err
	}
	r, mem, err := t.ep.regions.access(t, key, off, uint64(len(b)), perm)
	if err != nil {
		return err
	}
	if perm == RemoteRead {
		copy(b, mem)
	} else {
		copy(mem, b)
	}
	r.unuse()
	s.net.direct.Add(1)
	s.fence.Add(1)
	return nil
}

func (s *memStream) readRegion(ctx context.Context, key, off uint64, dst []byte) error {
	return s.copyRegion(ctx, key, off, dst, RemoteRead)
}

func (s *memStream) writeRegion(ctx context.Context, key, off uint64, src []byte) error {
	return s.copyRegion(ctx, key, off, src, RemoteWrite)
}

// connOf is a Handler that hands over the Conn its first packet came on.
type connOf chan *Conn

func (h connOf) HandlePacket(p *Packet) {
	select {
	case h <- p.Conn:
	default:
	}
	p.Release()
}
func (h connOf) Closed(*Conn, error) {}

// TestRegisterForBindsConnection: a region registered for one connection
// is refused to another connection of the same peer, on either backend
// (the shared-memory one checks the binding without the target's reader).
func TestRegisterForBindsConnection(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		ctx := context.Background()
		h := make(connOf, 1)
		srv, cli, pc := pair(t, Options{transport: tr}, h)
		if err := pc.Send(pc.NewID(), []byte("hi")); err != nil {
			t.Fatal(err)
		}
		sc := <-h
		mem := []byte("bound to one connection")
		r := srv.RegisterFor(sc, mem, RemoteRead)
		got := make([]byte, len(mem))
		if err := pc.Read(ctx, r.Key(), 0, got); err != nil || string(got) != string(mem) {
			t.Fatalf("read on the bound connection: %q, %v", got, err)
		}
		other, err := NewPool(cli, 1).Get(ctx, pc.Addr())
		if err != nil {
			t.Fatal(err)
		}
		var ae *AccessError
		if err := other.Read(ctx, r.Key(), 0, got); !errors.As(err, &ae) {
			t.Fatalf("read on another connection: %v, want an access error", err)
		}
		if n, ok := tr.(*memNet); ok && n.direct.Load() == 0 {
			t.Fatal("the memory transport sent the one-sided operations as packets")
		}
	})
}
