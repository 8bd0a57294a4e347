package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/node"
)

// splitCluster is meta and storage nodes as separate processes.
type splitCluster struct {
	dir        string
	meta       string
	conf       string
	secretFile string
	metaProc   *proc
	nodes      map[ids.NodeID]*nodeProc
}

type nodeProc struct {
	id   ids.NodeID
	addr string // as printed: the fabric listen address
	dir  string
	proc *proc
}

// startMeta runs `sluice meta` with a short node timeout.
func startMeta(t *testing.T, dir string, extra ...string) *splitCluster {
	t.Helper()
	args := append([]string{"meta", "--data", filepath.Join(dir, "meta"), "--listen", "127.0.0.1:0", "--node-timeout", "2s"}, extra...)
	p := startDaemon(t, dir, "meta", args...)
	c := &splitCluster{dir: dir, metaProc: p, nodes: map[ids.NodeID]*nodeProc{}}
	r := p.waitReady(t, 20*time.Second)
	c.meta, c.secretFile, c.conf = r.Meta, r.Secret, r.Conf
	if want := filepath.Join(dir, "meta", "cluster.secret"); c.secretFile != want {
		t.Errorf("meta's ready file names secret file %s, want %s", c.secretFile, want)
	}
	// What meta prints for people says the same.
	if got := p.waitLine(t, reMetaListen, 5*time.Second)[1]; got != c.meta {
		t.Errorf("meta printed address %s, its ready file %s", got, c.meta)
	}
	if m := p.waitLine(t, reMetaConf, 5*time.Second); m[1] != c.secretFile || m[2] != c.conf {
		t.Errorf("meta printed secret file %s and client config %s, its ready file %s and %s", m[1], m[2], c.secretFile, c.conf)
	}
	return c
}

// joinArgs are the flags a node with data directory dir needs to join
// the cluster: a join token from `sluice join-token` (the operator's
// way) unless it has joined before.
func (c *splitCluster) joinArgs(t *testing.T, dir string) []string {
	t.Helper()
	joined, id := node.Joined(dir)
	if joined {
		return nil
	}
	args := []string{"join-token", "--ttl", "5m"}
	if id != 0 {
		args = append(args, "--node", id.String())
	}
	r := mustRun(t, c.conf, nil, args...)
	return []string{"--join", strings.TrimSpace(string(r.stdout))}
}

// startNode runs `sluice node` with data dir dir/name.
func (c *splitCluster) startNode(t *testing.T, name string, extra ...string) *nodeProc {
	t.Helper()
	return c.startNodeIn(t, name, filepath.Join(c.dir, name), extra...)
}

// startNodeIn runs `sluice node` with data dir dir (its log stays in the
// cluster's directory).
func (c *splitCluster) startNodeIn(t *testing.T, name, dir string, extra ...string) *nodeProc {
	t.Helper()
	args := append([]string{"node", "--data", dir, "--meta", c.meta, "--listen", "127.0.0.1:0"}, c.joinArgs(t, dir)...)
	args = append(args, extra...)
	p := startDaemon(t, c.dir, name, args...)
	r := p.waitReady(t, 20*time.Second)
	if len(r.Nodes) != 1 {
		t.Fatalf("%s's ready file names nodes %v, want itself", name, r.Nodes)
	}
	n := &nodeProc{id: nodeID(t, r.Nodes[0].ID), addr: r.Nodes[0].Addr, dir: dir, proc: p}
	if m := p.waitLine(t, reNodeListen, 5*time.Second); m[1] != r.Nodes[0].ID || m[2] != n.addr {
		t.Errorf("%s printed node %s at %s, its ready file %v", name, m[1], m[2], r.Nodes)
	}
	if old, ok := c.nodes[n.id]; ok && old.dir != dir {
		t.Fatalf("node id %v given to both %s and %s", n.id, old.dir, dir)
	}
	c.nodes[n.id] = n
	return n
}

