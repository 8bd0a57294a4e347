package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/jointoken"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/pki"
)

// waitExit waits for a process that must give up by itself and returns
// its stderr; it fails the test if it exited 0.
func waitExit(t *testing.T, p *proc, what string) string {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: still running after 20 s: %s", what, tail(p.stderrText(), 3))
	}
	if code := p.cmd.ProcessState.ExitCode(); code == 0 {
		t.Errorf("%s: exited 0", what)
	}
	return p.stderrText()
}

// TestJoinAndTLS runs meta and nodes as processes: nodes join with
// one-time tokens and the cluster works end to end over TLS; a reused,
// expired, forged or foreign token, a node of another cluster, plain
// HTTP to meta's port and a client config with another cluster's CA are
// each refused with a clear message and change nothing.
func TestJoinAndTLS(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	data := randomBytes(t, 3<<20)
	src := filepath.Join(dir, "src")
	os.WriteFile(src, data, 0o600)
	mustRun(t, c.conf, nil, "put", src, "/f")
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; sum(got) != sum(data) {
		t.Fatalf("read back %d bytes, not what was written", len(got))
	}
	// Each node's credentials are private and its certificate names it.
	for id, n := range c.nodes {
		for _, f := range []string{"node.key", "node.crt", "ca.crt", "capkeys.json"} {
			fi, err := os.Stat(filepath.Join(n.dir, f))
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("node %v: %s: %v %v", id, f, fi, err)
			}
		}
		raw, _ := os.ReadFile(filepath.Join(n.dir, "node.crt"))
		cert, err := pki.ParseCert(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := pki.NodeID(cert); err != nil || got != id {
			t.Errorf("node %v's certificate names %v (%v)", id, got, err)
		}
	}
	for _, f := range []string{"ca.key", "ca.crt"} {
		if fi, err := os.Stat(filepath.Join(dir, "meta", f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("meta's %s: %v %v", f, fi, err)
		}
	}
	before := status(t, c.conf)
	startBad := func(name, token string) string {
		t.Helper()
		p := startProc(t, dir, name, "node", "--data", filepath.Join(dir, name), "--meta", c.meta, "--listen", "127.0.0.1:0", "--join", token)
		msg := waitExit(t, p, name)
		if out := p.out.snapshot(); len(out) != 0 {
			t.Errorf("%s: refused node printed %q", name, out)
		}
		if _, err := os.Stat(filepath.Join(dir, name, "node.json")); err == nil {
			t.Errorf("%s: refused node kept an identity", name)
		}
		return msg
	}

	// A token used once does not join a second node.
	used := strings.TrimSpace(string(mustRun(t, c.conf, nil, "join-token").stdout))
	p := startDaemon(t, dir, "n4", "node", "--data", filepath.Join(dir, "n4"), "--meta", c.meta, "--listen", "127.0.0.1:0", "--join", used)
	p.waitReady(t, 20*time.Second)
	waitNodesUp(t, c.conf, 4, 15*time.Second)
	before = status(t, c.conf)
	if msg := startBad("reused", used); !strings.Contains(msg, "already used") || strings.Contains(msg, "client config") {
		t.Errorf("reused token: %q", tail(msg, 2))
	}
	// An expired one.
	short := strings.TrimSpace(string(mustRun(t, c.conf, nil, "join-token", "--ttl", "1s").stdout))
	time.Sleep(1500 * time.Millisecond) // meta's clock must pass the expiry
	if msg := startBad("expired", short); !strings.Contains(msg, "expired") {
		t.Errorf("expired token: %q", tail(msg, 2))
	}
	// A forged one: the right CA pin, an id and secret of its own.
	pin, _ := jointoken.Parse(used)
	forged, _ := jointoken.New(pin.Pin)
	if msg := startBad("forged", forged.String()); !strings.Contains(msg, "not issued by this cluster") {
		t.Errorf("forged token: %q", tail(msg, 2))
	}
	if msg := startBad("malformed", "SJ1-nonsense"); !strings.Contains(msg, "not a join token") {
		t.Errorf("malformed token: %q", tail(msg, 2))
	}
	if r := run(t, c.conf, nil, "node", "--data", filepath.Join(dir, "none"), "--meta", c.meta); r.code == 0 || !strings.Contains(r.stderr, "--join") {
		t.Errorf("new node without a token: %s", r)
	}

	// Another cluster: its token names its CA, so a node given it and
	// this meta's address refuses this meta before sending the token; a
	// node of that cluster pointed here is refused; its client config
	// does not trust this meta.
	other := startMeta(t, baseDir(t))
	foreign := strings.TrimSpace(string(mustRun(t, other.conf, nil, "join-token").stdout))
	if msg := startBad("foreign-token", foreign); !strings.Contains(msg, "does not present the cluster CA the join token pins") {
		t.Errorf("token of another cluster: %q", tail(msg, 2))
	}
	on := other.startNode(t, "o1")
	waitNodesUp(t, other.conf, 1, 15*time.Second)
	on.proc.stop(t, 10*time.Second)
	p = startProc(t, dir, "o1-here", "node", "--data", on.dir, "--meta", c.meta, "--listen", "127.0.0.1:0")
	if msg := waitExit(t, p, "node of another cluster"); !strings.Contains(msg, "not signed by the cluster CA") {
		t.Errorf("node of another cluster: %q", tail(msg, 2))
	}
	cc, _ := config.Load(c.conf)
	oc, _ := config.Load(other.conf)
	cc.CA = oc.CA
	wrongCA := filepath.Join(dir, "wrong-ca.conf")
	if err := config.Save(wrongCA, cc); err != nil {
		t.Fatal(err)
	}
	mustFail(t, wrongCA, []string{`TLS`, `not signed by the cluster CA`}, "status")

	// Plain HTTP to meta's TLS port: a clear refusal.
	resp, err := http.Post("http://"+c.meta+"/v1/Status", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTP request to an HTTPS server") {
		t.Errorf("plain HTTP to meta: %d %q", resp.StatusCode, body)
	}

	// A node that lost its credentials (or predates TLS) keeps its id
	// and data by joining again with a token for its id.
	var old *nodeProc
	for _, n := range c.nodes {
		if old == nil || n.id < old.id {
			old = n
		}
	}
	old.proc.stop(t, 10*time.Second)
	for _, f := range []string{"node.key", "node.crt", "ca.crt", "cluster.secret"} {
		os.Remove(filepath.Join(old.dir, f))
	}
	r := run(t, c.conf, nil, "node", "--data", old.dir, "--meta", c.meta, "--listen", "127.0.0.1:0")
	if want := "join-token --node " + old.id.String(); r.code == 0 || !strings.Contains(r.stderr, want) {
		t.Errorf("node without its credentials: %s, want a hint %q", r, want)
	}
	if again := c.startNodeIn(t, "again", old.dir); again.id != old.id {
		t.Fatalf("node %v joined again as %v", old.id, again.id)
	}
	waitNodesUp(t, c.conf, 4, 15*time.Second)
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; sum(got) != sum(data) {
		t.Fatalf("after a node joined again, read back differs")
	}

	after := status(t, c.conf)
	if a, b := nodeIDs(after), nodeIDs(before); a != b || len(after.Nodes) != 4 {
		t.Errorf("refusals changed the cluster's nodes: %s -> %s", b, a)
	}
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; sum(got) != sum(data) {
		t.Fatalf("after the refusals, read back differs")
	}
}

func nodeIDs(st metaapi.StatusResp) string {
	var out []string
	for _, n := range st.Nodes {
		out = append(out, n.ID.String())
	}
	return strings.Join(out, ",")
}

// TestFabricTLSProcesses: nodes started with --fabric-tls serve clients
// and each other over TLS; a client without it is refused with a hint.
func TestFabricTLSProcesses(t *testing.T) {
	c := threeNodes(t, nil, []string{"--fabric-tls"})
	dir := c.dir
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	data := randomBytes(t, 5<<20)
	src := filepath.Join(dir, "src")
	os.WriteFile(src, data, 0o600)
	mustRun(t, c.conf, nil, "--fabric-tls", "put", src, "/f")
	if got := mustRun(t, c.conf, nil, "--fabric-tls", "cat", "/f").stdout; sum(got) != sum(data) {
		t.Fatalf("read back over TLS differs")
	}
	for id, n := range c.nodes {
		if h := chunkFiles(t, filepath.Join(n.dir, "store", "chunks")); len(h) == 0 {
			t.Errorf("node %v holds no chunk: the replicas were not forwarded", id)
		}
	}
	mustFail(t, c.conf, []string{`--fabric-tls`}, "cat", "/f")
}
