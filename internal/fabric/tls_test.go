package fabric

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/pki"
)

// tlsNode returns fabric TLS options for a node with id, of the CA in dir.
func tlsNode(t testing.TB, ca *pki.CA, id ids.NodeID) *tls.Config {
	t.Helper()
	keyPEM, csrDER, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CheckCSR(csrDER)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.SignNode(csr, id)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := pki.FabricServerConfig(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func newCA(t testing.TB) *pki.CA {
	ca, err := pki.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// dialAs dials srv expecting node want.
func dialAs(t testing.TB, ca *pki.CA, addr string, want ids.NodeID) (*Conn, error) {
	cli, err := NewEndpoint(Options{DialTLS: func(string) (*tls.Config, error) { return pki.FabricDialConfig(ca.Pool(), want), nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli.Dial(context.Background(), addr, discard{})
}

func TestTLSMessages(t *testing.T) {
	ca := newCA(t)
	col := newCollector()
	srv, err := NewEndpoint(Options{ServerTLS: tlsNode(t, ca, 7)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, _ := srv.Listen("127.0.0.1:0", col)
	cli, _ := NewEndpoint(Options{DialTLS: func(string) (*tls.Config, error) { return pki.FabricDialConfig(ca.Pool(), 7), nil }})
	defer cli.Close()
	pc, err := NewPool(cli, 1).Get(context.Background(), addr.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{0, 1, 100, DefaultMTU, 3*DefaultMTU + 17, 4 << 20} {
		data := bytes.Repeat([]byte{byte(n)}, n)
		id := pc.NewID()
		var parts [][]byte
		if n > 0 {
			parts = [][]byte{data}
		}
		if err := pc.Send(id, []byte("hdr"), parts...); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-col.done:
			col.mu.Lock()
			ok := got == id && bytes.Equal(col.msgs[id].Bytes(), data) && string(col.hdrs[id]) == "hdr"
			col.mu.Unlock()
			if !ok {
				t.Fatalf("message of %d bytes arrived changed", n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("message of %d bytes: timed out", n)
		}
	}
}

// TestTLSRefusals: a dialler expecting another node, a plain peer of a
// TLS node, a TLS peer of a plain node, another CA's node, and garbage
// each fail the connection with a clear error; the node serves on.
func TestTLSRefusals(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	srv, err := NewEndpoint(Options{ServerTLS: tlsNode(t, ca, 2), HandshakeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, _ := srv.Listen("127.0.0.1:0", discard{})
	a := addr.String()

	if _, err := dialAs(t, ca, a, 3); err == nil || !strings.Contains(err.Error(), "not [n3]") {
		t.Errorf("node 2 accepted as node 3: %v", err)
	}
	if _, err := dialAs(t, other, a, 2); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("another CA's trust accepted node 2: %v", err)
	}
	plain, _ := NewEndpoint(Options{HandshakeTimeout: 2 * time.Second})
	defer plain.Close()
	if _, err := plain.Dial(context.Background(), a, discard{}); err == nil || !strings.Contains(err.Error(), "--fabric-tls") {
		t.Errorf("plain dial of a TLS node: %v", err)
	}
	plainAddr, _ := plain.Listen("127.0.0.1:0", discard{})
	if _, err := dialAs(t, ca, plainAddr.String(), 2); err == nil || !strings.Contains(err.Error(), "does not speak TLS") {
		t.Errorf("TLS dial of a plain node: %v", err)
	}
	// A node of another cluster posing as node 2.
	imp, _ := NewEndpoint(Options{ServerTLS: tlsNode(t, other, 2)})
	defer imp.Close()
	impAddr, _ := imp.Listen("127.0.0.1:0", discard{})
	if _, err := dialAs(t, ca, impAddr.String(), 2); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("another cluster's node 2 accepted: %v", err)
	}
	for _, garbage := range [][]byte{[]byte("SLF\x01garbage"), {0x16, 0x03, 0x01, 0xff, 0xff, 1}, make([]byte, 70000)} {
		nc, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		nc.Write(garbage)
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		io.ReadAll(nc) // the node hangs up (after an alert, perhaps)
		nc.Close()
	}
	if _, err := dialAs(t, ca, a, 2); err != nil {
		t.Fatalf("the node after refusals: %v", err)
	}
	// Refused connections leave nothing behind (the server finishes its
	// side of each a moment after the dialler has given up or gone on).
	var n, held int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		srv.mu.Lock()
		n = len(srv.conns)
		srv.mu.Unlock()
		held, _ = srv.admit.Counts(netip.Prefix{})
		if n == 1 && held == 1 {
			return
		}
	}
	t.Errorf("after refusals: %d connections, %d admitted; want 1, 1", n, held)
}

// BenchmarkSendTLS sends 4 MiB messages over one connection, plain and
// with TLS (--fabric-tls), in the same run: the cost of encryption on
// the fabric's stream.
func BenchmarkSendTLS(b *testing.B) {
	ca := newCA(b)
	for _, on := range []bool{false, true} {
		name := "plain"
		var so, co Options
		if on {
			name = "tls"
			so.ServerTLS = tlsNode(b, ca, 1)
			co.DialTLS = func(string) (*tls.Config, error) { return pki.FabricDialConfig(ca.Pool(), 1), nil }
		}
		b.Run(name, func(b *testing.B) {
			srv, err := NewEndpoint(so)
			if err != nil {
				b.Fatal(err)
			}
			addr, _ := srv.Listen("127.0.0.1:0", discard{})
			cli, _ := NewEndpoint(co)
			pc, err := NewPool(cli, 1).Get(context.Background(), addr.String())
			if err != nil {
				b.Fatal(err)
			}
			defer func() { cli.Close(); srv.Close() }()
			data := make([]byte, 4<<20)
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := pc.Send(pc.NewID(), []byte("h"), data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
