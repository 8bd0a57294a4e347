package main

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestMetaRestoreAfterCopiesMoved: copies that moved after the backup
// (a node drained and removed for good, its host wiped; another node
// killed and its copies repaired elsewhere) are, to the restored meta,
// copies on nodes the records do not name, while the nodes the records
// name are gone. They are the files' only copies: the restored meta
// must not collect them but make them members, so that every file from
// before the backup reads back whole, still does after the orphan grace,
// and the cluster checks clean.
func TestMetaRestoreAfterCopiesMoved(t *testing.T) {
	nodeArgs := []string{"--inventory-interval", "1s"}
	metaArgs := []string{"--orphan-grace", "2s", "--repair-grace", "2s"}
	c := threeNodes(t, metaArgs, nodeArgs)
	c.startNode(t, "n4", nodeArgs...)
	c.startNode(t, "n5", nodeArgs...)
	waitNodesUp(t, c.conf, 5, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "2")
	mustRun(t, c.conf, nil, "mkdir", "/one")
	mustRun(t, c.conf, nil, "policy", "set", "/one", "--replicas", "1")
	before := map[string][]byte{}
	for i, size := range []int{4096, 1<<20 + 5} {
		before[fmt.Sprintf("/one/s%d", i)] = randomBytes(t, size)
	}
	for i := 0; i < 8; i++ {
		before[fmt.Sprintf("/r%d", i)] = randomBytes(t, (i+1)*96<<10)
	}
	for p, b := range before {
		mustRun(t, c.conf, bytes.NewReader(b), "put", "-", p)
	}
	backup := filepath.Join(c.dir, "meta.backup")
	mustRun(t, c.conf, nil, "meta", "backup", backup)

	mc := metaClient(t, c.conf)
	holders := func() map[string][]ids.NodeID {
		out := map[string][]ids.NodeID{}
		for p := range before {
			_, ls := layoutOf(t, mc, p)
			for _, l := range ls {
				for _, r := range l.Replicas {
					out[p] = append(out[p], r.Node)
				}
			}
		}
		return out
	}
	// The holder of /one/s0's only copy is drained, removed for good,
	// and its host wiped.
	d := c.nodes[holders()["/one/s0"][0]]
	out := string(mustRun(t, c.conf, nil, "--op-timeout", "2m", "node", "drain", d.id.String()).stdout)
	if !strings.Contains(out, "holds no data any more") {
		t.Fatalf("drain %v printed %q", d.id, out)
	}
	mustRun(t, c.conf, nil, "node", "remove", d.id.String())
	d.proc.kill()
	delete(c.nodes, d.id)
	if err := os.RemoveAll(d.dir); err != nil {
		t.Fatal(err)
	}
	// A node holding replicated copies but no single copy dies; meta
	// repairs its copies onto the others.
	h := holders()
	var k *nodeProc
	for _, id := range slices.Sorted(maps.Keys(c.nodes)) {
		single, replicated := false, false
		for p, nodes := range h {
			if slices.Contains(nodes, id) {
				single = single || strings.HasPrefix(p, "/one/")
				replicated = replicated || !strings.HasPrefix(p, "/one/")
			}
		}
		if !single && replicated {
			k = c.nodes[id]
			break
		}
	}
	if k == nil {
		t.Fatalf("no node holds replicated copies and no single copy: %v", h)
	}
	k.proc.kill()
	delete(c.nodes, k.id)
	eventually(t, 90*time.Second, 500*time.Millisecond, func() (bool, string) {
		h := holders()
		for p, nodes := range h {
			if slices.Contains(nodes, k.id) || slices.Contains(nodes, d.id) {
				return false, fmt.Sprintf("%s still on %v", p, nodes)
			}
		}
		return true, ""
	})
	// Meta's host is lost; it is restored from the backup, which names
	// the nodes of before the moves.
	c.metaProc.kill()
	for _, n := range c.nodes {
		n.proc.stop(t, 20*time.Second)
	}
	newDir := filepath.Join(c.dir, "meta-new")
	mustRun(t, c.conf, nil, "meta", "restore", backup, "--data", newDir)
	p := startDaemon(t, c.dir, "meta-new", append([]string{"meta", "--data", newDir, "--listen", "127.0.0.1:0", "--node-timeout", "2s"}, metaArgs...)...)
	info := p.waitReady(t, 20*time.Second)
	c.meta, c.conf = info.Meta, info.Conf
	for _, n := range slices.Collect(maps.Values(c.nodes)) {
		c.startNodeIn(t, n.proc.name, n.dir, nodeArgs...)
	}
	eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		states := nodeStates(st)
		up := 0
		for _, s := range states {
			if s == metaapi.NodeUp {
				up++
			}
		}
		return up == len(c.nodes), fmt.Sprintf("nodes %v", states)
	})
	readAll := func() (bool, string) {
		for p, want := range before {
			r := run(t, c.conf, nil, "cat", p)
			if r.code != 0 || !bytes.Equal(r.stdout, want) {
				return false, fmt.Sprintf("%s: %d bytes back (%s), want %d\n%s", p, len(r.stdout), sum(r.stdout), len(want), r)
			}
		}
		return true, ""
	}
	eventually(t, 90*time.Second, 500*time.Millisecond, readAll)
	if !strings.Contains(p.stderrText(), "becomes its member") {
		t.Errorf("the restored meta adopted no copy:\n%s", tail(p.stderrText(), 40))
	}
	// The gone nodes, once nothing names them, are removed; the copies
	// left over are collected after the grace, and every file still
	// reads back whole.
	for _, gone := range []ids.NodeID{d.id, k.id} {
		eventually(t, 60*time.Second, 500*time.Millisecond, func() (bool, string) {
			r := run(t, c.conf, nil, "node", "remove", gone.String())
			return r.code == 0, r.String()
		})
	}
	checkClean(t, c.conf, 90*time.Second)
	if ok, why := readAll(); !ok {
		t.Fatalf("after the grace: %s", why)
	}
}
