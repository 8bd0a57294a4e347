package nfs3

import (
	"context"
	"os"
	"testing"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/sdk"
)

// StartTestCluster starts an in-process cluster of nodes storage nodes (data
// on tmpfs when there is one) and an SDK client of it, both closed when
// the test ends; it returns the client and its configuration.
// Exported for the package's external tests.
func StartTestCluster(tb testing.TB, nodes int) (*sdk.Client, config.ClientConf) {
	tb.Helper()
	dir := tb.TempDir()
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		dir, _ = os.MkdirTemp("/dev/shm", "sluice-nfs3-")
		tb.Cleanup(func() { os.RemoveAll(dir) })
	}
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: dir, Nodes: nodes, MetaListen: "127.0.0.1:0", ChunkSize: 1 << 20})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	conf, err := c.Conf()
	if err != nil {
		tb.Fatal(err)
	}
	cl, err := sdk.New(sdk.Options{Conf: conf})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cl.Close() })
	return cl, conf
}
