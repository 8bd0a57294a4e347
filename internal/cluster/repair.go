package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/meta"
)

// StartRepair has ms repair chunks by itself (parallel at a time), its
// node requests sent by an SDK client of the cluster ms serves at addr.
// Close the returned closer after ms.
func StartRepair(ms *meta.Service, addr string, parallel int, log *slog.Logger) (io.Closer, error) {
	cl, err := client.New(client.Options{Conf: ms.SystemConf(addr), Logger: log, BusyRetry: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("repair worker: %w", err)
	}
	ms.StartRepair(cl, parallel)
	return cl, nil
}
