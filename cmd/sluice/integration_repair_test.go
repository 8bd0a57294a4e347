package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// waitRepaired polls `sluice status --json` until a scan after since
// finds every chunk and stripe group at full redundancy and nothing is
// left to repair.
func waitRepaired(t *testing.T, conf string, since time.Time, timeout time.Duration) metaapi.StatusResp {
	t.Helper()
	var st metaapi.StatusResp
	eventually(t, timeout, 200*time.Millisecond, func() (bool, string) {
		st = status(t, conf)
		return st.Repaired(since), fmt.Sprintf("redundancy %+v, repair %+v", st.Redundancy, st.Repair)
	})
	return st
}

// fiveNodesWithFiles starts meta (with metaArgs) and five nodes, and
// writes n files of about size bytes into /r (replicas 3) and n into /e
// (RS(2,2)); it returns what each holds.
func fiveNodesWithFiles(t *testing.T, n, size int, metaArgs ...string) (*splitCluster, map[string][]byte) {
	t.Helper()
	c := startMeta(t, baseDir(t), metaArgs...)
	for i := 1; i <= 5; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 5, 15*time.Second)
	mustRun(t, c.conf, nil, "mkdir", "-p", "/r", "/e")
	mustRun(t, c.conf, nil, "policy", "set", "/r", "--replicas", "3")
	mustRun(t, c.conf, nil, "policy", "set", "/e", "--ec", "2+2")
	files := map[string][]byte{}
	for i := range n {
		for _, dir := range []string{"/r", "/e"} {
			p := fmt.Sprintf("%s/f%d", dir, i)
			files[p] = randomBytes(t, size+i*7919)
			mustRun(t, c.conf, bytes.NewReader(files[p]), "put", "-", p)
		}
	}
	return c, files
}

// TestRepairAfterNodeKill: with separate processes, a node killed for
// good has its replicas and stripe units rebuilt elsewhere once the grace
// period is over, `sluice status` says so, every file reads back intact,
// and when the node returns its stale copies are garbage-collected.
func TestRepairAfterNodeKill(t *testing.T) {
	c, files := fiveNodesWithFiles(t, 3, 5<<20, "--repair-grace", "2s")
	before := waitRepaired(t, c.conf, time.Now(), 20*time.Second)
	if before.Redundancy.Replicated.Full == 0 || before.Redundancy.Striped.Full == 0 {
		t.Fatalf("tallies count nothing: %+v", before.Redundancy)
	}

	// Kill the node holding the most chunks.
	var victim *nodeProc
	for _, n := range before.Nodes {
		if np := c.nodes[n.ID]; victim == nil || n.Chunks > 0 && np != nil && n.Chunks >= nodeChunks(before, victim.id) {
			victim = np
		}
	}
	held := nodeChunks(before, victim.id)
	victim.proc.kill()
	killed := time.Now()
	after := waitRepaired(t, c.conf, killed.Add(4*time.Second), 90*time.Second)
	t.Logf("node %v (%d chunks) killed; full redundancy again after %s: %+v, repair %+v",
		victim.id, held, time.Since(killed).Round(100*time.Millisecond), after.Redundancy, after.Repair)
	if after.Repair.Done == 0 {
		t.Fatalf("status reports no repair: %+v", after.Repair)
	}
	text := string(mustRun(t, c.conf, nil, "status").stdout)
	for _, want := range []string{"REDUNDANCY", "replicated chunks", "stripe groups", "repair: idle"} {
		if !strings.Contains(text, want) {
			t.Errorf("status text lacks %q:\n%s", want, text)
		}
	}
	for p, want := range files {
		if got := mustRun(t, c.conf, nil, "cat", p).stdout; !bytes.Equal(got, want) {
			t.Fatalf("%s after repair: %d bytes, want %d", p, len(got), len(want))
		}
	}

	// The node comes back: it holds only copies meta moved elsewhere,
	// and deletes them.
	np := c.startNode(t, filepath.Base(victim.dir))
	if np.id != victim.id {
		t.Fatalf("restarted node has id %v, was %v", np.id, victim.id)
	}
	eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st := status(t, c.conf)
		n := nodeChunks(st, victim.id)
		return n == 0, fmt.Sprintf("returned node %v still holds %d chunks", victim.id, n)
	})
	entries, _ := os.ReadDir(filepath.Join(victim.dir, "chunks"))
	t.Logf("returned node's chunk directory has %d subdirectories left", len(entries))
}

func nodeChunks(st metaapi.StatusResp, id ids.NodeID) int64 {
	for _, n := range st.Nodes {
		if n.ID == id {
			return n.Chunks
		}
	}
	return -1
}

