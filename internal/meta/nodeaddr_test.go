package meta

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

func TestReachableAddr(t *testing.T) {
	for _, tc := range []struct {
		addr, remote, want string
		bad                bool
	}{
		{addr: "0.0.0.0:7701", remote: "10.1.2.3:50000", want: "10.1.2.3:7701"},
		{addr: "[::]:7701", remote: "[fd00::5]:50000", want: "[fd00::5]:7701"},
		{addr: "[::]:7701", remote: "10.1.2.3:50000", want: "10.1.2.3:7701"},
		{addr: "[::]:7701", remote: "[::ffff:10.1.2.3]:50000", want: "10.1.2.3:7701"},
		{addr: ":7701", remote: "127.0.0.1:50000", want: "127.0.0.1:7701"},
		{addr: "10.9.9.9:7701", remote: "10.1.2.3:50000", want: "10.9.9.9:7701"}, // --advertise wins
		{addr: "node3.example:7701", remote: "10.1.2.3:50000", want: "node3.example:7701"},
		{addr: "0.0.0.0:7701", remote: "", bad: true},
		{addr: "0.0.0.0:7701", remote: "0.0.0.0:50000", bad: true},
		{addr: "0.0.0.0", remote: "10.1.2.3:50000", bad: true},
		{addr: strings.Repeat("a", 300) + ":1", remote: "10.1.2.3:50000", bad: true},
	} {
		got, err := reachableAddr(tc.addr, tc.remote)
		switch {
		case tc.bad && !metaapi.IsCode(err, metaapi.EINVAL):
			t.Errorf("reachableAddr(%q, %q) = %q, %v; want EINVAL", tc.addr, tc.remote, got, err)
		case !tc.bad && (err != nil || got != tc.want):
			t.Errorf("reachableAddr(%q, %q) = %q, %v; want %q", tc.addr, tc.remote, got, err, tc.want)
		}
	}
}

// TestRegisterEveryInterface: a node registering an unspecified address
// over HTTP is recorded at the address its call came from, heartbeats
// keep it there, and a node meta cannot reach is refused with the
// address named and nothing recorded.
func TestRegisterEveryInterface(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.ProbeNodeAddr = DialProbe(5 * time.Second) })
	srv := tlsServer(t, f, f.s.Handler())
	ctx := context.Background()
	node, id := joinedClient(t, f, srv)

	// Nothing listens on a closed listener's port: meta cannot reach it.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, gonePort, _ := net.SplitHostPort(gone.Addr().String())
	gone.Close()
	err = node.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id, Addr: "0.0.0.0:" + gonePort}, nil)
	if !metaapi.IsCode(err, metaapi.EINVAL) || !strings.Contains(err.Error(), "127.0.0.1:"+gonePort) {
		t.Fatalf("register of an unreachable address: %v; want EINVAL naming 127.0.0.1:%s", err, gonePort)
	}
	if st, err := f.s.Status(); err != nil || len(st.Nodes) != 0 {
		t.Fatalf("after a refused registration: %+v, %v; want no node", st.Nodes, err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if err := node.Call(ctx, metaapi.OpRegister, metaapi.RegisterReq{ID: id, Addr: "0.0.0.0:" + port}, nil); err != nil {
		t.Fatalf("register 0.0.0.0:%s: %v", port, err)
	}
	want := "127.0.0.1:" + port
	var hb metaapi.HeartbeatResp
	if err := node.Call(ctx, metaapi.OpHeartbeat, metaapi.HeartbeatReq{ID: id, Addr: "[::]:" + port}, &hb); err != nil {
		t.Fatal(err)
	}
	if len(hb.Nodes) != 1 || hb.Nodes[0].Addr != want {
		t.Fatalf("cluster map after registering 0.0.0.0:%s: %+v; want the node at %s", port, hb.Nodes, want)
	}
	st, err := f.s.Status()
	if err != nil || len(st.Nodes) != 1 || st.Nodes[0].Addr != want {
		t.Fatalf("status: %+v, %v; want the node at %s", st.Nodes, err, want)
	}
}

// TestHeartbeatAddrProbed: a node listening on every interface is
// re-addressed by each heartbeat from where the call came; a heartbeat
// from a source meta cannot reach the node at (a second interface, a
// route through NAT) keeps the address meta probed rather than putting
// an unreachable one in every layout — and the node stays up.
func TestHeartbeatAddrProbed(t *testing.T) {
	var probed []string
	f := newFixture(t, func(o *Options) {
		o.ProbeNodeAddr = func(addr string) error {
			probed = append(probed, addr)
			if strings.HasPrefix(addr, "10.0.0.2:") {
				return errors.New("no route to host")
			}
			return nil
		}
	})
	r, err := f.s.registerFrom(metaapi.RegisterReq{Addr: "0.0.0.0:7001", Capacity: 1 << 40, Free: 1 << 40}, "10.0.0.1:40000")
	if err != nil {
		t.Fatal(err)
	}
	addrOf := func() string {
		st, err := f.s.Status()
		if err != nil || len(st.Nodes) != 1 {
			t.Fatalf("status: %+v, %v", st.Nodes, err)
		}
		return st.Nodes[0].Addr
	}
	hb := metaapi.HeartbeatReq{ID: r.ID, Addr: "0.0.0.0:7001", Capacity: 1 << 40, Free: 1 << 40}
	if _, err := f.s.heartbeatFrom(hb, "10.0.0.2:40001"); err != nil {
		t.Fatalf("heartbeat from an unreachable source: %v", err)
	}
	if got := addrOf(); got != "10.0.0.1:7001" {
		t.Fatalf("after a heartbeat from 10.0.0.2 (unreachable): node at %s (probed %v), want 10.0.0.1:7001 kept", got, probed)
	}
	if _, err := f.s.heartbeatFrom(hb, "10.0.0.3:40002"); err != nil {
		t.Fatal(err)
	}
	if got := addrOf(); got != "10.0.0.3:7001" {
		t.Fatalf("after a heartbeat from 10.0.0.3 (reachable): node at %s, want it moved there", got)
	}
	n := len(probed)
	if _, err := f.s.heartbeatFrom(hb, "10.0.0.3:40003"); err != nil {
		t.Fatal(err)
	}
	if len(probed) != n {
		t.Fatalf("a heartbeat at the recorded address probed it again: %v", probed)
	}
}
