package sdk_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/fabric"
)

// BenchmarkECWriteLink: BenchmarkECWrite over emulated 10 Gbit/s links
// (each node and the client with its own), for profiles.
func BenchmarkECWriteLink(b *testing.B) {
	lk, _ := fabric.NewLink(1.25e9, 5*time.Microsecond)
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(b), Nodes: 9, MetaListen: "127.0.0.1:0", Fabric: fabric.Options{Link: lk}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	benchECModes(b, c, func() *fabric.Link {
		l, _ := fabric.NewLink(1.25e9, 5*time.Microsecond)
		return l
	})
}
