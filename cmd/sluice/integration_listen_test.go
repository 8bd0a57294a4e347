package main

import (
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// freePort returns a TCP port nothing listens on at host just now.
func freePort(t *testing.T, host string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

// TestNodeEveryInterface: a node listening on every interface without
// --advertise is registered at the address meta saw it call from, with
// its own port, and serves there; a node that advertises an address
// nothing answers at is refused, at its first start and at a restart,
// with the address named, and exits.
func TestNodeEveryInterface(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	n := c.startNode(t, "n1", "--listen", "0.0.0.0:0")
	host, port, _ := net.SplitHostPort(n.addr)
	if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
		t.Fatalf("node says it listens on %s, want every interface", n.addr)
	}
	st := waitNodesUp(t, c.conf, 1, 15*time.Second)
	if want := "127.0.0.1:" + port; st.Nodes[0].Addr != want {
		t.Fatalf("status lists the node at %s, want %s (where meta saw it from, its own port)", st.Nodes[0].Addr, want)
	}
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "1")
	data := randomBytes(t, 1<<20)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")
	if got := mustRun(t, c.conf, nil, "get", "/f", "-").stdout; !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%s), want %d (%s)", len(got), sum(got), len(data), sum(data))
	}

	// A new node advertising an address nothing listens at.
	dead := "127.0.0.1:" + freePort(t, "127.0.0.1")
	d2 := filepath.Join(dir, "n2")
	args := append([]string{"--log-level", "error", "node", "--data", d2, "--meta", c.meta, "--advertise", dead}, c.joinArgs(t, d2)...)
	mustFail(t, c.conf, []string{`meta cannot reach this node at ` + dead, `--advertise`}, args...)

	// The first node restarted with such an address.
	if code := n.proc.stop(t, 20*time.Second); code != 0 {
		t.Fatalf("node exited %d on SIGTERM", code)
	}
	mustFail(t, c.conf, []string{`meta cannot reach this node at ` + dead},
		"--log-level", "error", "node", "--data", n.dir, "--meta", c.meta, "--advertise", dead)
	if st := status(t, c.conf); len(st.Nodes) != 1 || st.Nodes[0].Addr != "127.0.0.1:"+port {
		t.Fatalf("after the refusals status lists %+v; want only the first node, at 127.0.0.1:%s", st.Nodes, port)
	}
}

// TestUpNodeListen: `sluice up --node-listen` puts the nodes on the host
// it names, on ports the system picks or on consecutive ones from a
// base, and on every interface they are registered where meta reaches
// them; a bad value is refused before anything starts.
func TestUpNodeListen(t *testing.T) {
	base := baseDir(t)
	check := func(c *upCluster, want func(i int, addr string) bool, what string) {
		t.Helper()
		st := waitNodesUp(t, c.conf, len(c.nodes), 20*time.Second)
		for i, nd := range st.Nodes {
			if !want(i, nd.Addr) {
				t.Errorf("node %v registered at %s, want %s", nd.ID, nd.Addr, what)
			}
		}
		mustRun(t, c.conf, bytes.NewReader([]byte("x")), "put", "-", "/x")
		c.proc.stop(t, 20*time.Second)
	}
	c := startUp(t, filepath.Join(base, "a"), 3, "--node-listen", "127.0.0.2")
	check(c, func(_ int, a string) bool { return strings.HasPrefix(a, "127.0.0.2:") }, "127.0.0.2:*")

	port, _ := strconv.Atoi(freePort(t, "127.0.0.3"))
	c = startUp(t, filepath.Join(base, "b"), 3, "--node-listen", fmt.Sprintf("127.0.0.3:%d", port))
	check(c, func(i int, a string) bool { return a == fmt.Sprintf("127.0.0.3:%d", port+i) }, fmt.Sprintf("127.0.0.3:%d and on", port))

	c = startUp(t, filepath.Join(base, "c"), 2, "--node-listen", "0.0.0.0")
	check(c, func(_ int, a string) bool { return strings.HasPrefix(a, "127.0.0.1:") }, "127.0.0.1:*")

	mustFail(t, "", []string{`node listen address "127.0.0.2:x"`}, "up", "--data", filepath.Join(base, "d"), "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.2:x")
}

// TestBenchNodeListen: `sluice bench --node-listen` starts the nodes of
// its clusters there: on 127.0.0.2 an experiment runs; on an address of
// no interface of this host the nodes cannot listen and the run fails
// saying so.
func TestBenchNodeListen(t *testing.T) {
	out := filepath.Join(t.TempDir(), "results")
	mustRun(t, "", nil, "bench", "--quick", "--reps", "1", "--warmup", "0", "--link", "none", "--out", out, "--node-listen", "127.0.0.2", "table-fill")
	if rows := readCSV(t, filepath.Join(out, "table-fill.csv")); len(rows) < 2 {
		t.Fatalf("table-fill.csv: %d rows", len(rows))
	}
	r := run(t, "", nil, "bench", "--quick", "--reps", "1", "--warmup", "0", "--link", "none", "--out", out, "--node-listen", "192.0.2.1", "table-fill")
	if r.code == 0 || !strings.Contains(r.stderr, "192.0.2.1") {
		t.Fatalf("bench with nodes on 192.0.2.1 (no interface here): %s", r)
	}
}
