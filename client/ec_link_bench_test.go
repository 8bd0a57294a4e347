package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
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
	for _, mode := range []string{client.ECStream, client.ECPerChunk, client.ECCentral} {
		b.Run(mode, func(b *testing.B) {
			clk, _ := fabric.NewLink(1.25e9, 5*time.Microsecond)
			cl := newClient(b, c, client.Options{ECMode: mode, Link: clk})
			ctx := context.Background()
			const k, cell = 6, 87552
			dir := "/b-" + mode
			cl.MkdirAll(ctx, dir, 0o755)
			if err := cl.SetPolicy(ctx, dir, metaapi.Policy{EC: &metaapi.ErasureCode{Data: k, Parity: 3, Cell: cell}}); err != nil {
				b.Fatal(err)
			}
			f, err := cl.Create(ctx, dir+"/f", 0o644)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, k*cell)
			b.SetBytes(int64(len(buf)))
			off := int64(0)
			for b.Loop() {
				if _, err := f.WriteData(ctx, buf, off); err != nil {
					b.Fatal(err)
				}
				off += int64(len(buf))
			}
		})
	}
}
