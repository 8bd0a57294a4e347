package fabric

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	for in, want := range map[string]float64{
		"10Gbit": 1.25e9, "10Gbit/s": 1.25e9, "10Gbps": 1.25e9, "1.25GB/s": 1.25e9, "800MB/s": 8e8,
		"100Mbit": 12.5e6, "4096": 4096, " 1 Tbit ": 1.25e11,
	} {
		got, err := ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "fast", "10 furlongs", "-5MB", "Gbit"} {
		if _, err := ParseRate(bad); err == nil {
			t.Errorf("ParseRate(%q) accepted", bad)
		}
	}
	if s := FormatRate(1.25e9); s != "10 Gbit/s" {
		t.Errorf("FormatRate = %q", s)
	}
	for _, tc := range []struct {
		rate  float64
		delay time.Duration
		ok    bool
	}{{0, 0, true}, {1.25e9, 5 * time.Microsecond, true}, {10, 0, false}, {1e13, 0, false}, {1e9, -time.Second, false}, {1e9, 2 * time.Second, false}} {
		if _, err := NewLink(tc.rate, tc.delay); (err == nil) != tc.ok {
			t.Errorf("NewLink(%v, %v): %v", tc.rate, tc.delay, err)
		}
	}
}

// emulatedPair connects two endpoints that both send through links.
func emulatedPair(t *testing.T, rate float64, delay time.Duration, h Handler) (*PeerConn, *Link) {
	t.Helper()
	l, err := NewLink(rate, delay)
	if err != nil {
		t.Fatal(err)
	}
	l2, _ := NewLink(rate, delay)
	srv, _ := NewEndpoint(Options{Link: l2})
	addr, _ := srv.Listen("127.0.0.1:0", h)
	cli, _ := NewEndpoint(Options{Link: l})
	pc, err := NewPool(cli, 4).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close(); srv.Close() })
	return pc, l
}

// TestLinkRateIsNeverExceeded: data cannot cross an emulated link faster
// than its rate (a lower bound on time, so it cannot flake).
func TestLinkRateIsNeverExceeded(t *testing.T) {
	col := newCollector()
	pc, _ := emulatedPair(t, 100e6, 0, col) // 800 Mbit/s
	const n = 8 << 20
	start := time.Now()
	if err := pc.Send(pc.NewID(), []byte("h"), make([]byte, n)); err != nil {
		t.Fatal(err)
	}
	<-col.done
	if el, min := time.Since(start), time.Duration(float64(n)/100e6*float64(time.Second)); el < min*95/100 {
		t.Fatalf("%d bytes crossed a 100 MB/s link in %s, faster than %s", n, el, min)
	}
}

// TestLinkDelayIsApplied: a round trip takes at least twice the one-way
// delay.
func TestLinkDelayIsApplied(t *testing.T) {
	srvDone := make(chan struct{})
	echo := &echoHandler{done: srvDone}
	pc, _ := emulatedPair(t, 0, 20*time.Millisecond, echo)
	id := pc.NewID()
	ch := pc.Replies.Expect(id)
	start := time.Now()
	pc.Send(id, []byte("ping"))
	p := <-ch
	p.Release()
	if rtt := time.Since(start); rtt < 40*time.Millisecond {
		t.Fatalf("round trip %s over a link with 20ms one-way delay", rtt)
	}
}

type echoHandler struct{ done chan struct{} }

func (e *echoHandler) HandlePacket(p *Packet) {
	p.Conn.Post(p.ID, []byte("pong"))
	p.Release()
}
func (e *echoHandler) Closed(*Conn, error) {}

// TestSharedLinkSplitsBandwidth: two connections through one link share
// its rate, as two flows through one NIC do.
func TestSharedLinkSplitsBandwidth(t *testing.T) {
	l, _ := NewLink(100e6, 0)
	srv, _ := NewEndpoint(Options{})
	col := newCollector()
	addr, _ := srv.Listen("127.0.0.1:0", col)
	cli, _ := NewEndpoint(Options{Link: l})
	defer func() { cli.Close(); srv.Close() }()
	pool := NewPool(cli, 4)
	const n = 4 << 20
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		pc, err := pool.Get(context.Background(), addr.String())
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		id := uint64(100 + i) // distinct across the two connections
		go func() {
			defer wg.Done()
			pc.Send(id, []byte("h"), make([]byte, n))
		}()
	}
	wg.Wait()
	<-col.done
	<-col.done
	if el, min := time.Since(start), time.Duration(float64(2*n)/100e6*float64(time.Second)); el < min*95/100 {
		t.Fatalf("two flows of %d bytes through one 100 MB/s link took %s, less than %s", n, el, min)
	}
}
