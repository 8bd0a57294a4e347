package main

import (
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/chaos"
)

// TestChaos is the fault-injection run in its short form (the issue's
// "a minute"): five node processes and meta, a workload on replicas 3
// and RS(3,2), nodes killed -9 and restarted, meta killed -9 and
// restarted; at the end full redundancy and no acknowledged byte lost.
// `sluice bench chaos --duration D` runs it longer.
func TestChaos(t *testing.T) {
	rep, err := chaos.Run(context.Background(), chaos.Options{
		Binary:    sluiceBin,
		Dir:       baseDir(t),
		Duration:  time.Minute,
		MetaEvery: 20 * time.Second,
		Seed:      uint64(time.Now().UnixNano()),
		Logf:      t.Logf,
	})
	t.Logf("%s", rep)
	if err != nil {
		t.Fatal(err)
	}
	if rep.BytesLost != 0 || rep.FilesLost != 0 {
		t.Errorf("%d files, %d bytes lost", rep.FilesLost, rep.BytesLost)
	}
	if len(rep.Check) != 0 {
		t.Errorf("sluice check after the run: %+v", rep.Check)
	}
	if rep.WrongReads != 0 {
		t.Errorf("%d reads during the run returned bytes no write produced", rep.WrongReads)
	}
	if rep.Writes < 50 || rep.NodeKills < 3 || rep.MetaRestarts < 1 || rep.Files == 0 {
		t.Errorf("the run did too little to mean anything: %s", rep)
	}
}
