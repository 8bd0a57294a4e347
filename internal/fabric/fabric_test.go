package fabric

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// collector is a Handler that reassembles messages.
type collector struct {
	mu     sync.Mutex
	msgs   map[uint64]*bytes.Buffer
	hdrs   map[uint64][]byte
	done   chan uint64
	closed chan error
	hold   bool // keep packets (do not release) to exercise the quota
	held   []*Packet
}

func newCollector() *collector {
	return &collector{msgs: map[uint64]*bytes.Buffer{}, hdrs: map[uint64][]byte{}, done: make(chan uint64, 1024), closed: make(chan error, 1)}
}

func (h *collector) HandlePacket(p *Packet) {
	h.mu.Lock()
	if p.First() {
		h.hdrs[p.ID] = append([]byte(nil), p.Data...)
		h.msgs[p.ID] = new(bytes.Buffer)
	} else {
		b := h.msgs[p.ID]
		if int64(b.Len()) != p.Off {
			panic("packet offset does not match bytes received")
		}
		b.Write(p.Data)
	}
	last := p.Last()
	if h.hold {
		h.held = append(h.held, p)
	} else {
		p.Release()
	}
	h.mu.Unlock()
	if last {
		h.done <- p.ID
	}
}

func (h *collector) Closed(c *Conn, err error) {
	select {
	case h.closed <- err:
	default: // tests watch the first close only
	}
}

func pair(t *testing.T, opts Options, server Handler) (*Endpoint, *Endpoint, *PeerConn) {
	t.Helper()
	srv, err := NewEndpoint(opts)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewEndpoint(opts)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close(); srv.Close() })
	return srv, cli, pc
}

func TestMessagesAcrossMTUs(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, mtu := range []int{MinMTU, 1500, 4096, DefaultMTU} {
			col := newCollector()
			_, _, pc := pair(t, Options{transport: tr, MTU: mtu, Quota: 4}, col)
			want := map[uint64][]byte{}
			for i := 0; i < 20; i++ {
				n := rng.IntN(5 * mtu)
				if i == 0 {
					n = 0
				}
				data := make([]byte, n)
				for j := range data {
					data[j] = byte(rng.Uint32())
				}
				id := pc.NewID()
				want[id] = data
				// Split the data into uneven parts to exercise packetizing.
				var parts [][]byte
				for rest := data; len(rest) > 0; {
					k := min(len(rest), 1+rng.IntN(2*mtu))
					parts = append(parts, rest[:k])
					rest = rest[k:]
				}
				if err := pc.Send(id, []byte("hdr"), parts...); err != nil {
					t.Fatal(err)
				}
			}
			for range want {
				select {
				case id := <-col.done:
					col.mu.Lock()
					if got := col.msgs[id].Bytes(); !bytes.Equal(got, want[id]) {
						t.Fatalf("mtu %d msg %d: got %d bytes, want %d", mtu, id, len(got), len(want[id]))
					}
					if string(col.hdrs[id]) != "hdr" {
						t.Fatalf("header %q", col.hdrs[id])
					}
					col.mu.Unlock()
				case <-time.After(5 * time.Second):
					t.Fatalf("mtu %d: timed out", mtu)
				}
			}
		}
	})
}

func TestHeaderLargerThanMTURefused(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		_, _, pc := pair(t, Options{transport: tr, MTU: MinMTU}, newCollector())
		if err := pc.Send(1, make([]byte, MinMTU+1)); err == nil {
			t.Fatal("oversized header accepted")
		}
	})
}

