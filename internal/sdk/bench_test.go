package sdk_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

const benchBytes = 256 << 20

// tcpOnce measures one-stream loopback TCP throughput (bytes/s) for n
// bytes in 1 MiB writes to a reader that discards: the speed-of-light
// reference the targets are ratios of.
func tcpOnce(n int) float64 {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		io.Copy(io.Discard, c)
		c.Close()
		close(done)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for sent := 0; sent < n; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			panic(err)
		}
	}
	c.Close()
	<-done
	return float64(n) / time.Since(start).Seconds()
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// paired runs op b.N times, each time right after a raw TCP measurement,
// and reports the medians of its throughput (MB/s) and of its ratio to
// the TCP figure taken just before it ("x_tcp"): on a shared, noisy
// machine a ratio of neighbours is far steadier than either figure.
// between runs untimed before each sample (e.g. waiting for cleanup).
func paired(b *testing.B, n int, op func(i int), between func()) {
	var rates, ratios []float64
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if between != nil {
			between()
		}
		tcp := tcpOnce(n)
		b.StartTimer()
		start := time.Now()
		op(i)
		rate := float64(n) / time.Since(start).Seconds()
		rates = append(rates, rate)
		ratios = append(ratios, rate/tcp)
	}
	b.ReportMetric(median(rates)/1e6, "MB/s_median")
	b.ReportMetric(median(ratios), "x_tcp")
}

func benchCluster(b *testing.B) (*cluster.Cluster, *sdk.Client) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(b), Nodes: 3, MetaListen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	cl := newClient(b, c, sdk.Options{})
	ctx := context.Background()
	for _, k := range []int{1, 3} {
		dir := fmt.Sprintf("/r%d", k)
		if err := cl.Mkdir(ctx, dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := cl.SetPolicy(ctx, dir, metaapi.Policy{Replicas: k, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			b.Fatal(err)
		}
	}
	return c, cl
}

// waitRecycled waits until the nodes hold no chunk beyond what live files
// need, i.e. the chunks of replaced files have been deleted (their files
// recycled): the steady state of a cluster that overwrites data.
func waitRecycled(b *testing.B, c *cluster.Cluster, cl *sdk.Client) {
	var live int64
	for _, k := range []int64{1, 3} {
		ents, err := cl.ReadDir(context.Background(), fmt.Sprintf("/r%d", k))
		if err != nil {
			b.Fatal(err)
		}
		for _, e := range ents {
			a, err := cl.Lstat(context.Background(), fmt.Sprintf("/r%d/%s", k, e.Name))
			if err != nil {
				b.Fatal(err)
			}
			live += k * a.Size
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var used int64
		for _, n := range c.Nodes {
			u, _ := n.Store().Usage()
			used += u
		}
		if used <= live {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Fatal("replaced chunks were not deleted within 10s")
}

// BenchmarkThroughput: single-stream put and get of 256 MiB by one
// client, replicas 1 and 3, data on tmpfs, each sample paired with a raw
// loopback TCP transfer of the same size.
//
//   - put-new: a new file each time, into fresh space (the store must
//     allocate every page).
//   - put: replacing the same file each time, once the replaced file's
//     chunks are deleted: the freed chunk files are recycled.
//   - put-stream: like put, from a stream (a pipe, stdin) rather than a
//     file: buffered instead of sent straight from the file's pages.
func BenchmarkThroughput(b *testing.B) {
	c, cl := benchCluster(b)
	ctx := context.Background()
	data := make([]byte, benchBytes)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	src := filepath.Join(tmpDir(b), "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	putFile := func(p string) {
		fh, err := os.Open(src)
		if err != nil {
			b.Fatal(err)
		}
		defer fh.Close()
		if _, err := cl.Put(ctx, p, fh, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("raw-tcp", func(b *testing.B) {
		b.SetBytes(benchBytes)
		for b.Loop() {
			tcpOnce(benchBytes)
		}
	})
	for _, k := range []int{1, 3} {
		p := fmt.Sprintf("/r%d/big", k)
		b.Run(fmt.Sprintf("put-new/replicas=%d", k), func(b *testing.B) {
			paired(b, benchBytes, func(i int) { putFile(fmt.Sprintf("/r%d/new-%d-%d", k, b.N, i)) }, nil)
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				cl.Remove(ctx, fmt.Sprintf("/r%d/new-%d-%d", k, b.N, i))
			}
		})
		putFile(p)
		b.Run(fmt.Sprintf("put/replicas=%d", k), func(b *testing.B) {
			paired(b, benchBytes, func(int) { putFile(p) }, func() { waitRecycled(b, c, cl) })
		})
		b.Run(fmt.Sprintf("put-stream/replicas=%d", k), func(b *testing.B) {
			paired(b, benchBytes, func(int) {
				if _, err := cl.Put(ctx, p, struct{ io.Reader }{bytes.NewReader(data)}, 0o644); err != nil {
					b.Fatal(err)
				}
			}, func() { waitRecycled(b, c, cl) })
		})
		b.Run(fmt.Sprintf("get/replicas=%d", k), func(b *testing.B) {
			paired(b, benchBytes, func(int) {
				if n, err := cl.Get(ctx, p, io.Discard); err != nil || n != benchBytes {
					b.Fatal(n, err)
				}
			}, nil)
		})
	}
}

// BenchmarkWriteLatency: one WriteAt of each size, returned only once
// durable on every replica (ns/op is the latency).
func BenchmarkWriteLatency(b *testing.B) {
	_, cl := benchCluster(b)
	ctx := context.Background()
	for _, k := range []int{1, 3} {
		for _, size := range []int{4 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("replicas=%d/size=%s", k, sizeName(size)), func(b *testing.B) {
				f, err := cl.Create(ctx, fmt.Sprintf("/r%d/lat-%d", k, size), 0o644)
				if err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, size)
				b.SetBytes(int64(size))
				var off int64
				for b.Loop() {
					if _, err := f.WriteAt(buf, off); err != nil {
						b.Fatal(err)
					}
					off += int64(size)
					if off+int64(size) > 1<<30 {
						off = 0
					}
				}
			})
		}
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
