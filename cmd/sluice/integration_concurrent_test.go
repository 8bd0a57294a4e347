package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// putProc is a `sluice put` started but not yet waited for.
type putProc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
}

func startPut(t *testing.T, ctx context.Context, conf, local, remote string, stdin []byte) *putProc {
	t.Helper()
	p := &putProc{cmd: exec.CommandContext(ctx, sluiceBin, "--conf", conf, "put", local, remote)}
	p.cmd.Stderr = &p.stderr
	if stdin != nil {
		p.cmd.Stdin = bytes.NewReader(stdin)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConcurrentWriters runs several `sluice put` processes at once, to
// one path and to different paths, under a 3-replica policy.
func TestConcurrentWriters(t *testing.T) {
	base := baseDir(t)
	dir := filepath.Join(base, "data")
	c := startUp(t, dir, 3)
	conf := c.conf
	mc := metaClient(t, conf)
	dirs := nodeDirs(t, filepath.Join(dir, "node1"), filepath.Join(dir, "node2"), filepath.Join(dir, "node3"))
	mustRun(t, conf, nil, "mkdir", "/cw")
	mustRun(t, conf, nil, "policy", "set", "/cw", "--replicas", "3")

	const writers = 4
	rounds := 3
	if testing.Short() {
		rounds = 1
	}
	// Inputs of different sizes and contents, some from files, some from
	// stdin; sizes straddle the client's 16 MiB write message in the
	// long mode so writes are split.
	inputs := make([][]byte, writers)
	locals := make([]string, writers)
	for i := range inputs {
		n := (1<<20)*(i+1) + 4096*i + 17*i
		if !testing.Short() && i == writers-1 {
			n = 17<<20 + 5
		}
		inputs[i] = randomBytes(t, n)
		locals[i] = filepath.Join(base, fmt.Sprintf("in%d", i))
		if err := os.WriteFile(locals[i], inputs[i], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	which := func(b []byte) int {
		for i, in := range inputs {
			if bytes.Equal(b, in) {
				return i
			}
		}
		return -1
	}

	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	waitAll := func(ps []*putProc) {
		t.Helper()
		for i, p := range ps {
			if err := p.cmd.Wait(); err != nil {
				t.Errorf("writer %d: %v: %s", i, err, p.stderr.String())
			}
		}
	}

	t.Run("same path", func(t *testing.T) {
		seen := map[int]bool{}
		for round := 0; round < rounds; round++ {
			var ps []*putProc
			for i := 0; i < writers; i++ {
				if i%2 == 0 {
					ps = append(ps, startPut(t, ctx, conf, locals[i], "/cw/same", nil))
				} else {
					ps = append(ps, startPut(t, ctx, conf, "-", "/cw/same", inputs[i]))
				}
			}
			waitAll(ps)
			got := mustRun(t, conf, nil, "get", "/cw/same", "-").stdout
			w := which(got)
			if w < 0 {
				t.Fatalf("round %d: /cw/same holds %d bytes (%s) equal to no single input (sizes %v)", round, len(got), sum(got), sizes(inputs))
			}
			seen[w] = true
			if st := string(mustRun(t, conf, nil, "stat", "/cw/same").stdout); !strings.Contains(st, fmt.Sprintf("Size: %d\n", len(got))) {
				t.Errorf("round %d: stat disagrees with the content's size %d:\n%s", round, len(got), st)
			}
			checkReplicas(t, mc, dirs, "/cw/same", got)
		}
		t.Logf("winners over %d rounds: %v", rounds, seen)
		if out := string(mustRun(t, conf, nil, "ls", "/cw").stdout); out != "same\n" {
			t.Errorf("ls /cw = %q, want only the file (no temporaries)", out)
		}
	})

	t.Run("different paths", func(t *testing.T) {
		var ps []*putProc
		for i := 0; i < writers; i++ {
			if i%2 == 1 {
				ps = append(ps, startPut(t, ctx, conf, locals[i], fmt.Sprintf("/cw/p%d", i), nil))
			} else {
				ps = append(ps, startPut(t, ctx, conf, "-", fmt.Sprintf("/cw/p%d", i), inputs[i]))
			}
		}
		waitAll(ps)
		var wg sync.WaitGroup
		gots := make([][]byte, writers)
		for i := 0; i < writers; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				gots[i] = run(t, conf, nil, "get", fmt.Sprintf("/cw/p%d", i), "-").stdout
			}()
		}
		wg.Wait()
		for i, got := range gots {
			if !bytes.Equal(got, inputs[i]) {
				t.Errorf("/cw/p%d: %d bytes %s (input %d), want input %d: %d bytes %s", i, len(got), sum(got), which(got), i, len(inputs[i]), sum(inputs[i]))
			}
			checkReplicas(t, mc, dirs, fmt.Sprintf("/cw/p%d", i), inputs[i])
		}
	})

	// The chunks of the files the renames replaced are released and the
	// nodes delete them: eventually every node holds exactly the live
	// files' chunks.
	live := map[string]bool{}
	for _, p := range []string{"/cw/same", "/cw/p0", "/cw/p1", "/cw/p2", "/cw/p3"} {
		_, ls := layoutOf(t, mc, p)
		for _, l := range ls {
			live[chunkFileName(l.Chunk)] = true
		}
	}
	eventually(t, 15*time.Second, 200*time.Millisecond, func() (bool, string) {
		var msgs []string
		for id, d := range dirs {
			var extra, missing []string
			files := chunkFiles(t, d)
			for n := range files {
				if !live[n] {
					extra = append(extra, n)
				}
			}
			for n := range live {
				if files[n] == "" {
					missing = append(missing, n)
				}
			}
			if len(extra)+len(missing) > 0 {
				sort.Strings(extra)
				msgs = append(msgs, fmt.Sprintf("%v: stale %v missing %v", id, extra, missing))
			}
		}
		return len(msgs) == 0, strings.Join(msgs, "; ")
	})
}

func sizes(bs [][]byte) []int {
	var out []int
	for _, b := range bs {
		out = append(out, len(b))
	}
	return out
}
