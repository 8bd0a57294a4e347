package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// checkSettled runs `sluice check --verify` until it finds nothing or d
// passes, and returns what the last one found: once the cluster has
// healed, the fsck must come back clean (deletions queued for nodes that
// were down may take a heartbeat or two to be applied).
func checkSettled(ctx context.Context, cl *sdk.Client, d time.Duration) ([]metaapi.CheckProblem, error) {
	deadline := time.Now().Add(d)
	for {
		res, err := cl.Check(ctx, true, false, nil)
		if err != nil {
			return nil, fmt.Errorf("chaos: sluice check: %w", err)
		}
		if len(res.Problems) == 0 || time.Now().After(deadline) {
			return res.Problems, nil
		}
		select {
		case <-ctx.Done():
			return res.Problems, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
