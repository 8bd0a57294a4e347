package fabricrpc

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
)

// stallClient is a raw client whose reader goroutine can be parked in
// HandlePacket, so it stops reading the socket (TCP backpressure).
type stallClient struct {
	msgs  chan []byte
	mu    sync.Mutex
	stall chan struct{} // non-nil: the next packet blocks until closed
	in    chan struct{}
}

func (s *stallClient) HandlePacket(p *fabric.Packet) {
	m := append([]byte(nil), p.Data...)
	p.Release()
	s.mu.Lock()
	st := s.stall
	s.stall = nil
	s.mu.Unlock()
	s.msgs <- m
	if st != nil {
		close(s.in)
		<-st
	}
}
func (s *stallClient) Closed(*fabric.Conn, error) {}

func TestReviewDoneDuringPull(t *testing.T) {
	_, svc, addr := startServer(t, nil)
	orig := append([]byte(nil), svc.static...)
	ep, err := fabric.NewEndpoint(fabric.Options{MTU: DefaultBufSize, Quota: DefaultBufCount})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	sc := &stallClient{msgs: make(chan []byte, 16), in: make(chan struct{})}
	conn, err := ep.Dial(context.Background(), addr, sc)
	if err != nil {
		t.Fatal(err)
	}
	// Call A: 1 MiB of held memory, as a chunk.
	if err := conn.SendPacket(1, callMsg(1, procHeld, nil, words(1<<20)), nil); err != nil {
		t.Fatal(err)
	}
	rep := decodeReply(t, <-sc.msgs)
	if len(rep.h.refs) != 1 {
		t.Fatalf("refs %d", len(rep.h.refs))
	}
	ref := rep.h.refs[0]
	// Park our reader on the next reply (call B).
	gate := make(chan struct{})
	sc.mu.Lock()
	sc.stall = gate
	sc.mu.Unlock()
	if err := conn.SendPacket(2, callMsg(2, procNull, nil, nil), nil); err != nil {
		t.Fatal(err)
	}
	<-sc.in
	// Pull A's chunk; the server streams it but we are not reading.
	const pulls = 8
	dsts := make([][]byte, pulls)
	rerr := make(chan error, pulls)
	for i := range dsts {
		dsts[i] = make([]byte, ref.len)
		go func() { rerr <- conn.Read(context.Background(), ref.key, ref.addr, dsts[i]) }()
	}
	time.Sleep(200 * time.Millisecond)
	// DONE for A while the pull is in flight.
	if err := conn.SendPacket(3, doneMsg(1), nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-svc.held:
	case <-time.After(5 * time.Second):
		t.Fatal("hold not released")
	}
	// The service may now reuse its memory (as the cache recycles a block).
	for i := range svc.static {
		svc.static[i] = 0xEE
	}
	close(gate)
	for range pulls {
		if err := <-rerr; err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	for _, dst := range dsts {
		if !bytes.Equal(dst, orig[:len(dst)]) {
			n := 0
			for i := range dst {
				if dst[i] != orig[i] {
					n++
				}
			}
			t.Errorf("pulled data changed after the hold was released: %d of %d bytes differ (first at %d)", n, len(dst), bytes.IndexByte(dst, 0xEE))
		}
	}
}
