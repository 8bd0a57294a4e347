package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// restartMeta starts meta again on its address and data (after a kill),
// with extra flags, and waits until it listens.
func (c *splitCluster) restartMeta(t *testing.T, name string, extra ...string) {
	t.Helper()
	args := append([]string{"meta", "--data", filepath.Join(c.dir, "meta"), "--listen", c.meta, "--node-timeout", "2s"}, extra...)
	c.metaProc = startDaemon(t, c.dir, name, args...)
	c.metaProc.waitReady(t, 20*time.Second)
}

// TestCLIMetaRestart: commands started while meta is down (restarting)
// wait for it within --op-timeout and succeed once it is back; with meta
// staying down, a command fails after --op-timeout naming meta's address.
func TestCLIMetaRestart(t *testing.T) {
	c := threeNodes(t, nil, nil)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "2")
	mustRun(t, c.conf, strings.NewReader("before"), "put", "-", "/before")

	c.metaProc.kill()
	data := randomBytes(t, 3<<20)
	stdin := filepath.Join(c.dir, "put.in")
	writeFile(t, stdin, data)
	cmds := map[string][]string{
		"ls":     {"--conf", c.conf, "--op-timeout", "60s", "ls", "/"},
		"status": {"--conf", c.conf, "--op-timeout", "60s", "status"},
		"put":    {"--conf", c.conf, "--op-timeout", "60s", "put", stdin, "/during"},
		"get":    {"--conf", c.conf, "--op-timeout", "60s", "get", "/before", filepath.Join(c.dir, "before.out")},
	}
	procs := map[string]*proc{}
	for name, args := range cmds {
		procs[name] = startProc(t, c.dir, "cli-"+name, args...)
	}
	// Well past the 2 s a command gives a meta that never answered it.
	time.Sleep(4 * time.Second)
	for name, p := range procs {
		if p.exited() {
			t.Fatalf("%s gave up while meta was down: %v\n%s", name, p.waitErr, p.stderrText())
		}
	}
	c.restartMeta(t, "meta-restarted")
	for name, p := range procs {
		select {
		case <-p.done:
		case <-time.After(50 * time.Second):
			t.Fatalf("%s still running 50 s after meta came back", name)
		}
		if p.waitErr != nil {
			t.Errorf("%s across a meta restart: %v\n%s", name, p.waitErr, p.stderrText())
		}
	}
	if ls := strings.Join(procs["ls"].out.snapshot(), "\n"); !strings.Contains(ls, "before") {
		t.Errorf("ls across the restart printed %q", ls)
	}
	got := mustRun(t, c.conf, nil, "cat", "/during").stdout
	if !bytes.Equal(got, data) {
		t.Errorf("file put across the restart reads back %d bytes, want the %d put", len(got), len(data))
	}

	// Meta stays down: a clear error after --op-timeout, naming it.
	c.metaProc.kill()
	start := time.Now()
	r := mustFail(t, c.conf, []string{`did not answer for [0-9.]+s`, regexp.QuoteMeta(c.meta)}, "--op-timeout", "3s", "ls", "/")
	took := time.Since(start)
	t.Logf("meta down: %q after %s", strings.TrimSpace(r.stderr), took.Round(time.Millisecond))
	if took < 3*time.Second || took > 20*time.Second {
		t.Errorf("with --op-timeout 3s, gave up after %s", took)
	}
}

// allChunkFiles is the set of chunk files on every node.
func (c *splitCluster) allChunkFiles(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, n := range c.nodes {
		for name := range chunkFiles(t, filepath.Join(n.dir, "store", "chunks")) {
			out[name] = true
		}
	}
	return out
}

