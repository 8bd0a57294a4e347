package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestECSurvivesNodeKills: meta and six nodes as separate processes; an
// RS(4,2) directory; a 24 MiB file put through the CLI; two nodes killed
// with SIGKILL: `get` still returns identical bytes (degraded reads), and
// once two nodes join, the lost units are rebuilt on them: `repair`
// returns with the group whole (whether its own attempt or meta's
// queued one moved them), and with two more of the original nodes
// killed the file still reads back, decoded through the rebuilt units.
// Bad codes are refused with clear errors.
func TestECSurvivesNodeKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node cluster")
	}
	dir := baseDir(t)
	c := startMeta(t, dir)
	for n := 1; n <= 6; n++ {
		c.startNode(t, fmt.Sprintf("n%d", n))
	}
	waitNodesUp(t, c.conf, 6, 20*time.Second)
	mustRun(t, c.conf, nil, "mkdir", "/ec")
	mustFail(t, c.conf, []string{`6\+3`, `9 distinct nodes`, `\b6 storage nodes`}, "policy", "set", "/ec", "--ec", "6+3")
	mustFail(t, c.conf, []string{`EINVAL`, `at least 1`}, "policy", "set", "/ec", "--ec", "0+2")
	mustFail(t, c.conf, []string{`EINVAL`, `at least 1`}, "policy", "set", "/ec", "--ec", "4+0")
	mustFail(t, c.conf, []string{`not K\+M`}, "policy", "set", "/ec", "--ec", "four+two")
	mustFail(t, c.conf, []string{`exclusive`}, "policy", "set", "/ec", "--ec", "4+2", "--replicas", "2")
	mustRun(t, c.conf, nil, "policy", "set", "/ec", "--ec", "4+2")
	if out := string(mustRun(t, c.conf, nil, "policy", "get", "/ec").stdout); !strings.Contains(out, "ec=4+2") {
		t.Fatalf("policy get: %q", out)
	}

	data := randomBytes(t, 24<<20+4321)
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c.conf, nil, "put", src, "/ec/f")
	if out := mustRun(t, c.conf, nil, "cat", "/ec/f").stdout; !bytes.Equal(out, data) {
		t.Fatal("read back differs")
	}
	mc := metaClient(t, c.conf)
	_, chunks := layoutOf(t, mc, "/ec/f")
	if len(chunks) != 1 || len(chunks[0].Replicas) != 6 {
		t.Fatalf("layout: %+v", chunks)
	}
	// Kill the nodes of a data unit and a parity unit.
	for _, u := range []int{2, 5} {
		n := c.nodes[chunks[0].Replicas[u].Node]
		n.proc.kill()
	}
	if out := mustRun(t, c.conf, nil, "cat", "/ec/f").stdout; !bytes.Equal(out, data) {
		t.Fatal("degraded read differs")
	}
	// Meta must see them down before their units can move.
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := nodeStates(status(t, c.conf))
		return st[chunks[0].Replicas[2].Node] == metaapi.NodeDown && st[chunks[0].Replicas[5].Node] == metaapi.NodeDown, "nodes not down yet"
	})
	// Two groups' worth of nodes are gone; four live nodes hold the other
	// four units, so there is nowhere to move them: a clear error.
	r := mustFail(t, c.conf, []string{`ENOSPC`}, "repair", "/ec/f")
	t.Logf("repair with no spare node: %s", strings.TrimSpace(r.stderr))
	// Two fresh nodes join, and the lost units move onto them. Meta's
	// repair that just failed is still queued and retries as soon as a
	// node joins, so it may move them before the `repair` below asks:
	// what is checked is where the units end up and what they hold, not
	// whose attempt moved them.
	fresh := []*nodeProc{c.startNode(t, "n7"), c.startNode(t, "n8")}
	eventually(t, 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		up := 0
		for _, n := range st.Nodes {
			if n.State == metaapi.NodeUp {
				up++
			}
		}
		return up == 6, fmt.Sprintf("nodes %v", nodeStates(st))
	})
	// It returns once an attempt begun after it found the group whole.
	out := string(mustRun(t, c.conf, nil, "repair", "/ec/f").stdout)
	t.Logf("repair: %s", out)
	_, after := layoutOf(t, mc, "/ec/f")
	for _, u := range []int{2, 5} {
		if got := after[0].Replicas[u].Node; got != fresh[0].id && got != fresh[1].id {
			t.Fatalf("lost unit %d is on node %v, not on a node that joined (%v, %v); layout %+v", u, got, fresh[0].id, fresh[1].id, after[0].Replicas)
		}
	}
	for _, n := range fresh {
		if _, ok := chunkFiles(t, n.dir)[chunkFileName(after[0].Chunk)]; !ok {
			t.Fatalf("node %v holds no unit of group %v", n.id, after[0].Chunk)
		}
	}
	if out := mustRun(t, c.conf, nil, "cat", "/ec/f").stdout; !bytes.Equal(out, data) {
		t.Fatal("read after repair differs")
	}
	if out := string(mustRun(t, c.conf, nil, "repair", "/ec/f", "--mode", "gather").stdout); !strings.Contains(out, "0 units rebuilt") {
		t.Fatalf("second repair: %q", out)
	}
	checkClean(t, c.conf, 30*time.Second)
	// The rebuilt units hold the right bytes: with two more of the
	// original nodes gone, only they and two original units are left.
	for _, u := range []int{0, 1} {
		c.nodes[after[0].Replicas[u].Node].proc.kill()
	}
	if out := mustRun(t, c.conf, nil, "cat", "/ec/f").stdout; !bytes.Equal(out, data) {
		t.Fatal("read decoded through the rebuilt units differs")
	}
}
