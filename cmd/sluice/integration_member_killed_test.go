package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestMemberKilledMidPut: for every replication strategy, a `sluice put`
// of a 3-replica file is under way (fed from a pipe at a set pace, over
// an emulated 400 Mbit/s link) when one of the three nodes is killed with
// SIGKILL. The
// put must fail with an error, or succeed with every byte readable —
// never be acknowledged without its data, never hang.
func TestMemberKilledMidPut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster per strategy")
	}
	const size = 48 << 20
	base := baseDir(t)
	data := randomBytes(t, size)
	want := sum(data)
	for i, strategy := range []string{"ring", "tree", "flat", "host-ring", "host-tree"} {
		t.Run(strategy, func(t *testing.T) {
			dir := filepath.Join(base, strategy)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			c := startMeta(t, dir)
			for n := 1; n <= 3; n++ {
				c.startNode(t, fmt.Sprintf("n%d", n), "--link-rate", "400Mbit")
			}
			waitNodesUp(t, c.conf, 3, 15*time.Second)
			mustRun(t, c.conf, nil, "mkdir", "/k")
			mustRun(t, c.conf, nil, "policy", "set", "/k", "--replicas", "3", "--strategy", strategy)

			ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
			defer cancel()
			// Fed from a pipe at a set pace, so the put is mid-way (with a
			// write in flight) when the node dies, whatever the strategy.
			put := &putProc{cmd: exec.CommandContext(ctx, sluiceBin, "--conf", c.conf, "put", "-", "/k/f")}
			put.cmd.Stderr = &put.stderr
			stdin, err := put.cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := put.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			fed := make(chan int, 64)
			go func() {
				defer stdin.Close()
				for off := 0; off < size; off += 1 << 20 {
					if _, err := stdin.Write(data[off : off+1<<20]); err != nil {
						return
					}
					fed <- off + 1<<20
					time.Sleep(20 * time.Millisecond)
				}
			}()
			killAt := (16 + rand.IntN(16)) << 20
			for n := range fed {
				if n >= killAt {
					break
				}
			}
			go func() {
				for range fed {
				}
			}()
			var victim *nodeProc
			k := 0
			for _, n := range c.nodes {
				if k == i%3 {
					victim = n
				}
				k++
			}
			start := time.Now()
			victim.proc.kill()
			err = put.cmd.Wait()
			t.Logf("killed %v after %d MiB fed; put returned after %s: %v %s", victim.id, killAt>>20, time.Since(start).Round(time.Millisecond), err, put.stderr.String())
			if ctx.Err() != nil {
				t.Fatal("put hung after a replica was killed")
			}
			if err != nil {
				if put.stderr.Len() == 0 {
					t.Fatal("put failed without saying why")
				}
				if r := run(t, c.conf, nil, "stat", "/k/f"); r.code == 0 {
					t.Fatalf("a failed put left /k/f visible:\n%s", r.stdout)
				}
				return
			}
			// Acknowledged: every byte must read back with a replica down.
			got := mustRun(t, c.conf, nil, "get", "/k/f", "-").stdout
			if len(got) != size || sum(got) != want {
				t.Fatalf("acknowledged put reads back %d bytes (%s), want %d (%s)", len(got), sum(got), size, want)
			}
		})
	}
}
