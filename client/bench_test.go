package client_test

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
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/metaapi"
)

const benchBytes = 256 << 20

// rawTCP measures one-stream loopback TCP throughput (bytes/s): the
// speed-of-light reference the targets are ratios of. Median of
// five 256 MiB transfers in 1 MiB writes.
var rawTCP = sync.OnceValue(func() float64 {
	var rates []float64
	for range 5 {
		rates = append(rates, tcpOnce(benchBytes))
	}
	sort.Float64s(rates)
	return rates[len(rates)/2]
})

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

func benchCluster(b *testing.B) (*cluster.Cluster, *client.Client) {
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(b), Nodes: 3, MetaListen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	cl := newClient(b, c, client.Options{})
	ctx := context.Background()
	for _, k := range []int{1, 3} {
		dir := fmt.Sprintf("/r%d", k)
		if err := cl.Mkdir(ctx, dir, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := cl.SetPolicy(ctx, dir, metaapi.Policy{Replicas: k, Strategy: metaapi.StrategyRing}); err != nil {
			b.Fatal(err)
		}
	}
	return c, cl
}

// BenchmarkThroughput: single-stream put and get of 256 MiB, replicas 1
// and 3, all on tmpfs, with raw loopback TCP measured in the same run.
// Reports MB/s and the ratio to raw TCP ("x_tcp").
func BenchmarkThroughput(b *testing.B) {
	tcp := rawTCP()
	b.Run("raw-tcp", func(b *testing.B) {
		b.SetBytes(benchBytes)
		for b.Loop() {
			tcpOnce(benchBytes)
		}
	})
	_, cl := benchCluster(b)
	ctx := context.Background()
	data := make([]byte, benchBytes)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := 0; i < len(data); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8; j++ {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	// The source file for the CLI-like put, on tmpfs too.
	src := filepath.Join(tmpDir(b), "src")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, k := range []int{1, 3} {
		p := fmt.Sprintf("/r%d/big", k)
		// put from a local file, as `sluice put FILE` does (the file is
		// mapped and sent without a copy through a buffer).
		b.Run(fmt.Sprintf("put/replicas=%d", k), func(b *testing.B) {
			b.SetBytes(benchBytes)
			start := time.Now()
			for b.Loop() {
				fh, err := os.Open(src)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := cl.Put(ctx, p, fh, 0o644); err != nil {
					b.Fatal(err)
				}
				fh.Close()
			}
			rate := float64(benchBytes) * float64(b.N) / time.Since(start).Seconds()
			b.ReportMetric(rate/tcp, "x_tcp")
		})
		// put from a stream (stdin, a pipe): buffered.
		b.Run(fmt.Sprintf("put-stream/replicas=%d", k), func(b *testing.B) {
			b.SetBytes(benchBytes)
			start := time.Now()
			for b.Loop() {
				if _, err := cl.Put(ctx, p, struct{ io.Reader }{bytes.NewReader(data)}, 0o644); err != nil {
					b.Fatal(err)
				}
			}
			rate := float64(benchBytes) * float64(b.N) / time.Since(start).Seconds()
			b.ReportMetric(rate/tcp, "x_tcp")
		})
		b.Run(fmt.Sprintf("get/replicas=%d", k), func(b *testing.B) {
			b.SetBytes(benchBytes)
			start := time.Now()
			for b.Loop() {
				if n, err := cl.Get(ctx, p, io.Discard); err != nil || n != benchBytes {
					b.Fatal(n, err)
				}
			}
			rate := float64(benchBytes) * float64(b.N) / time.Since(start).Seconds()
			b.ReportMetric(rate/tcp, "x_tcp")
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
