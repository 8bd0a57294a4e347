package oncrpc

import (
	"context"
	"net"
	"os"
	"testing"
)

// TestDialReserved: as root, DialTCP binds a port from 512 to 1023 (the
// server sees it), many times over; ResvNone binds an ordinary port.
func TestDialReserved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding a reserved port needs root")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ports := make(chan int, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ports <- c.RemoteAddr().(*net.TCPAddr).Port
			c.Close()
		}
	}()
	ctx := context.Background()
	for i := range 50 {
		nc, err := DialTCP(ctx, "tcp", ln.Addr().String(), ResvRequired)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if p := <-ports; p < resvLow || p > resvHigh {
			t.Fatalf("dial %d: source port %d", i, p)
		}
		// The server closes first, so TIME_WAIT holds its side, not a
		// reserved port other tests' clients may need.
		nc.Read(make([]byte, 1))
		nc.Close()
	}
	nc, err := DialTCP(ctx, "tcp", ln.Addr().String(), ResvNone)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if p := <-ports; p < 1024 {
		t.Fatalf("ResvNone: source port %d", p)
	}
}
