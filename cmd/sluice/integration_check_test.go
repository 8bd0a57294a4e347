package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/wire"
)

// checkReport runs `sluice check --json` with args and decodes the
// report; the exit status must say whether problems were found.
func checkReport(t *testing.T, conf string, args ...string) metaapi.CheckResp {
	t.Helper()
	r := run(t, conf, nil, append([]string{"check", "--json"}, args...)...)
	var res metaapi.CheckResp
	if err := json.Unmarshal(r.stdout, &res); err != nil {
		t.Fatalf("sluice check %v: %v\n%s", args, err, r)
	}
	if (len(res.Problems) > 0) != (r.code != 0) {
		t.Fatalf("sluice check %v: exit status %d with %d problems\n%s", args, r.code, len(res.Problems), r)
	}
	return res
}

// problem returns the report's problem of kind (zero Count if none).
func problem(res metaapi.CheckResp, kind metaapi.CheckKind) metaapi.CheckProblem {
	for _, p := range res.Problems {
		if p.Kind == kind {
			return p
		}
	}
	return metaapi.CheckProblem{Kind: kind}
}

// checkClean waits (up to d) for `sluice check --verify` to find nothing:
// a cluster that just settled may still be finishing repairs or
// collecting strays.
func checkClean(t *testing.T, conf string, d time.Duration) {
	t.Helper()
	eventually(t, d, time.Second, func() (bool, string) {
		r := run(t, conf, nil, "check", "--verify")
		return r.code == 0 && bytes.Contains(r.stdout, []byte("no problems found")), r.String() + "\n" + string(r.stdout)
	})
}

// TestCheck: `sluice check` against real processes finds a bad block on
// one copy (with --verify), copies a node lost, and a copy no file needs,
// each with a count and an example; --repair has the lost copies
// restored; a healthy cluster checks clean.
func TestCheck(t *testing.T) {
	c := threeNodes(t, []string{"--repair-grace", "2s"}, []string{"--scrub-interval", "24h"})
	keys := c.keys(t)
	mustRun(t, c.conf, nil, "policy", "set", "/", "--replicas", "3")
	a, b := randomBytes(t, 1<<20), randomBytes(t, 100<<10)
	mustRun(t, c.conf, bytes.NewReader(a), "put", "-", "/a")
	mustRun(t, c.conf, bytes.NewReader(b), "put", "-", "/b")
	out := mustRun(t, c.conf, nil, "check", "--verify").stdout
	if !bytes.Contains(out, []byte("no problems found")) || !bytes.Contains(out, []byte("3 of 3 nodes read and verified")) {
		t.Fatalf("check of a healthy cluster:\n%s", out)
	}

	// A bad block on one copy of /a.
	files := replicaFiles(t, c, "/a")
	flipByte(t, files[0], 12345)
	res := checkReport(t, c.conf, "--verify")
	if p := problem(res, metaapi.CheckBelowPolicy); p.Count != 1 || !strings.Contains(p.Examples[0], "2 of 3 copies intact at bytes [0, 16384)") {
		t.Fatalf("a bad block on one copy: %+v", res.Problems)
	}
	// What the verification found went to meta, which heals it.
	eventually(t, 60*time.Second, 200*time.Millisecond, func() (bool, string) {
		return beginsWith(files[0], a), "the bad block is not healed"
	})

	// A node loses its store.
	var n2 *nodeProc
	for _, n := range c.nodes {
		if filepath.Base(n.dir) == "n2" {
			n2 = n
		}
	}
	n2.proc.kill()
	if err := os.RemoveAll(filepath.Join(n2.dir, "store")); err != nil {
		t.Fatal(err)
	}
	c.startNode(t, "n2", "--scrub-interval", "24h")
	waitNodesUp(t, c.conf, 3, 15*time.Second)
	res = checkReport(t, c.conf)
	if p := problem(res, metaapi.CheckBelowPolicy); p.Count != 2 || !strings.Contains(strings.Join(p.Examples, "\n"), n2.id.String()+" holds no copy") {
		t.Fatalf("copies lost with a node's store: %+v", res.Problems)
	}
	res = checkReport(t, c.conf, "--repair")
	if p := problem(res, metaapi.CheckBelowPolicy); p.Repaired != 2 {
		t.Fatalf("check --repair: %+v", res.Problems)
	}
	checkClean(t, c.conf, 60*time.Second)
	checkReplicas(t, metaClient(t, c.conf), nodeDirs(t, filepath.Join(c.dir, "n1"), filepath.Join(c.dir, "n2"), filepath.Join(c.dir, "n3")), "/a", a)

	// A copy no file needs: a removed single-replica file's chunk
	// written to a node that never held it.
	mustRun(t, c.conf, nil, "mkdir", "/one")
	mustRun(t, c.conf, nil, "policy", "set", "/one", "--replicas", "1")
	mustRun(t, c.conf, bytes.NewReader(randomBytes(t, 10<<10)), "put", "-", "/one/dead")
	_, dl := layoutOf(t, metaClient(t, c.conf), "/one/dead")
	dead, holder := dl[0].Chunk, dl[0].Replicas[0].Node
	mustRun(t, c.conf, nil, "rm", "/one/dead")
	c.waitDeleted(t, dead)
	var other *nodeProc
	for id, n := range c.nodes {
		if id != holder {
			other = n
		}
	}
	stuff := randomBytes(t, 8<<10)
	raw := dialRaw(t, other.addr)
	raw.sendWrite(1, writeHeader(t, dead, 0, uint64(len(stuff)), forgedCap(t, other.id, dead, capability.Write, time.Now().Add(time.Hour), keys), other.addr), stuff)
	raw.expectStatus(1, wire.StatusOK)
	raw.c.Close()
	res = checkReport(t, c.conf)
	if p := problem(res, metaapi.CheckUnknownCopy); p.Count != 1 || !strings.Contains(p.Examples[0], dead.String()+" on "+other.id.String()) ||
		!strings.Contains(p.Examples[0], string(metaapi.StrayUnknown)) || !strings.Contains(p.Action, "orphan-grace") {
		t.Fatalf("a stray copy: %+v", res.Problems)
	}
}
