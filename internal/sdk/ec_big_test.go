package sdk_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// TestECPutFromFile: a mapped 24 MiB file, 16 MiB messages of whole stripes.
func TestECPutFromFile(t *testing.T) {
	c := startCluster(t, 6)
	cl := newClient(t, c, sdk.Options{})
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
	benchECModes(b, startCluster(b, 9), nil)
}

// benchECModes runs BenchmarkECWrite's writes on c for every mode, the
// client linked by what link returns (nil: none).
func benchECModes(b *testing.B, c *cluster.Cluster, link func() *fabric.Link) {
	for _, mode := range []string{sdk.ECStream, sdk.ECPerChunk, sdk.ECCentral} {
		b.Run(mode, func(b *testing.B) {
			bench := sdk.BenchOptions{ECMode: mode}
			if link != nil {
				l := link()
				bench.LinkRate, bench.LinkDelay = l.Rate(), l.Delay()
			}
			cl := newBenchClient(b, c, sdk.Options{}, bench)
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

// TestECLargeUnalignedWrites: a put that is not a whole number of stripes
// and a 12 MiB overwrite at an unaligned offset: the read-modify-write
// reads only the edge stripes, in reads that fit a read buffer.
func TestECLargeUnalignedWrites(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	ecDir(t, cl, "/ec", 2, 1, 64<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	data := randBytes(rng, 30<<20+1)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatalf("put: %v", err)
	}
	f, err := cl.Open(ctx, "/ec/f")
	if err != nil {
		t.Fatal(err)
	}
	patch := randBytes(rng, 12<<20)
	if _, err := f.WriteAt(patch, 100); err != nil {
		t.Fatalf("unaligned 12 MiB overwrite: %v", err)
	}
	copy(data[100:], patch)
	if got := getAll(t, cl, "/ec/f"); !bytes.Equal(got, data) {
		t.Fatal("read back differs")
	}
	assertParityIsLibrarys(t, c, cl, "/ec/f", 2, 1)
}

// BenchmarkECGet: Get of a 64 MiB RS(4,2) file (healthy: direct reads
// of the data units), for profiles.
func BenchmarkECGet(b *testing.B) {
	c := startCluster(b, 6)
	cl := newClient(b, c, sdk.Options{})
	ctx := context.Background()
	cl.MkdirAll(ctx, "/ec", 0o755)
	if err := cl.SetPolicy(ctx, "/ec", metaapi.Policy{EC: &metaapi.ErasureCode{Data: 4, Parity: 2, Cell: metaapi.DefaultECCell}}); err != nil {
		b.Fatal(err)
	}
	data := randBytes(rand.New(rand.NewPCG(1, 1)), 64<<20)
	if _, err := cl.Put(ctx, "/ec/f", bytes.NewReader(data), 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cl.Get(ctx, "/ec/f", io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}
