package connlimit

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"
)

func tcp(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

// TestAdmit: one host gets at most perHost slots, others still get theirs
// until the total is reached, and a release (even repeated) frees one slot.
func TestAdmit(t *testing.T) {
	l := New(5, 2)
	var rel []func()
	for i := range 2 {
		r, err := l.Admit(tcp("10.0.0.1:1000"))
		if err != nil {
			t.Fatalf("connection %d from one host: %v", i, err)
		}
		rel = append(rel, r)
	}
	_, err := l.Admit(tcp("10.0.0.1:1002"))
	var ref *Refused
	if !errors.As(err, &ref) || !ref.PerHost || ref.Limit != 2 {
		t.Fatalf("third from one host: %v, want a per-host refusal", err)
	}
	if !ref.Report {
		t.Fatal("the first refusal is not reported")
	}
	if _, err := l.Admit(tcp("10.0.0.1:1003")); !errors.As(err, &ref) || ref.Report {
		t.Fatalf("a second refusal within a second is reported: %+v", err)
	}
	for i := range 3 {
		if _, err := l.Admit(tcp("10.0.0.2:1000")); i < 2 && err != nil {
			t.Fatalf("another host refused: %v", err)
		} else if i == 2 && err == nil {
			t.Fatal("a third from the second host admitted")
		}
	}
	if _, err := l.Admit(tcp("10.0.0.3:1")); err != nil {
		t.Fatalf("fifth slot: %v", err)
	}
	if _, err := l.Admit(tcp("10.0.0.4:1")); !errors.As(err, &ref) || ref.PerHost || ref.Limit != 5 {
		t.Fatalf("past the total: %v, want a total refusal", err)
	}
	rel[0]()
	rel[0]() // no double release
	if total, host := l.Counts(Host(tcp("10.0.0.1:1"))); total != 4 || host != 1 {
		t.Fatalf("after a release: total %d, host %d; want 4, 1", total, host)
	}
	if _, err := l.Admit(tcp("10.0.0.1:1004")); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// TestHost: IPv4 by address (mapped or not), IPv6 by /64.
func TestHost(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"192.0.2.1:1", "[::ffff:192.0.2.1]:2"},
		{"[2001:db8::1]:1", "[2001:db8::ffff:2]:2"},
	} {
		if Host(tcp(c.a)) != Host(tcp(c.b)) {
			t.Errorf("%s and %s counted apart", c.a, c.b)
		}
	}
	if Host(tcp("192.0.2.1:1")) == Host(tcp("192.0.2.2:1")) {
		t.Error("two IPv4 hosts counted together")
	}
	if Host(tcp("[2001:db8::1]:1")) == Host(tcp("[2001:db8:0:1::1]:1")) {
		t.Error("two IPv6 /64s counted together")
	}
}

// TestListener: past the per-host bound a real connection is closed at
// once, and closing an admitted one lets the next in.
func TestListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewListener(inner, New(0, 1), slog.New(slog.DiscardHandler), "test")
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	a, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sa := <-accepted
	b, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := b.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection past the bound was not closed")
	}
	sa.Close()
	if _, err := a.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("admitted connection: %v after the server closed it", err)
	}
	c, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case sc := <-accepted:
		sc.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("closing the admitted connection freed no slot")
	}
}

// TestPeersPastTheTotal: strangers from many hosts fill every slot; a
// cluster member's host is still admitted (up to its own host's bound),
// and a stranger, or a host no longer a member, is not.
func TestPeersPastTheTotal(t *testing.T) {
	l := New(4, 3)
	l.SetPeers([]string{"10.0.9.9:7701", "node.example:7701"})
	for i, a := range []string{"10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1", "10.0.0.2:2"} {
		if _, err := l.Admit(tcp(a)); err != nil {
			t.Fatalf("stranger %d: %v", i, err)
		}
	}
	if _, err := l.Admit(tcp("10.0.0.3:1")); err == nil {
		t.Fatal("a stranger past the total was admitted")
	}
	var rel []func()
	for i := range 3 {
		r, err := l.Admit(tcp("10.0.9.9:5000"))
		if err != nil {
			t.Fatalf("peer connection %d with every slot taken: %v", i, err)
		}
		rel = append(rel, r)
	}
	var ref *Refused
	if _, err := l.Admit(tcp("10.0.9.9:5001")); !errors.As(err, &ref) || !ref.PerHost {
		t.Fatalf("a peer past its host's bound: %v, want a per-host refusal", err)
	}
	l.SetPeers(nil)
	rel[0]()
	if _, err := l.Admit(tcp("10.0.9.9:5002")); !errors.As(err, &ref) || ref.PerHost {
		t.Fatalf("a former peer with every slot taken: %v, want refused for the total", err)
	}
}
