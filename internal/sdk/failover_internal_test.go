package sdk

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestWaitRepairBounded: a writer meets "being repaired" (EAGAIN) from
// meta whether or not its own write started the repair; it waits, and
// after failoverWait it gets EIO with meta's reason, never EAGAIN, which
// write(2) would pass to a program as "try again".
func TestWaitRepairBounded(t *testing.T) {
	busy := metaapi.Errorf(metaapi.EAGAIN, "chunk c1 of file 5 is being repaired")
	var fo failover
	if !fo.waitRepair(context.Background(), busy) {
		t.Fatal("a writer that did not start the repair did not wait for it")
	}
	if fo.waitRepair(context.Background(), metaapi.Errorf(metaapi.ENOENT, "gone")) {
		t.Fatal("waited on an error that is not EAGAIN")
	}
	fo.since = time.Now().Add(-failoverWait - time.Second)
	if fo.waitRepair(context.Background(), busy) {
		t.Fatal("waited past failoverWait")
	}
	err := fo.explain(busy)
	if !metaapi.IsCode(err, metaapi.EIO) || !strings.Contains(err.Error(), "being repaired") {
		t.Fatalf("after the wait the writer got %v, want EIO with meta's reason", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if (&failover{}).waitRepair(ctx, busy) {
		t.Fatal("a cancelled writer waited")
	}
}
