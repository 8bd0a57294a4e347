package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/meta"
	"github.com/sluicefs/sluice/internal/sdk"
)

// RepairClient makes meta's repair worker (meta.StartOptions.NewRepairer):
// an SDK client of the cluster, its node requests over fabric TLS with
// fabricTLS. Meta does not import the SDK, which links the data plane.
func RepairClient(fabricTLS bool, log *slog.Logger) func(config.ClientConf) (meta.Repairer, io.Closer, error) {
	return func(conf config.ClientConf) (meta.Repairer, io.Closer, error) {
		cl, err := sdk.New(sdk.Options{Conf: conf, Logger: log, BusyRetry: 10 * time.Second, FabricTLS: fabricTLS})
		if err != nil {
			return nil, nil, fmt.Errorf("repair worker: %w", err)
		}
		return cl, cl, nil
	}
}

// StartRepair has ms repair chunks by itself (parallel at a time), its
// node requests sent by an SDK client of the cluster ms serves at addr
// (over fabric TLS with fabricTLS). Close the returned closer after ms.
func StartRepair(ms *meta.Service, addr string, parallel int, fabricTLS bool, log *slog.Logger) (io.Closer, error) {
	r, cl, err := RepairClient(fabricTLS, log)(ms.SystemConf(addr))
	if err != nil {
		return nil, err
	}
	ms.StartRepair(r, parallel)
	return cl, nil
}
