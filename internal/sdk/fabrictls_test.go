package sdk_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

func startTLSCluster(tb testing.TB, fabricTLS bool, chunk int64) *cluster.Cluster {
	tb.Helper()
	c, err := cluster.Start(context.Background(), cluster.Options{Dir: tmpDir(tb), Nodes: 3, MetaListen: "127.0.0.1:0", ChunkSize: chunk, FabricTLS: fabricTLS})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// TestFabricTLS: with --fabric-tls a replicated write (client to node,
// node to node) and reads work end to end; a client without TLS is
// refused by such nodes with a hint, not served in plain.
func TestFabricTLS(t *testing.T) {
	c := startTLSCluster(t, true, testChunk)
	cl := newClient(t, c, sdk.Options{FabricTLS: true})
	ctx := context.Background()
	if err := cl.SetPolicy(ctx, "/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
		t.Fatal(err)
	}
	data := randBytes(rand.New(rand.NewPCG(3, 3)), 3*testChunk+123)
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	if _, err := cl.Get(ctx, "/f", &got); err != nil || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("get over TLS: %d bytes, %v", got.Len(), err)
	}
	plain := newClient(t, c, sdk.Options{BusyRetry: 1})
	_, err := plain.Get(ctx, "/f", io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--fabric-tls") {
		t.Fatalf("plain client of TLS nodes: %v", err)
	}
}

// BenchmarkFabricTLS: the cost of --fabric-tls end to end. Two 3-node
// clusters in one process, one plain and one with fabric TLS, data on
// tmpfs; each iteration puts (replicas 3, ring: client to n1 to n2 to
// n3) and gets 64 MiB on both, back to back, and reports the medians of
// each throughput and of the TLS/plain ratio of neighbours.
func BenchmarkFabricTLS(b *testing.B) {
	const n = 64 << 20
	data := randBytes(rand.New(rand.NewPCG(4, 4)), n)
	ctx := context.Background()
	type side struct {
		cl       *sdk.Client
		put, get []float64
	}
	sides := map[bool]*side{}
	for _, on := range []bool{false, true} {
		c := startTLSCluster(b, on, 0) // the default chunk size
		cl := newClient(b, c, sdk.Options{FabricTLS: on})
		if err := cl.SetPolicy(ctx, "/", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			b.Fatal(err)
		}
		sides[on] = &side{cl: cl}
	}
	var putRatio, getRatio []float64
	b.SetBytes(2 * n)
	for b.Loop() {
		for _, on := range []bool{false, true} {
			s := sides[on]
			start := time.Now()
			if _, err := s.cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
				b.Fatal(err)
			}
			s.put = append(s.put, n/time.Since(start).Seconds())
			start = time.Now()
			if m, err := s.cl.Get(ctx, "/f", io.Discard); err != nil || m != n {
				b.Fatal(m, err)
			}
			s.get = append(s.get, n/time.Since(start).Seconds())
		}
		i := len(sides[true].put) - 1
		putRatio = append(putRatio, sides[true].put[i]/sides[false].put[i])
		getRatio = append(getRatio, sides[true].get[i]/sides[false].get[i])
	}
	b.ReportMetric(median(sides[false].put)/1e6, "put_plain_MB/s")
	b.ReportMetric(median(sides[true].put)/1e6, "put_tls_MB/s")
	b.ReportMetric(median(sides[false].get)/1e6, "get_plain_MB/s")
	b.ReportMetric(median(sides[true].get)/1e6, "get_tls_MB/s")
	b.ReportMetric(median(putRatio), "put_tls/plain")
	b.ReportMetric(median(getRatio), "get_tls/plain")
}