// TestAcceptanceReplicatedPutSurvivesNodeKill is the acceptance
// test: meta and three nodes as separate processes, a 64 MiB file with
// three replicas, byte-identical chunk files on every node, kill -9 of a
// node, a byte-exact read back, and the node reported down.
func TestAcceptanceReplicatedPutSurvivesNodeKill(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	if len(c.nodes) != 3 {
		t.Fatalf("3 nodes started, %d distinct ids", len(c.nodes))
	}
	st := waitNodesUp(t, c.conf, 3, 15*time.Second)
	for _, n := range st.Nodes {
		if want := c.nodes[n.ID]; want == nil || n.Addr != want.addr {
			t.Errorf("status lists node %v at %s; started nodes: %v", n.ID, n.Addr, c.nodes)
		}
	}
	if st.MetaAddr != c.meta {
		t.Errorf("status meta_addr %q, meta printed %q", st.MetaAddr, c.meta)
	}

	mustRun(t, c.conf, nil, "mkdir", "/r3")
	mustRun(t, c.conf, nil, "policy", "set", "/r3", "--replicas", "3")
	if out := string(mustRun(t, c.conf, nil, "policy", "get", "/r3").stdout); !strings.Contains(out, "replicas=3") || !strings.Contains(out, "set here") {
		t.Errorf("policy get /r3: %q", out)
	}

	const size = 64 << 20
	data := randomBytes(t, size)
	src := filepath.Join(dir, "src.bin")
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	data = nil // compare by digest from here on; keep memory low
	want, _ := fileSum(t, src)

	start := time.Now()
	mustRun(t, c.conf, nil, "put", src, "/r3/big.bin")
	t.Logf("put 64 MiB with 3 replicas: %s", time.Since(start))

	if out := string(mustRun(t, c.conf, nil, "stat", "/r3/big.bin").stdout); !regexp.MustCompile(`(?m)^\s*Size: 67108864$`).MatchString(out) || !strings.Contains(out, "replicas=3") {
		t.Errorf("stat /r3/big.bin:\n%s", out)
	}

	// The chunk files on the three nodes: every node has the file's data,
	// byte-identical to the source.
	var names []string
	for id, n := range c.nodes {
		files := chunkFiles(t, n.dir)
		if len(files) == 0 {
			t.Errorf("node %v: no chunk files under %s", id, n.dir)
		}
		// A chunk file may be longer than the chunk (recycled files keep
		// stale bytes past the committed length); its first bytes are the
		// chunk.
		for name, p := range files {
			names = append(names, name)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if len(files) == 1 && (int64(len(b)) < size || sum(b[:size]) != want) {
				t.Errorf("node %v: chunk file %s (%d bytes) does not start with the source (%s)", id, p, len(b), want)
			}
		}
	}
	// With the default 64 MiB chunk size the file is one chunk, the same
	// chunk id on each node; compare the copies pairwise anyway.
	mc := metaClient(t, c.conf)
	dirs := map[ids.NodeID]string{}
	for id, n := range c.nodes {
		dirs[id] = n.dir
	}
	raw, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, mc, dirs, "/r3/big.bin", raw)
	raw = nil
	t.Logf("chunk files: %v", names)

	// Kill -9 the node holding the first replica of chunk 0 (the ring's
	// head; reads rotate over replicas so every copy serves some pieces).
	_, layout := layoutOf(t, mc, "/r3/big.bin")
	victim := c.nodes[layout[0].Replicas[0].Node]
	victim.proc.cmd.Process.Kill()
	<-victim.proc.done
	killedAt := time.Now()

	// Read it back at once, before meta has noticed: the client must fail
	// over to the surviving replicas.
	out := filepath.Join(dir, "back.bin")
	mustRun(t, c.conf, nil, "get", "/r3/big.bin", out)
	if got, n := fileSum(t, out); got != want || n != size {
		t.Fatalf("get after kill -9 of %v: %d bytes %s, want %d bytes %s", victim.id, n, got, size, want)
	}
	os.Remove(out)

	// Meta reports the node down within its 2 s timeout (+ sweep slack).
	eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		states := nodeStates(st)
		return states[victim.id] == metaapi.NodeDown && len(states) == 3 &&
				states[other(victim.id, c.nodes, 0)] == metaapi.NodeUp && states[other(victim.id, c.nodes, 1)] == metaapi.NodeUp,
			fmt.Sprintf("states %v, %s after the kill", states, time.Since(killedAt).Round(time.Millisecond))
	})
	t.Logf("node %v reported down %s after kill -9", victim.id, time.Since(killedAt).Round(10*time.Millisecond))

	// Still readable with meta knowing the node is down; written files
	// need 3 up nodes and are refused with a clear message.
	r := mustRun(t, c.conf, nil, "get", "/r3/big.bin", "-")
	if s := sum(r.stdout); s != want || len(r.stdout) != size {
		t.Errorf("get - with %v down: %d bytes %s, want %s", victim.id, len(r.stdout), s, want)
	}
	mustFail(t, c.conf, []string{`ENOSPC`, `3 replicas`, `only 2 storage nodes`}, "put", src, "/r3/more.bin")
	if ls := string(mustRun(t, c.conf, nil, "ls", "/r3").stdout); ls != "big.bin\n" {
		t.Errorf("ls /r3 after a refused put: %q, want only big.bin (no temporary left)", ls)
	}
	// A smaller policy still works on the two survivors.
	mustRun(t, c.conf, nil, "mkdir", "/r2")
	mustRun(t, c.conf, nil, "policy", "set", "/r2", "--replicas", "2")
	small := []byte("two replicas are enough\n")
	mustRun(t, c.conf, bytes.NewReader(small), "put", "-", "/r2/s.txt")
	if got := mustRun(t, c.conf, nil, "cat", "/r2/s.txt").stdout; !bytes.Equal(got, small) {
		t.Errorf("cat /r2/s.txt: %q", got)
	}
}

// other returns the i-th node id other than skip, in id order.
func other(skip ids.NodeID, nodes map[ids.NodeID]*nodeProc, i int) ids.NodeID {
	for id := ids.NodeID(1); id < 100; id++ {
		if _, ok := nodes[id]; ok && id != skip {
			if i == 0 {
				return id
			}
			i--
		}
	}
	return 0
}

// TestGetToFIFO: `sluice get` into an existing FIFO (or device, such as
// /dev/null) writes to it; it must not replace it with a regular file, as
// its write-beside-and-rename does for regular targets.
func TestGetToFIFO(t *testing.T) {
	base := baseDir(t)
	c := startUp(t, filepath.Join(base, "data"), 1)
	want := randomBytes(t, 1<<20+3)
	src := filepath.Join(base, "src")
	os.WriteFile(src, want, 0o644)
	mustRun(t, c.conf, nil, "put", src, "/f")
	fifo := filepath.Join(base, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := os.ReadFile(fifo)
		got <- b
	}()
	mustRun(t, c.conf, nil, "get", "/f", fifo)
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("read %d bytes from the FIFO, want %d", len(b), len(want))
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("after get, %s is %v (%v), want still a FIFO", fifo, fi.Mode(), err)
	}
}
