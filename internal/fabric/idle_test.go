package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// echo answers every one-packet message with its header.
type echo struct{}

func (echo) HandlePacket(p *Packet) {
	data := append([]byte(nil), p.Data...)
	c, id := p.Conn, p.ID
	p.Release()
	go c.Send(id, data)
}
func (echo) Closed(*Conn, error) {}

// TestIdleConnectionClosed: an inbound connection that carries nothing
// for the idle timeout is closed by the server, which announced the
// timeout in its hello; one that keeps talking is not.
func TestIdleConnectionClosed(t *testing.T) {
	srv, err := NewEndpoint(Options{IdleTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0", echo{})
	if err != nil {
		t.Fatal(err)
	}
	hello := func() (net.Conn, time.Duration) {
		nc, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		var h [helloSize]byte
		copy(h[:], helloMagic[:])
		binary.LittleEndian.PutUint32(h[4:], DefaultMTU)
		binary.LittleEndian.PutUint32(h[8:], 16)
		nc.Write(h[:])
		if _, err := io.ReadFull(nc, h[:]); err != nil {
			t.Fatal(err)
		}
		return nc, time.Duration(binary.LittleEndian.Uint32(h[12:])) * time.Millisecond
	}
	idle, announced := hello()
	defer idle.Close()
	if announced != 300*time.Millisecond {
		t.Fatalf("hello announced an idle timeout of %s, want 300ms", announced)
	}
	busy, _ := hello()
	defer busy.Close()

	closed := make(chan error, 1)
	go func() {
		idle.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err := idle.Read(make([]byte, 1))
		closed <- err
	}()
	// The busy one sends a message every 50 ms, for longer than the
	// timeout, and reads the echoes.
	h := make([]byte, HeaderSize)
	putHeader(h, header{kind: KindSend, flags: FlagFirst | FlagLast, length: 2, id: 1})
	reply := make([]byte, HeaderSize+2)
	for i := 0; i < 20; i++ {
		busy.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := busy.Write(append(h, 'h', 'i')); err != nil {
			t.Fatalf("busy connection, message %d: %v", i, err)
		}
		if _, err := io.ReadFull(busy, reply); err != nil {
			t.Fatalf("busy connection closed after %d messages: %v", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-closed:
		if err != io.EOF {
			t.Fatalf("idle connection: read %v, want EOF (closed by the server)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("idle connection not closed")
	}
}

// TestPoolSurvivesIdleClose: requests through a pool with idle gaps
// around the server's idle timeout all succeed: a pooled connection the
// server closed is skipped, and one idle for half the announced timeout
// is not reused (the server may be closing it just then).
func TestPoolSurvivesIdleClose(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		const idle = 300 * time.Millisecond
		srv, err := NewEndpoint(Options{transport: tr, IdleTimeout: idle})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		addr, err := srv.Listen("127.0.0.1:0", echo{})
		if err != nil {
			t.Fatal(err)
		}
		cli, err := NewEndpoint(Options{transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		defer cli.Close()
		pool := NewPool(cli, 4)
		defer pool.Close()
		ctx := context.Background()
		call := func() *PeerConn {
			t.Helper()
			pc, err := pool.Get(ctx, addr.String())
			if err != nil {
				t.Fatal(err)
			}
			id := pc.NewID()
			replies := pc.Replies.Expect(id)
			if err := pc.Send(id, []byte("ping")); err != nil {
				t.Fatalf("send: %v", err)
			}
			select {
			case p, ok := <-replies:
				if !ok {
					t.Fatalf("connection lost: %v", pc.Err())
				}
				p.Release()
			case <-time.After(10 * time.Second):
				t.Fatal("no reply")
			}
			pool.Put(pc)
			return pc
		}

		// The server closes the pooled connection; the next call redials.
		first := call()
		deadline := time.Now().Add(20 * time.Second)
		for first.Err() == nil {
			if time.Now().After(deadline) {
				t.Fatal("the server did not close the idle pooled connection")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !errors.Is(first.Err(), io.EOF) {
			t.Logf("closed with %v", first.Err())
		}
		if second := call(); second == first {
			t.Fatal("a closed connection was reused")
		}

		// Past half the timeout, the pool dials anew instead of racing the
		// server's close.
		a := call()
		time.Sleep(idle/2 + 20*time.Millisecond)
		if b := call(); b == a {
			t.Fatal("a connection idle for over half the announced timeout was reused")
		}
		select {
		case <-a.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the stale connection was not closed by the pool")
		}

		// Gaps all around the timeout: no call fails.
		for range 12 {
			call()
			time.Sleep(rand.N(idle * 3 / 2))
		}
	})
}
