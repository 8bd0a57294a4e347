package client_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// TestECPutFromFile: a mapped 24 MiB file, 16 MiB messages of whole stripes.
func TestECPutFromFile(t *testing.T) {
	c := startCluster(t, 6)
	cl := newClient(t, c, client.Options{})
	ecDir(t, cl, "/ec", 4, 2, 64<<10)
	data := randBytes(rand.New(rand.NewPCG(1, 2)), 24<<20+4321)
	src := t.TempDir() + "/src"
	os.WriteFile(src, data, 0o644)
	fh, _ := os.Open(src)
	defer fh.Close()
	if _, err := cl.Put(context.Background(), "/ec/f", fh, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("differs")
	}
}

// BenchmarkECWrite: full-stripe RS(6,3) writes of 513 KiB by mode, on an
// in-process cluster of nine nodes (for profiles; `sluice bench
// ec-latency` has the separate-process figures).
func BenchmarkECWrite(b *testing.B) {
	c := startCluster(b, 9)
	for _, mode := range []string{client.ECStream, client.ECPerChunk, client.ECCentral} {
		b.Run(mode, func(b *testing.B) {
			cl := newClient(b, c, client.Options{ECMode: mode})
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
			b.ReportAllocs()
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
