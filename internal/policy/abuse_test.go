package policy_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/wire"
)

// TestCleanupDoesNotBlockWorker: the cleanup handler of an aborted write
// waits for its forward to stop (forward.abort + forward.wait) on the
// handler worker. A forward still dialing or handshaking with the next
// replica — whose address comes unauthenticated from the client's WRH —
// or blocked in a writev to a replica that does not read, does not see
// the stop until that call returns (HandshakeTimeout 5s, ReplyTimeout
// 60s, WriteTimeout 30s). Meanwhile every other request bound to that
// worker waits: "workers never block on the network" does not hold.
func TestCleanupDoesNotBlockWorker(t *testing.T) {
	e := newEnv(t, engine.Options{Workers: 1})
	n := e.c.Nodes
	// A "replica" that accepts TCP connections but never says hello.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()

	cp := e.mint(21, capability.Write, time.Now().Add(time.Minute), n[0], n[1])
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: 21, Len: 1 << 20, Cap: cp},
		[]string{n[0].Addr(), ln.Addr().String()})
	pc, err := e.pool.Get(context.Background(), n[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	mw, err := pc.Begin(pc.NewID(), hdr, false)
	if err != nil {
		t.Fatal(err)
	}
	mw.Write(make([]byte, 64<<10), false)
	mw.Flush()
	time.Sleep(100 * time.Millisecond)
	mw.Abort(errors.New("client dies")) // cleanup runs on the only worker

	// An unrelated single-replica write on the same node.
	time.Sleep(100 * time.Millisecond)
	cp2 := e.mint(22, capability.Write, time.Now().Add(time.Minute), n[0])
	start := time.Now()
	r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 22, Len: 10, Cap: cp2}, []*node.Node{n[0]}, bytes.Repeat([]byte("z"), 10))
	if r.Status != wire.StatusOK {
		t.Fatalf("unrelated write: %v %s", r.Status, r.Msg)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("an unrelated write took %v: the worker was blocked in the aborted request's cleanup", d)
	}
}

// TestZeroLengthWriteWithDataPacketLeaksQuota: a WRH with Len 0 starts a
// header-only forward (startForward(..., h.Len == 0)), but the inbound
// message may still carry data packets (here: an empty Last packet). The
// payload handler Retains and pushes each into the forward's queue, which
// a header-only forward never reads and never drains, so every such
// packet is lost to the connection's receive quota. After Quota (16)
// requests the connection's reader blocks forever in quota.get — neither
// the stall watchdog (not mid-packet) nor the idle sweeper (no request in
// the table) ever closes it: a goroutine, a socket and a connection slot
// leaked per hostile connection, until MaxConns is reached.
func TestZeroLengthWriteWithDataPacketLeaksQuota(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	ring := []*node.Node{n[0], n[1]}
	cp := e.mint(23, capability.Write, time.Now().Add(time.Minute), ring...)
	hdr, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: 23, Off: 0, Len: 0, Cap: cp}, addrs(ring...))
	pc, err := e.pool.Get(context.Background(), n[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20; i++ {
		id := pc.NewID()
		ch := pc.Replies.Expect(id)
		mw, err := pc.Begin(id, hdr, false)
		if err != nil {
			t.Fatal(err)
		}
		mw.Write(nil, true) // an empty Last packet
		if err := mw.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case p, ok := <-ch:
			if !ok {
				t.Fatalf("request %d: connection closed: %v", i, pc.Err())
			}
			p.Release()
		case <-time.After(5 * time.Second):
			t.Fatalf("request %d: no reply; the connection's receive quota is exhausted by packets left in header-only forwards", i)
		}
	}
}

// rawFabric opens a raw TCP connection to a fabric endpoint, completes
// the hello, and returns it: a peer that sends what it likes and reads
// nothing.
func rawFabric(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var hello [16]byte
	copy(hello[:], "SLF\x01")
	binary.LittleEndian.PutUint32(hello[4:], 64<<10)
	binary.LittleEndian.PutUint32(hello[8:], 16)
	if _, err := c.Write(hello[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		t.Fatal(err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetReadBuffer(4096) // keep the kernel from absorbing the reply
	}
	return c
}

func rawSend(t *testing.T, c net.Conn, id uint64, payload []byte) {
	t.Helper()
	var h [16]byte
	h[0] = 1           // KindSend
	h[1] = 1<<0 | 1<<1 // First|Last
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[8:], id)
	if _, err := c.Write(append(h[:], payload...)); err != nil {
		t.Fatal(err)
	}
}

// TestSlowReaderDoesNotBlockCommits: the read handler keeps the chunk's
// store.Read view (its shared lock) open while it pushes the data to the
// client over the network (reader.read: defer rd.Close() around every
// Conn.Write / MessageWriter flush). A client with a read capability that
// stops reading holds the lock for up to WriteTimeout per flush (and
// indefinitely if it trickles). A Commit on that chunk waits for the
// exclusive lock, and because sync.RWMutex then blocks new readers, every
// later read of the chunk waits too, each holding one of the node's 32
// read slots.
func TestSlowReaderDoesNotBlockCommits(t *testing.T) {
	e := newEnv(t, engine.Options{})
	n := e.c.Nodes
	one := []*node.Node{n[0]}
	cp := e.mint(24, capability.Write|capability.Read, time.Now().Add(time.Minute), one...)
	data := bytes.Repeat([]byte("r"), 16<<20)
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 24, Len: uint64(len(data)), Cap: cp}, one, data); r.Status != wire.StatusOK {
		t.Fatalf("write: %v %s", r.Status, r.Msg)
	}
	raw := rawFabric(t, n[0].Addr())
	defer raw.Close()
	rh, _ := wire.AppendRead(nil, &wire.ReadHeader{Chunk: 24, Off: 0, Len: 16 << 20, Cap: cp})
	rawSend(t, raw, 1, rh) // ... and never read the reply
	time.Sleep(500 * time.Millisecond)

	done := make(chan wire.Reply, 1)
	go func() {
		done <- e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 24, Off: 0, Len: 10, Cap: cp}, one, make([]byte, 10))
	}()
	select {
	case r := <-done:
		if r.Status != wire.StatusOK {
			t.Fatalf("overwrite: %v %s", r.Status, r.Msg)
		}
	case <-time.After(5 * time.Second):
		raw.Close() // unblock the node
		<-done
		t.Fatal("a 10-byte overwrite waited more than 5s for a client that does not read its read reply")
	}
}