// TestScrubRepairsCorruption: bytes flipped in a chunk file on disk are
// never returned to a reader (another replica serves it), the node's
// scrub finds them, and meta has the copy rebuilt from a healthy one.
func TestScrubRepairsCorruption(t *testing.T) {
	c := startMeta(t, baseDir(t), "--repair-grace", "2s")
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i), "--scrub-interval", "1s", "--scrub-rate", "0")
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	data := randomBytes(t, 6<<20+4321)
	mustRun(t, c.conf, bytes.NewReader(data), "put", "-", "/f")

	// The chunk file on node n1: flip a few bytes in the middle.
	var chunkFile string
	filepath.WalkDir(filepath.Join(c.dir, "n1"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".chunk") {
			chunkFile = p
		}
		return nil
	})
	if chunkFile == "" {
		t.Fatal("no chunk file on n1")
	}
	f, err := os.OpenFile(chunkFile, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	const at = 3<<20 + 17
	if _, err := f.WriteAt([]byte{^data[at], ^data[at+1], ^data[at+2]}, at); err != nil {
		t.Fatal(err)
	}
	f.Close()
	flipped := time.Now()

	// Reads in between return the right bytes.
	for range 3 {
		if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; !bytes.Equal(got, data) {
			t.Fatal("a read after the corruption returned wrong bytes")
		}
	}
	// The scrub reports it and meta rebuilds the copy: the file on disk
	// holds the right bytes again.
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		b, err := os.ReadFile(chunkFile)
		if err != nil {
			return false, err.Error()
		}
		ok := len(b) >= len(data) && bytes.Equal(b[:len(data)], data)
		return ok, fmt.Sprintf("chunk file on n1 still differs (%d bytes); status %+v", len(b), status(t, c.conf).Repair)
	})
	st := status(t, c.conf)
	t.Logf("corrupt copy rebuilt %s after the flip; repair %+v", time.Since(flipped).Round(100*time.Millisecond), st.Repair)
	if st.Repair.Done == 0 {
		t.Errorf("status reports no repair: %+v", st.Repair)
	}
	if got := mustRun(t, c.conf, nil, "cat", "/f").stdout; !bytes.Equal(got, data) {
		t.Fatal("read after the repair differs")
	}
}

// TestNodeDrain: `sluice node drain` moves every chunk and unit off a
// node while it stays up, new data avoids it, and the files read back.
func TestNodeDrain(t *testing.T) {
	c, files := fiveNodesWithFiles(t, 4, 3<<20)
	// Single replicas too: a drain keeps the leaving copy as a member
	// (and the source) until its successor is whole.
	mustRun(t, c.conf, nil, "mkdir", "-p", "/one")
	mustRun(t, c.conf, nil, "policy", "set", "/one", "--replicas", "1")
	for i := range 24 {
		p := fmt.Sprintf("/one/f%d", i)
		files[p] = randomBytes(t, 100<<10+i)
		mustRun(t, c.conf, bytes.NewReader(files[p]), "put", "-", p)
	}
	st := waitRepaired(t, c.conf, time.Now(), 20*time.Second)
	var victim ids.NodeID
	for _, n := range st.Nodes {
		if victim == 0 || n.Members > nodeMembers(st, victim) {
			victim = n.ID
		}
	}
	if nodeMembers(st, victim) <= 0 {
		t.Fatalf("no node holds anything: %+v", st.Nodes)
	}
	mustFail(t, c.conf, []string{"node", "n99"}, "node", "drain", "n99")
	out := string(mustRun(t, c.conf, nil, "node", "drain", victim.String()).stdout)
	t.Logf("drain output:\n%s", out)
	if !strings.Contains(out, "holds no data any more") {
		t.Fatalf("drain did not report completion:\n%s", out)
	}
	st = status(t, c.conf)
	if n := nodeMembers(st, victim); n != 0 {
		t.Fatalf("drained node still has %d members", n)
	}
	text := string(mustRun(t, c.conf, nil, "status").stdout)
	if !strings.Contains(text, "up,draining") {
		t.Errorf("status does not show the node draining:\n%s", text)
	}
	// New data avoids it.
	mustRun(t, c.conf, bytes.NewReader(randomBytes(t, 1<<20)), "put", "-", "/r/new")
	st = waitRepaired(t, c.conf, time.Now(), 20*time.Second)
	if n := nodeMembers(st, victim); n != 0 {
		t.Errorf("a new file was placed on the draining node (%d members)", n)
	}
	for p, want := range files {
		if got := mustRun(t, c.conf, nil, "cat", p).stdout; !bytes.Equal(got, want) {
			t.Fatalf("%s after the drain differs", p)
		}
	}
	// It can be stopped now without any chunk losing a copy.
	c.nodes[victim].proc.kill()
	for p, want := range files {
		if got := mustRun(t, c.conf, nil, "cat", p).stdout; !bytes.Equal(got, want) {
			t.Fatalf("%s with the drained node stopped differs", p)
		}
	}
}

func nodeMembers(st metaapi.StatusResp, id ids.NodeID) int64 {
	for _, n := range st.Nodes {
		if n.ID == id {
			return n.Members
		}
	}
	return -1
}
