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
	// unshared holds the keys of regions whose memory the transport is
	// to treat as not shared: their operations go as packets.
	unshared sync.Map
}

func newMemNet() *memNet { return &memNet{lns: map[string]*memListener{}} }

// backends runs f over each transport: TCP (nil), memNet, and shared
// memory (shm only: every test endpoint is on this host).
func backends(t *testing.T, f func(t *testing.T, tr transport)) {
	t.Run("tcp", func(t *testing.T) { f(t, nil) })
	t.Run("mem", func(t *testing.T) { f(t, newMemNet()) })
	t.Run("shm", func(t *testing.T) { f(t, shmTransport{mode: FabricShm}) })
}

type memAddr string

func (a memAddr) Network() string { return "mem" }
func (a memAddr) String() string  { return string(a) }

func (n *memNet) listen(string) (listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.next++
	l := &memListener{net: n, name: fmt.Sprintf("mem-%d", n.next), ch: make(chan link, 64), done: make(chan struct{})}
	n.lns[l.name] = l
	return l, nil
}

func (n *memNet) dial(ctx context.Context, addr string) (link, error) {
	n.mu.Lock()
	l := n.lns[addr]
	n.mu.Unlock()
	if l == nil {
		return link{}, fmt.Errorf("dialing %s: no such listener", addr)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return link{}, err
	}
	var ends [2]*memEnd
	fence := new(atomic.Int64)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "mem")
		nc, err := net.FileConn(f) // dups fd
		f.Close()
		if err != nil {
			if i == 1 {
				ends[0].Close()
			}
			return link{}, err
		}
		ends[i] = &memEnd{Conn: nc, net: n, fence: fence, bound: make(chan struct{}), closed: make(chan struct{})}
	}
	ends[0].peer, ends[1].peer = ends[1], ends[0]
	select {
	case l.ch <- ends[1].link():
		return ends[0].link(), nil
	case <-l.done:
	case <-ctx.Done():
	}
	ends[0].Close()
	ends[1].Close()
	return link{}, fmt.Errorf("dialing %s: refused", addr)
}

type memListener struct {
	net  *memNet
	name string
	ch   chan link
	once sync.Once
	done chan struct{}
}

func (l *memListener) accept() (link, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return link{}, fmt.Errorf("accept on %s: %w", l.name, net.ErrClosed)
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

// memEnd is one end of a memNet connection: its byte stream and its
// direct access to the other end's regions.
type memEnd struct {
	net.Conn
	net   *memNet
	peer  *memEnd
	conn  *Conn         // set by bind
	bound chan struct{} // closed by bind
	// fence orders a copy into the peer's memory before the packets sent
	// after it, for the race detector (a socket is no synchronisation to
	// it), as a shared-memory ring's release and acquire would.
	fence     *atomic.Int64
	closeOnce sync.Once
	closed    chan struct{}
}

func (e *memEnd) link() link { return link{Conn: e, direct: e} }

func (e *memEnd) bind(c *Conn) { e.conn = c; close(e.bound) }

func (e *memEnd) Read(b []byte) (int, error) {
	n, err := e.Conn.Read(b)
	e.fence.Load()
	return n, err
}

func (e *memEnd) Write(b []byte) (int, error) {
	e.fence.Add(1)
	return e.Conn.Write(b)
}

func (e *memEnd) Close() error {
	e.closeOnce.Do(func() { close(e.closed) })
	return e.Conn.Close()
}

// target is the peer's Conn, once its hello is done.
func (e *memEnd) target(ctx context.Context) (*Conn, error) {
	select {
	case <-e.peer.bound:
		return e.peer.conn, nil
	case <-e.peer.closed:
	case <-e.closed:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return nil, ErrClosed
}

// copyRegion performs a one-sided operation on the target's memory,
// under its region table's checks and revocation.
func (e *memEnd) copyRegion(ctx context.Context, key, off uint64, b []byte, perm Perm) error {
	if _, ok := e.net.unshared.Load(key); ok {
		return errNotDirect
	}
	t, err := e.target(ctx)
	if err != nil {
		return err
	}
	if t.Err() != nil {
		return ErrClosed // the target's side is gone: no more access
	}
	if r := t.ep.regions.lookup(t, key); r != nil && r.guard != nil {
		return errNotDirect // guarded: the target admits each read
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
	e.net.direct.Add(1)
	e.fence.Add(1)
	return nil
}

func (e *memEnd) readRegion(ctx context.Context, key, off uint64, dst []byte) error {
	return e.copyRegion(ctx, key, off, dst, RemoteRead)
}

func (e *memEnd) writeRegion(ctx context.Context, key, off uint64, src []byte) error {
	return e.copyRegion(ctx, key, off, src, RemoteWrite)
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
		mem := regBuf(t, tr, srv, 23)
		copy(mem, "bound to one connection")
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
		wantDirect(t, tr, pc, 1)
	})
}

// TestDirectFallsBackToPackets: a one-sided operation on a region the
// transport cannot reach itself goes as packets, served by the target
// with the same checks.
func TestDirectFallsBackToPackets(t *testing.T) {
	n := newMemNet()
	ctx := context.Background()
	srv, _, pc := pair(t, Options{transport: n}, newCollector())
	mem := make([]byte, 64)
	r := srv.Register(mem, RemoteRead|RemoteWrite)
	n.unshared.Store(r.Key(), true)
	if err := pc.Write(ctx, r.Key(), 8, []byte("by packet"), true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 9)
	if err := pc.Read(ctx, r.Key(), 8, got); err != nil || string(got) != "by packet" {
		t.Fatalf("read back %q, %v", got, err)
	}
	if d := n.direct.Load(); d != 0 {
		t.Fatalf("%d operations copied directly on an unshared region", d)
	}
	var ae *AccessError
	if err := pc.Read(ctx, r.Key(), 60, got); !errors.As(err, &ae) {
		t.Fatalf("out-of-bounds read by packet: %v, want an access error", err)
	}
}
