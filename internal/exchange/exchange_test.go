package exchange

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
)

// node is a server handler: it counts each message's data bytes and
// answers with the count (8 bytes) at the message's end; early answers
// on the header packet instead, silent never answers, and hangUp closes
// the connection on the header.
type node struct {
	early, silent, hangUp bool

	mu sync.Mutex
	n  map[uint64]uint64
}

func (s *node) HandlePacket(p *fabric.Packet) {
	defer p.Release()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[uint64]uint64{}
	}
	switch {
	case p.First() && s.hangUp:
		p.Conn.Close()
		return
	case p.First() && s.early:
		go p.Conn.Send(p.ID, []byte("refused"))
		return
	case !p.First():
		s.n[p.ID] += uint64(len(p.Data))
	}
	if p.Last() && !s.silent && !s.early {
		go p.Conn.Send(p.ID, binary.LittleEndian.AppendUint64(nil, s.n[p.ID]))
	}
}

func (s *node) Closed(*fabric.Conn, error) {}

func setup(t *testing.T, h fabric.Handler) (*fabric.Pool, string) {
	t.Helper()
	opts := fabric.Options{MTU: fabric.MinMTU, Quota: 4}
	srv, err := fabric.NewEndpoint(opts)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0", h)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := fabric.NewEndpoint(opts)
	if err != nil {
		t.Fatal(err)
	}
	pool := fabric.NewPool(cli, 4)
	t.Cleanup(func() { pool.Close(); cli.Close(); srv.Close() })
	return pool, addr.String()
}

func TestStreamedCallAndReuse(t *testing.T) {
	pool, addr := setup(t, &node{})
	ctx := context.Background()
	parts := [][]byte{bytes.Repeat([]byte{1}, 5000), nil, bytes.Repeat([]byte{2}, 3), bytes.Repeat([]byte{3}, 7000)}
	kept := make([][]byte, len(parts))
	copy(kept, parts)
	var first *fabric.PeerConn
	for round := range 2 {
		call, err := Begin(ctx, pool, addr, []byte("hdr"), false)
		if err != nil {
			t.Fatal(err)
		}
		call.SetData(parts)
		pumps := 0
		for call.Left() > 0 {
			answered, _, err := call.Pump(parts, 1000)
			if answered || err != nil {
				t.Fatalf("pump: answered %v, %v", answered, err)
			}
			pumps++
		}
		if pumps != 13 { // 12003 bytes, 1000 a pump
			t.Fatalf("%d pumps", pumps)
		}
		p, err := call.Finish(ctx, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := binary.LittleEndian.Uint64(p.Data); got != 12003 {
			t.Fatalf("node got %d bytes, want 12003", got)
		}
		p.Release()
		if round == 0 {
			first = call.Conn()
		} else if call.Conn() != first {
			t.Fatal("the connection of a clean exchange was not reused")
		}
	}
	for i := range parts {
		if len(parts[i]) != len(kept[i]) {
			t.Fatal("Pump modified the caller's parts")
		}
	}
}

func TestEmptyCallAndDo(t *testing.T) {
	pool, addr := setup(t, &node{})
	ctx := context.Background()
	call, err := Begin(ctx, pool, addr, []byte("hdr"), true)
	if err != nil {
		t.Fatal(err)
	}
	p, err := call.Finish(ctx, 10*time.Second)
	if err != nil || binary.LittleEndian.Uint64(p.Data) != 0 {
		t.Fatalf("header-only call: %v", err)
	}
	p.Release()
	p, err = Do(ctx, pool, addr, 10*time.Second, []byte("hdr"), []byte("ab"), []byte("cde"))
	if err != nil || binary.LittleEndian.Uint64(p.Data) != 5 {
		t.Fatalf("Do: %v", err)
	}
	p.Release()
}

func TestEarlyReplyAbortsTheMessage(t *testing.T) {
	pool, addr := setup(t, &node{early: true})
	ctx := context.Background()
	call, err := Begin(ctx, pool, addr, []byte("hdr"), false)
	if err != nil {
		t.Fatal(err)
	}
	big := [][]byte{make([]byte, 1<<30)} // never all sent
	call.SetData(big)
	deadline := time.Now().Add(20 * time.Second)
	for {
		answered, p, err := call.Pump(big, 100)
		if answered {
			if err != nil {
				t.Fatal(err)
			}
			if string(p.Data) != "refused" {
				t.Fatalf("early reply %q", p.Data)
			}
			p.Release()
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("no early reply seen")
		}
		time.Sleep(time.Millisecond)
	}
	if call.Conn().Err() == nil {
		t.Fatal("the connection of an aborted message stays open")
	}
}

func TestSilenceTimesOut(t *testing.T) {
	pool, addr := setup(t, &node{silent: true})
	_, err := Do(context.Background(), pool, addr, 50*time.Millisecond, []byte("hdr"), []byte("x"))
	var nr *NoReplyError
	if !errors.As(err, &nr) || nr.After != 50*time.Millisecond {
		t.Fatalf("got %v, want no reply within 50ms", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	pc, err := pool.Get(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	call, err := Post(pool, pc, []byte("hdr"))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := call.Finish(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the context's error", err)
	}
	if pc.Err() == nil {
		t.Fatal("the connection of an unanswered request stays open")
	}
	stop := make(chan struct{})
	close(stop)
	call, err = Begin(context.Background(), pool, addr, []byte("hdr"), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := call.FinishUnless(stop, time.Hour); err != ErrStopped {
		t.Fatalf("got %v, want ErrStopped", err)
	}
	if call.Conn().Err() == nil {
		t.Fatal("the connection of a stopped request stays open")
	}
}

func TestLostConnection(t *testing.T) {
	pool, addr := setup(t, &node{hangUp: true})
	_, err := Do(context.Background(), pool, addr, 10*time.Second, []byte("hdr"))
	var lost *LostError
	if !errors.As(err, &lost) {
		t.Fatalf("got %v, want a lost connection", err)
	}
}