// TestRefusedRequestsDoNotPinTheTable: a header the header handler
// refuses (here: garbage instead of a capability — no credentials at all)
// keeps its request-table entry, in phaseRefused, until the message's
// Last packet or the connection's end. A peer that keeps the message open
// and sends an empty data packet now and then is never "idle", so the
// sweeper never frees it: TableSize such connections (1024 by default,
// below MaxConns 4096) refuse every legitimate request with busy,
// indefinitely, without any capability.
func TestRefusedRequestsDoNotPinTheTable(t *testing.T) {
	e := newEnv(t, engine.Options{TableSize: 4, IdleTimeout: time.Second})
	n := e.c.Nodes
	garbage, _ := wire.AppendWrite(nil, &wire.WriteHeader{Strategy: plan.Ring, Chunk: 25, Len: 1 << 30, Cap: []byte("not a capability")}, []string{n[0].Addr()})
	stop := make(chan struct{})
	defer close(stop)
	for i := 0; i < 4; i++ {
		raw := rawFabric(t, n[0].Addr())
		defer raw.Close()
		var h [16]byte
		h[0], h[1] = 1, 1 // KindSend, First (not Last)
		binary.LittleEndian.PutUint32(h[4:], uint32(len(garbage)))
		binary.LittleEndian.PutUint64(h[8:], 1)
		raw.Write(append(h[:], garbage...))
		go func() {
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			var p [16]byte
			p[0] = 1 // KindSend, no flags: an empty data packet of message 1
			binary.LittleEndian.PutUint64(p[8:], 1)
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					if _, err := raw.Write(p[:]); err != nil {
						return
					}
				}
			}
		}()
	}
	time.Sleep(3 * time.Second) // three idle timeouts
	cp := e.mint(26, capability.Write, time.Now().Add(time.Minute), n[0])
	r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 26, Len: 10, Cap: cp}, []*node.Node{n[0]}, make([]byte, 10))
	if r.Status != wire.StatusOK {
		t.Fatalf("legitimate write refused (%v %s): refused, credential-less requests still hold every table entry (%+v)",
			r.Status, r.Msg, n[0].Engine().Stats())
	}
}

// TestScaledReadSpanningPastItsBuffer: a scaled read's reply covers whole
// blocks, so one of 1 MiB starting mid-block spans 1 MiB and a block. It
// sliced the node's 1 MiB buffer past its end and crashed the process;
// any client with read access could do it. It is refused.
func TestScaledReadSpanningPastItsBuffer(t *testing.T) {
	e := newEnv(t, engine.Options{})
	one := []*node.Node{e.c.Nodes[0]}
	cp := e.mint(31, capability.Write|capability.Read, time.Now().Add(time.Minute), one...)
	data := bytes.Repeat([]byte("s"), 2<<20)
	if r := e.write(t, wire.WriteHeader{Strategy: plan.Ring, Chunk: 31, Len: uint64(len(data)), Cap: cp}, one, data); r.Status != wire.StatusOK {
		t.Fatalf("write: %v %s", r.Status, r.Msg)
	}
	pc, err := e.pool.Get(context.Background(), one[0].Addr())
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := wire.AppendRead(nil, &wire.ReadHeader{Chunk: 31, Off: 1, Len: 1 << 20, Scaled: true, Coef: 3, RegionKey: 1, Cap: cp})
	if err != nil {
		t.Fatal(err)
	}
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	if err := pc.Send(id, hdr); err != nil {
		t.Fatal(err)
	}
	if r := e.reply(t, pc, ch); r.Status != wire.StatusBadRequest {
		t.Fatalf("a scaled read spanning 1 MiB and a block: %v %s, want bad-request", r.Status, r.Msg)
	}
}