func TestQuotaBoundsReceiveMemory(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		col := newCollector()
		col.hold = true
		srv, _, pc := pair(t, Options{transport: tr, MTU: MinMTU, Quota: 3}, col)
		_ = srv
		sent := make(chan error, 1)
		go func() { sent <- pc.Send(1, []byte("h"), make([]byte, 64*MinMTU)) }()
		time.Sleep(100 * time.Millisecond)
		col.mu.Lock()
		held := len(col.held)
		col.mu.Unlock()
		if held != 3 {
			t.Fatalf("handler holds %d packets, quota is 3", held)
		}
		// Releasing lets the rest through.
		go func() {
			for {
				col.mu.Lock()
				for _, p := range col.held {
					p.Release()
				}
				col.held = col.held[:0]
				col.hold = false
				col.mu.Unlock()
				select {
				case <-col.done:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
		if err := <-sent; err != nil {
			t.Fatal(err)
		}
	})
}

func TestOneSidedWriteAndRead(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		col := newCollector()
		srv, _, pc := pair(t, Options{transport: tr, MTU: 1024}, col)
		mem := regBuf(t, tr, srv, 10000)
		r := srv.Register(mem, RemoteRead|RemoteWrite)
		data := bytes.Repeat([]byte("0123456789"), 500)
		ctx := context.Background()
		if err := pc.Write(ctx, r.Key(), 1234, data, true); err != nil {
			t.Fatal(err)
		}
		// The region's owner learns of the data from a later message on the
		// same connection (the race detector cannot see the ack's path).
		pc.Send(pc.NewID(), []byte("written"))
		<-col.done
		if !bytes.Equal(mem[1234:1234+len(data)], data) {
			t.Fatal("signaled write did not place the data")
		}
		got := make([]byte, 3333)
		if err := pc.Read(ctx, r.Key(), 1500, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, mem[1500:1500+3333]) {
			t.Fatal("read returned wrong bytes")
		}
		wantDirect(t, tr, pc, 1)
	})
}

func TestOneSidedAccessErrors(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		ctx := context.Background()
		cases := []struct {
			name string
			op   func(pc *PeerConn, r *Region) error
		}{
			{"write unknown key", func(pc *PeerConn, r *Region) error { return pc.Write(ctx, r.Key()+1, 0, []byte("x"), true) }},
			{"write out of bounds", func(pc *PeerConn, r *Region) error { return pc.Write(ctx, r.Key(), 99, []byte("xy"), true) }},
			{"write overflow", func(pc *PeerConn, r *Region) error { return pc.Write(ctx, r.Key(), 1<<64-1, []byte("xy"), true) }},
			{"read out of bounds", func(pc *PeerConn, r *Region) error { return pc.Read(ctx, r.Key(), 50, make([]byte, 51)) }},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				srv, _, pc := pair(t, Options{transport: tr}, newCollector())
				mem := regBuf(t, tr, srv, 100)
				r := srv.Register(mem, RemoteRead|RemoteWrite)
				err := tc.op(pc, r)
				var ae *AccessError
				if !errors.As(err, &ae) && !errors.Is(err, ErrClosed) {
					t.Fatalf("got %v, want an access error", err)
				}
				select {
				case <-pc.Done():
				case <-time.After(2 * time.Second):
					t.Fatal("connection stayed open after a remote access error")
				}
				srv.Close() // the target's reader has stopped: safe to inspect
				if !bytes.Equal(mem, make([]byte, 100)) {
					t.Fatal("refused write modified the region")
				}
			})
		}
	})
}

func TestPermissionsAndDeregister(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		ctx := context.Background()
		srv, cli, pc := pair(t, Options{transport: tr}, newCollector())
		ro := srv.Register(regBuf(t, tr, srv, 10), RemoteRead)
		var ae *AccessError
		if err := pc.Write(ctx, ro.Key(), 0, []byte("x"), true); !errors.As(err, &ae) {
			t.Fatalf("write to read-only region: %v", err)
		}
		pool := NewPool(cli, 1)
		pc2, err := pool.Get(ctx, pc.Addr())
		if err != nil {
			t.Fatal(err)
		}
		rw := srv.Register(regBuf(t, tr, srv, 10), RemoteRead|RemoteWrite)
		if err := pc2.Read(ctx, rw.Key(), 0, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		srv.Deregister(rw)
		if err := pc2.Read(ctx, rw.Key(), 0, make([]byte, 1)); !errors.As(err, &ae) {
			t.Fatalf("read of deregistered region: %v", err)
		}
	})
}

