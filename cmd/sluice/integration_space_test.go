package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// mountTmpfs mounts a tmpfs of size bytes at dir (created) for the
// test's life: a real file system that really fills up.
func mountTmpfs(t *testing.T, dir string, size int64) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Skipf("mounting a tmpfs at %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// fill writes a file in dir until its file system has no room left.
func fill(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for len(buf) > 0 {
		if _, err := f.Write(buf); errors.Is(err, syscall.ENOSPC) {
			buf = buf[:len(buf)/2] // the last pages too
		} else if err != nil {
			t.Fatal(err)
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Bavail != 0 {
		t.Fatalf("%s still has %d blocks free (%v)", dir, st.Bavail, err)
	}
}

// TestFullNodeGetsNoNewChunks (issue 15, defect 5): one of four nodes
// has its own small file system, and it fills up. Meta must learn that
// from the node's reports and place no new chunk there: 30 new files
// with three replicas all succeed, on the three nodes with room. A file
// that already had a replica there still takes a write: the full node
// refuses it (no space), and the writer's fail-over has meta move that
// replica to a node with room. The full node stays up.
func TestFullNodeGetsNoNewChunks(t *testing.T) {
	dir := baseDir(t)
	small := filepath.Join(dir, "small")
	mountTmpfs(t, small, 64<<20)
	const minFree = 16 << 20
	c := startMeta(t, dir, "--min-free", fmt.Sprint(minFree), "--min-free-percent", "0")
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	full := c.startNodeIn(t, "n4", filepath.Join(small, "n4"))
	waitNodesUp(t, c.conf, 4, 15*time.Second)
	dirs := map[ids.NodeID]string{}
	for id, n := range c.nodes {
		dirs[id] = n.dir
	}
	mustRun(t, c.conf, nil, "mkdir", "/r3")
	mustRun(t, c.conf, nil, "policy", "set", "/r3", "--replicas", "3")
	mc := metaClient(t, c.conf)
	onFull := func(p string) bool {
		_, ls := layoutOf(t, mc, p)
		for _, l := range ls {
			for _, r := range l.Replicas {
				if r.Node == full.id {
					return true
				}
			}
		}
		return false
	}

	// Before it fills: a file with a replica there (three of four nodes
	// hold each file).
	old := randomBytes(t, 256<<10)
	oldPath := ""
	for i := 0; oldPath == "" && i < 40; i++ {
		p := fmt.Sprintf("/r3/old%02d", i)
		mustRun(t, c.conf, bytes.NewReader(old), "put", "-", p)
		if onFull(p) {
			oldPath = p
		}
	}
	if oldPath == "" {
		t.Fatalf("no file placed on %v in 40", full.id)
	}

	fill(t, small)
	eventually(t, 15*time.Second, 50*time.Millisecond, func() (bool, string) {
		for _, n := range status(t, c.conf).Nodes {
			if n.ID == full.id {
				return n.Free < minFree, fmt.Sprintf("%v reports %d bytes free", n.ID, n.Free)
			}
		}
		return false, "the node is not listed"
	})
	if out := string(mustRun(t, c.conf, nil, "status").stdout); !strings.Contains(out, "FREE") || !strings.Contains(out, "up,full") {
		t.Errorf("status shows no free space, or not the full node:\n%s", out)
	}

	files := map[string][]byte{}
	for i := range 30 {
		p := fmt.Sprintf("/r3/new%02d", i)
		data := randomBytes(t, 256<<10)
		if r := run(t, c.conf, bytes.NewReader(data), "put", "-", p); r.code != 0 {
			t.Errorf("%s", r)
			continue
		}
		files[p] = data
	}
	if len(files) < 30 {
		t.Fatalf("%d of 30 new files failed with a node full and three with room", 30-len(files))
	}
	for p, data := range files {
		if onFull(p) {
			t.Errorf("%s has a replica on the full node %v", p, full.id)
		}
		checkReplicas(t, mc, dirs, p, data)
	}

	// A write to the file with a replica on the full node.
	conf, err := config.Load(c.conf)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f, err := cl.Open(ctx, oldPath)
	if err != nil {
		t.Fatal(err)
	}
	more := randomBytes(t, 1<<20)
	if _, err := f.WriteAtContext(ctx, more, int64(len(old))); err != nil {
		t.Fatalf("appending to %s, which had a replica on the full node: %v", oldPath, err)
	}
	want := slices.Concat(old, more)
	if onFull(oldPath) {
		t.Errorf("%s still has a replica on the full node", oldPath)
	}
	checkReplicas(t, mc, dirs, oldPath, want)
	if got := mustRun(t, c.conf, nil, "cat", oldPath).stdout; !bytes.Equal(got, want) {
		t.Errorf("cat %s: %d bytes, want %d", oldPath, len(got), len(want))
	}
	if st := nodeStates(status(t, c.conf))[full.id]; st != metaapi.NodeUp || full.proc.exited() {
		t.Errorf("the full node is %s (exited: %v)", st, full.proc.exited())
	}
	checkClean(t, c.conf, 30*time.Second)
}