// TestPutKilledLeavesNothing: a put killed with -9 leaves its temporary
// file and chunks only until its session has lapsed for --temp-grace;
// a put that is merely slow (alive, renewing) keeps its file throughout.
func TestPutKilledLeavesNothing(t *testing.T) {
	c := threeNodes(t, []string{"--lock-lease", "2s", "--temp-grace", "2s"}, nil)
	tmpRe := regexp.MustCompile(`(?m)^\.(slow|x)\.sluice-put-[0-9a-f]+$`)

	// A slow put: a little data every half second for three times the
	// lease and the grace together.
	slow := startProcStdin(t, c.dir, "put-slow", "--conf", c.conf, "put", "-", "/slow")
	var sent []byte
	for i := 0; i < 24; i++ {
		chunk := randomBytes(t, 1024)
		if _, err := slow.stdin.Write(chunk); err != nil {
			t.Fatalf("feeding the slow put: %v\n%s", err, slow.stderrText())
		}
		sent = append(sent, chunk...)
		if i == 4 {
			if ls := string(mustRun(t, c.conf, nil, "ls", "/").stdout); !tmpRe.MatchString(ls) {
				t.Errorf("during the slow put, ls / = %q: want its temporary file", ls)
			}
			if st := status(t, c.conf); st.TempFiles != 1 {
				t.Errorf("during the slow put, status counts %d temporary files, want 1", st.TempFiles)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	slow.stdin.Close()
	select {
	case <-slow.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("slow put still running 30 s after its input ended")
	}
	if slow.waitErr != nil {
		t.Fatalf("slow put: %v\n%s", slow.waitErr, slow.stderrText())
	}
	if got := mustRun(t, c.conf, nil, "cat", "/slow").stdout; !bytes.Equal(got, sent) {
		t.Fatalf("slow put stored %d bytes, want the %d sent", len(got), len(sent))
	}

	// A put killed mid-way.
	before := c.allChunkFiles(t)
	put := startProcStdin(t, c.dir, "put-x", "--conf", c.conf, "put", "-", "/x")
	block := randomBytes(t, 1<<20)
	for i := 0; i < 24; i++ {
		if _, err := put.stdin.Write(block); err != nil {
			t.Fatalf("feeding the put: %v\n%s", err, put.stderrText())
		}
	}
	var placed []string
	eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		placed = placed[:0]
		for f := range c.allChunkFiles(t) {
			if !before[f] {
				placed = append(placed, f)
			}
		}
		return len(placed) > 0, "no chunk file of the put on any node"
	})
	put.kill()
	if st := status(t, c.conf); st.TempFiles != 1 || st.TempBytes == 0 {
		t.Errorf("after the kill, status counts %d temporary files holding %d bytes, want 1 holding some", st.TempFiles, st.TempBytes)
	}
	killed := time.Now()
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		ls := string(mustRun(t, c.conf, nil, "ls", "/").stdout)
		return !tmpRe.MatchString(ls), "ls / = " + ls
	})
	t.Logf("temporary file removed %s after the kill", time.Since(killed).Round(time.Millisecond))
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		now := c.allChunkFiles(t)
		var left []string
		for f := range now {
			if !before[f] {
				left = append(left, f)
			}
		}
		return len(left) == 0, "chunk files of the killed put left: " + strings.Join(left, " ")
	})
	t.Logf("its %d chunk files deleted %s after the kill", len(placed), time.Since(killed).Round(time.Millisecond))
	if st := status(t, c.conf); st.TempFiles != 0 {
		t.Errorf("status still counts %d temporary files", st.TempFiles)
	}
	if out := string(mustRun(t, c.conf, nil, "ls", "/").stdout); out != "slow\n" {
		t.Errorf("ls / = %q, want only slow", out)
	}
}

// TestNodeRemoveAndChosenID: a node may choose its id; a drained node is
// removed for good; one holding the only copy of data is refused.
func TestNodeRemoveAndChosenID(t *testing.T) {
	c := threeNodes(t, nil, nil)
	n40 := c.startNode(t, "n40", "--id", "40")
	if n40.id != 40 {
		t.Fatalf("node started with --id 40 is %v", n40.id)
	}
	// A taken id is refused, naming it; a data directory keeps its id.
	tok := strings.TrimSpace(string(mustRun(t, c.conf, nil, "join-token").stdout))
	r := run(t, c.conf, nil, "node", "--data", filepath.Join(c.dir, "n5"), "--meta", c.meta, "--join", tok, "--id", "40")
	if r.code == 0 || !strings.Contains(r.stderr, "node id n40 is taken") {
		t.Errorf("second node asking for id 40: %s", r)
	}
	r = run(t, c.conf, nil, "node", "--data", n40.dir, "--meta", c.meta, "--id", "41")
	if r.code == 0 || !strings.Contains(r.stderr, "is node n40's data directory") {
		t.Errorf("node n40 started with --id 41: %s", r)
	}
	mustFail(t, c.conf, []string{`--id 0`}, "node", "--data", filepath.Join(c.dir, "n6"), "--meta", c.meta, "--id", "0")
	waitNodesUp(t, c.conf, 4, 15*time.Second)

	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "2")
	mustRun(t, c.conf, nil, "mkdir", "/one")
	mustRun(t, c.conf, nil, "policy", "set", "/one", "--replicas", "1")
	for i := 0; i < 8; i++ {
		mustRun(t, c.conf, bytes.NewReader(randomBytes(t, 4096)), "put", "-", "/f"+strconv.Itoa(i))
	}
	mustFail(t, c.conf, []string{`n40 is up and not draining`}, "node", "remove", "n40")
	out := string(mustRun(t, c.conf, nil, "--op-timeout", "2m", "node", "drain", "n40").stdout)
	if !strings.Contains(out, "holds no data any more") {
		t.Errorf("drain n40 printed %q", out)
	}
	mustRun(t, c.conf, nil, "node", "remove", "n40")
	st := waitNodesUp(t, c.conf, 3, 15*time.Second)
	for _, n := range st.Nodes {
		if n.ID == 40 {
			t.Errorf("status lists removed node n40")
		}
	}
	n40.proc.kill()

	// A single-copy file's only holder, dead, is refused, with the count.
	mustRun(t, c.conf, bytes.NewReader(randomBytes(t, 4096)), "put", "-", "/one/solo")
	mc := metaClient(t, c.conf)
	_, ls := layoutOf(t, mc, "/one/solo")
	holder := c.nodes[ls[0].Replicas[0].Node]
	holder.proc.kill()
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		return nodeStates(st)[holder.id] == metaapi.NodeDown, "node states " + fmt.Sprint(nodeStates(st))
	})
	mustFail(t, c.conf, []string{regexp.QuoteMeta(holder.id.String()) + ` still holds the only copy .* of 1 chunks`}, "node", "remove", holder.id.String())
	if got := mustRun(t, c.conf, nil, "cat", "/f0").stdout; len(got) != 4096 {
		t.Errorf("cat /f0 after the removal: %d bytes", len(got))
	}
}