func TestUnsignaledWriteOrderedBeforeLaterSend(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		col := newCollector()
		srv, _, pc := pair(t, Options{transport: tr, MTU: 512}, col)
		mem := regBuf(t, tr, srv, 4096)
		r := srv.Register(mem, RemoteRead|RemoteWrite)
		data := bytes.Repeat([]byte{7}, 4096)
		if err := pc.Write(context.Background(), r.Key(), 0, data, false); err != nil {
			t.Fatal(err)
		}
		if err := pc.Send(pc.NewID(), []byte("done")); err != nil {
			t.Fatal(err)
		}
		<-col.done
		if !bytes.Equal(mem, data) { // the send was delivered after placement
			t.Fatal("data not placed before the following message was delivered")
		}
	})
}

// rawPeer connects with a raw socket and completes the hello.
func rawPeer(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var hello [helloSize]byte
	copy(hello[:], helloMagic[:])
	binary.LittleEndian.PutUint32(hello[4:], DefaultMTU)
	binary.LittleEndian.PutUint32(hello[8:], 16)
	nc.Write(hello[:])
	io.ReadFull(nc, hello[:])
	return nc
}

func TestProtocolViolationsCloseConnection(t *testing.T) {
	pkt := func(kind Kind, flags uint8, id uint64, payload []byte) []byte {
		b := make([]byte, HeaderSize, HeaderSize+len(payload))
		putHeader(b, header{kind: kind, flags: flags, length: uint32(len(payload)), id: id})
		return append(b, payload...)
	}
	over := make([]byte, HeaderSize)
	putHeader(over, header{kind: KindSend, flags: FlagFirst, length: MinMTU + 1, id: 1})
	cases := map[string][]byte{
		"unknown kind":          pkt(99, 0, 1, nil),
		"middle without first":  pkt(KindSend, 0, 5, []byte("x")),
		"new first mid-message": append(pkt(KindSend, FlagFirst, 1, nil), pkt(KindSend, FlagFirst, 2, nil)...),
		"id change mid-message": append(pkt(KindSend, FlagFirst, 1, nil), pkt(KindSend, FlagLast, 2, nil)...),
		"reserved flag":         pkt(KindSend, 0x80|FlagFirst|FlagLast, 1, nil),
		"oversized packet":      over,
		"ack for unknown op":    pkt(KindAck, 0, 77, nil),
		"read resp unknown op":  pkt(KindReadResp, FlagLast, 77, []byte("x")),
		"short read request":    pkt(KindReadReq, 0, 1, []byte("short")),
		"signal on send":        pkt(KindSend, FlagFirst|FlagLast|FlagSignal, 1, nil),
		"truncated mid-message": pkt(KindSend, FlagFirst, 1, []byte("h")),
	}
	for name, raw := range cases {
		t.Run(name, func(t *testing.T) {
			col := newCollector()
			srv, err := NewEndpoint(Options{MTU: MinMTU})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			addr, _ := srv.Listen("127.0.0.1:0", col)
			nc := rawPeer(t, addr.String())
			defer nc.Close()
			nc.Write(raw)
			if name == "truncated mid-message" {
				nc.Close()
			}
			select {
			case err := <-col.closed:
				if err == nil {
					t.Fatal("closed without a reason")
				}
			case <-time.After(2 * time.Second):
				t.Fatal("connection not closed")
			}
		})
	}
}

// FuzzReceive feeds arbitrary bytes to a connection's receive path after
// a valid hello: it must never panic, and must either keep going or close.
func FuzzReceive(f *testing.F) {
	seed := make([]byte, HeaderSize)
	putHeader(seed, header{kind: KindSend, flags: FlagFirst | FlagLast, length: 0, id: 1})
	f.Add(seed)
	w := make([]byte, HeaderSize+oneSidedPrefix+4)
	putHeader(w, header{kind: KindWrite, flags: FlagSignal, length: oneSidedPrefix + 4, id: 2})
	f.Add(w)
	f.Add([]byte("garbage that is not a packet"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ep, err := NewEndpoint(Options{MTU: MinMTU, Quota: 2})
		if err != nil {
			t.Fatal(err)
		}
		ep.Register(make([]byte, 64), RemoteRead|RemoteWrite)
		a, bconn := net.Pipe()
		col := newCollector()
		go func() {
			var hello [helloSize]byte
			io.ReadFull(bconn, hello[:])
			go io.Copy(io.Discard, bconn) // replies, once the hello is read
			copy(hello[:], helloMagic[:])
			binary.LittleEndian.PutUint32(hello[4:], MinMTU)
			bconn.Write(hello[:])
			bconn.Write(b)
			bconn.Close()
		}()
		c, err := ep.handshake(link{Conn: a}, col, nil)
		if err == nil {
			<-col.closed
			c.Wait()
		}
		ep.Close()
	})
}

