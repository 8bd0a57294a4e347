package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFabricAutoProcesses: nodes run with --fabric auto listen on a
// shared-memory socket beside TCP (named after their fabric address),
// replicate among themselves, and serve clients with either fabric.
func TestFabricAutoProcesses(t *testing.T) {
	c := threeNodes(t, nil, []string{"--fabric", "auto"})
	unixSocks, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		t.Skip("no /proc/net/unix")
	}
	for id, n := range c.nodes {
		if !strings.Contains(string(unixSocks), "@sluice-fabric:"+n.addr) {
			t.Errorf("node %v (%s) has no shared-memory socket", id, n.addr)
		}
	}
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	data := randomBytes(t, 5<<20)
	src := filepath.Join(c.dir, "src")
	os.WriteFile(src, data, 0o600)
	mustRun(t, c.conf, nil, "--fabric", "auto", "put", src, "/f")
	for _, mode := range []string{"auto", "shm", "tcp"} {
		if got := mustRun(t, c.conf, nil, "--fabric", mode, "cat", "/f").stdout; sum(got) != sum(data) {
			t.Fatalf("read back with --fabric %s differs", mode)
		}
	}
	for id, n := range c.nodes {
		if h := chunkFiles(t, filepath.Join(n.dir, "store", "chunks")); len(h) == 0 {
			t.Errorf("node %v holds no chunk: the replicas were not forwarded", id)
		}
	}
	mustFail(t, c.conf, []string{"unknown fabric"}, "--fabric", "rdma", "cat", "/f")
}
