package fabricrpc

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
)

// parkClient is a raw client whose reader can be parked in HandlePacket,
// so it stops reading its socket and the server's writes back up.
type parkClient struct {
	ep   *fabric.Endpoint
	conn *fabric.Conn
	msgs chan []byte
	mu   sync.Mutex
	park chan struct{} // non-nil: the next packet waits for it to close
	gate chan struct{} // what a parked reader waits for
	in   chan struct{} // closed when the reader parks
}

// dialParked connects a parkClient to addr, unparked and closed when
// the test ends.
func dialParked(t *testing.T, addr string) *parkClient {
	t.Helper()
	ep, err := fabric.NewEndpoint(fabric.Options{MTU: DefaultBufSize, Quota: DefaultBufCount})
	if err != nil {
		t.Fatal(err)
	}
	pc := &parkClient{ep: ep, msgs: make(chan []byte, 16), in: make(chan struct{}), gate: make(chan struct{})}
	if pc.conn, err = ep.Dial(context.Background(), addr, pc); err != nil {
		ep.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pc.unpark()
		ep.Close()
	})
	return pc
}

// parkOn makes the reader park on the reply to a NULL call, and waits
// until it has.
func (s *parkClient) parkOn(t *testing.T, xid uint32) {
	t.Helper()
	s.mu.Lock()
	s.park = s.gate
	s.mu.Unlock()
	if err := s.conn.SendPacket(uint64(xid), callMsg(xid, procNull, nil, nil), nil); err != nil {
		t.Fatal(err)
	}
	<-s.in
}

// unpark lets a parked reader go (once).
func (s *parkClient) unpark() {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.gate:
	default:
		close(s.gate)
	}
}

func (s *parkClient) HandlePacket(p *fabric.Packet) {
	m := append([]byte(nil), p.Data...)
	p.Release()
	s.mu.Lock()
	park := s.park
	s.park = nil
	s.mu.Unlock()
	s.msgs <- m
	if park != nil {
		close(s.in)
		<-park
	}
}

func (s *parkClient) Closed(*fabric.Conn, error) {}

// TestDoneDuringPull: a client that sends DONE while its own pull of the
// reply is still streaming must not get memory the server has reused
// (a cache block recycled for another file): the key is revoked at once,
// but what the reply held is released only when the pull is done.
func TestDoneDuringPull(t *testing.T) {
	_, svc, addr := startServer(t, nil)
	orig := append([]byte(nil), svc.static...)
	pc := dialParked(t, addr)
	conn := pc.conn
	if err := conn.SendPacket(1, callMsg(1, procHeld, nil, words(1<<20)), nil); err != nil {
		t.Fatal(err)
	}
	rep := decodeReply(t, <-pc.msgs)
	if len(rep.h.refs) != 1 {
		t.Fatalf("%d chunks", len(rep.h.refs))
	}
	ref := rep.h.refs[0]
	// Park our reader on the next reply, then pull: the server's
	// response stalls once the socket buffers fill.
	pc.parkOn(t, 2)
	const pulls = 8
	dsts := make([][]byte, pulls)
	rerr := make(chan error, pulls)
	for i := range dsts {
		dsts[i] = make([]byte, ref.len)
		go func() { rerr <- conn.Read(context.Background(), ref.key, ref.addr, dsts[i]) }()
	}
	time.Sleep(200 * time.Millisecond)
	if err := conn.SendPacket(3, doneMsg(1), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-svc.held:
		t.Fatal("the reply's memory was released while a pull of it was still being answered")
	case <-time.After(300 * time.Millisecond):
	}
	// Let the pulls finish: they get the original bytes, then the memory
	// is released.
	pc.unpark()
	for range pulls {
		if err := <-rerr; err != nil {
			t.Fatalf("pull: %v", err)
		}
	}
	for _, dst := range dsts {
		if !bytes.Equal(dst, orig[:len(dst)]) {
			t.Fatal("pulled data differ from the reply's")
		}
	}
	select {
	case <-svc.held:
	case <-time.After(5 * time.Second):
		t.Fatal("the reply's memory was not released after the pulls")
	}
}

// TestPullTimeout: a client that lists a chunk and then never answers
// the server's READ of it loses its connection after DoneTimeout instead
// of holding the call (its goroutine and buffer) forever.
func TestPullTimeout(t *testing.T) {
	_, _, addr := startServer(t, func(s *Server) { s.DoneTimeout = 300 * time.Millisecond })
	pc := dialParked(t, addr)
	conn := pc.conn
	// Park our reader on a reply: from then on the server's READ requests
	// go unanswered.
	pc.parkOn(t, 1)
	data := make([]byte, 4096)
	r := pc.ep.Register(data, fabric.RemoteRead)
	args := words(uint32(len(data)))
	msg := callMsg(2, procEcho, []chunkRef{{pos: uint32(len(callMsg(2, procEcho, nil, nil)) - headerSize(0) + 4), len: uint32(len(data)), key: r.Key()}}, args)
	if err := conn.SendPacket(2, msg, nil); err != nil {
		t.Fatal(err)
	}
	// Past the timeout, let our reader go: it finds the connection closed
	// by the server (without the timeout it would answer the pull, and
	// the call would complete on an open connection).
	time.Sleep(time.Second)
	pc.unpark()
	select {
	case <-conn.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the connection of a client that did not answer the server's pull in time is still open")
	}
}