func BenchmarkSend64K(b *testing.B) {
	col := &discard{}
	srv, err := NewEndpoint(Options{})
	if err != nil {
		b.Fatal(err)
	}
	addr, _ := srv.Listen("127.0.0.1:0", col)
	cli, _ := NewEndpoint(Options{})
	pc, err := NewPool(cli, 1).Get(context.Background(), addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { cli.Close(); srv.Close() }()
	data := make([]byte, 4<<20)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := pc.Send(pc.NewID(), []byte("h"), data); err != nil {
			b.Fatal(err)
		}
	}
}

type discard struct{}

func (discard) HandlePacket(p *Packet) { p.Release() }
func (discard) Closed(*Conn, error)    {}

// TestStalledPeerIsClosedIdlePeerIsNot: a peer that stops in the middle of
// a packet loses its connection after the stall timeout; one that is just
// idle between messages keeps it.
func TestStalledPeerIsClosedIdlePeerIsNot(t *testing.T) {
	col := newCollector()
	srv, err := NewEndpoint(Options{StallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, _ := srv.Listen("127.0.0.1:0", col)

	idle := rawPeer(t, addr.String())
	defer idle.Close()
	stalled := rawPeer(t, addr.String())
	defer stalled.Close()
	h := make([]byte, HeaderSize)
	putHeader(h, header{kind: KindSend, flags: FlagFirst | FlagLast, length: 4096, id: 1})
	stalled.Write(append(h, 1, 2, 3)) // header plus 3 of 4096 bytes, then nothing

	select {
	case err := <-col.closed:
		if !errors.Is(err, ErrStalled) {
			t.Fatalf("closed for %v, want ErrStalled", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("stalled connection still open")
	}
	// The idle one is still served.
	putHeader(h, header{kind: KindSend, flags: FlagFirst | FlagLast, length: 2, id: 9})
	idle.Write(append(h, 'h', 'i'))
	select {
	case id := <-col.done:
		if id != 9 {
			t.Fatalf("got message %d", id)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("idle connection was closed")
	}
}

// TestSendLater: a queued message goes out with the next send, ahead of
// it, or on its own within the delay when nothing else is sent.
func TestSendLater(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		col := newCollector()
		_, _, pc := pair(t, Options{transport: tr, MTU: MinMTU, Quota: 8}, col)
		next := func() uint64 {
			select {
			case id := <-col.done:
				return id
			case <-time.After(5 * time.Second):
				t.Fatal("no message")
				return 0
			}
		}
		// Alone: delivered by the timer.
		if err := pc.SendLater(1, []byte("later")); err != nil {
			t.Fatal(err)
		}
		if id := next(); id != 1 {
			t.Fatalf("got %d", id)
		}
		// Queued twice, then a send: the order holds.
		pc.SendLater(2, []byte("a"))
		pc.SendLater(3, []byte("b"))
		if err := pc.SendPacket(4, []byte("now"), []byte("!")); err != nil {
			t.Fatal(err)
		}
		for _, want := range []uint64{2, 3, 4} {
			if id := next(); id != want {
				t.Fatalf("got message %d, want %d", id, want)
			}
		}
		col.mu.Lock()
		got := string(col.hdrs[3]) + string(col.hdrs[4])
		col.mu.Unlock()
		if got != "bnow!" {
			t.Fatalf("contents %q", got)
		}
		if err := pc.SendLater(5, make([]byte, MinMTU+1)); err == nil {
			t.Fatal("a message over the MTU was queued")
		}
	})
}
