package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestStuckRepairSaysWhy (issue 17, item 3): RS(3,2) on five nodes, one
// killed past the repair grace: its units have nowhere to go. Status says
// why ("need 5 nodes, 4 are up") and gives no ETA, instead of a frozen
// bar; when the node returns, repair finishes.
func TestStuckRepairSaysWhy(t *testing.T) {
	c := startMeta(t, baseDir(t), "--repair-grace", "2s")
	for i := 1; i <= 5; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 5, 15*time.Second)
	mustRun(t, c.conf, nil, "mkdir", "/e")
	mustRun(t, c.conf, nil, "policy", "set", "/e", "--ec", "3+2")
	files := map[string][]byte{}
	for i := range 3 {
		p := fmt.Sprintf("/e/f%d", i)
		files[p] = randomBytes(t, 1<<20+i*4099)
		mustRun(t, c.conf, bytes.NewReader(files[p]), "put", "-", p)
	}
	waitRepaired(t, c.conf, time.Now(), 20*time.Second)

	var victim *nodeProc
	for _, n := range c.nodes {
		victim = n
		break
	}
	victim.proc.kill()
	var st metaapi.StatusResp
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		st = status(t, c.conf)
		return len(st.Repair.Blocked) > 0 && st.Repair.Stuck == st.Repair.Pending && st.Repair.Pending > 0,
			fmt.Sprintf("repair %+v", st.Repair)
	})
	b := st.Repair.Blocked[0]
	if b.Kind != metaapi.BlockNoPlace || b.Need != 5 || b.Up != 4 || !b.EC || b.Policy != "RS(3,2)" || st.Repair.ETA != -1 {
		t.Errorf("blocked %+v, ETA %v", st.Repair.Blocked, st.Repair.ETA)
	}
	text := string(mustRun(t, c.conf, nil, "status").stdout)
	t.Logf("status with a node of RS(3,2)'s five down:\n%s", text)
	if !strings.Contains(text, "stripe groups of RS(3,2) need 5 nodes, 4 are up") || !strings.Contains(text, "no ETA") || strings.Contains(text, "ETA unknown") {
		t.Errorf("status text does not say why repair is stuck:\n%s", text)
	}

	c.startNode(t, filepath.Base(victim.dir))
	st = waitRepaired(t, c.conf, time.Now(), 60*time.Second)
	if len(st.Repair.Blocked) != 0 {
		t.Errorf("repaired, still blocked: %+v", st.Repair.Blocked)
	}
	if text := string(mustRun(t, c.conf, nil, "status").stdout); !strings.Contains(text, "repair: idle") || strings.Contains(text, "stuck") {
		t.Errorf("status after the node returned:\n%s", text)
	}
	for p, want := range files {
		if got := mustRun(t, c.conf, nil, "cat", p).stdout; !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes, want %d", p, len(got), len(want))
		}
	}
}

// TestStatusWaitsForNodesAfterMetaRestart (issue 17, item 3): just after
// meta restarts, nodes it knows have not reported yet; status says it
// waits for them instead of counting their chunks unavailable, and no
// repair starts on their account (the repair grace is shorter than the
// wait). One node held stopped keeps the wait going; once it reports,
// status is whole.
func TestStatusWaitsForNodesAfterMetaRestart(t *testing.T) {
	dir := baseDir(t)
	c := startMeta(t, dir)
	for i := 1; i <= 3; i++ {
		c.startNode(t, fmt.Sprintf("n%d", i))
	}
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	mustRun(t, c.conf, bytes.NewReader(randomBytes(t, 3<<20)), "put", "-", "/f")
	waitRepaired(t, c.conf, time.Now(), 20*time.Second)

	var held *nodeProc
	for _, n := range c.nodes {
		held = n
		break
	}
	if code := c.metaProc.stop(t, 15*time.Second); code != 0 {
		t.Fatalf("meta exited %d", code)
	}
	if err := held.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer held.proc.cmd.Process.Signal(syscall.SIGCONT)
	args := []string{"meta", "--data", filepath.Join(dir, "meta"), "--listen", c.meta, "--node-timeout", "60s", "--repair-grace", "1s"}
	c.metaProc = startDaemon(t, dir, "meta-restarted", args...)
	c.metaProc.waitReady(t, 20*time.Second)

	st := status(t, c.conf)
	if st.Waiting == nil || st.Waiting.Known != 3 || st.Waiting.Reported > 2 {
		t.Fatalf("right after the restart: waiting %+v", st.Waiting)
	}
	eventually(t, 20*time.Second, 100*time.Millisecond, func() (bool, string) {
		st = status(t, c.conf)
		return st.Waiting != nil && st.Waiting.Reported == 2, fmt.Sprintf("waiting %+v", st.Waiting)
	})
	time.Sleep(3 * time.Second) // past the repair grace: a scan would have queued repairs by now
	st = status(t, c.conf)
	text := string(mustRun(t, c.conf, nil, "status").stdout)
	t.Logf("status while a node has not reported:\n%s", text)
	if st.Redundancy.ScannedAt != 0 || st.Repair.Pending != 0 || st.Repair.Queued != 0 {
		t.Errorf("waiting for a node, yet scanned or repairing: redundancy %+v, repair %+v", st.Redundancy, st.Repair)
	}
	if !strings.Contains(text, "waiting for nodes (2 of 3 reported") || strings.Contains(text, "UNAVAILABLE") {
		t.Errorf("status text does not say it waits for nodes:\n%s", text)
	}

	if err := held.proc.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	st = waitRepaired(t, c.conf, time.Now(), 30*time.Second)
	if st.Waiting != nil || st.Redundancy.Replicated.Full == 0 || st.Redundancy.Replicated.Unavailable != 0 {
		t.Errorf("every node reported: waiting %+v, redundancy %+v", st.Waiting, st.Redundancy)
	}
	if text := string(mustRun(t, c.conf, nil, "status").stdout); strings.Contains(text, "waiting for nodes") {
		t.Errorf("status after every node reported:\n%s", text)
	}
}
