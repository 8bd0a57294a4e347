package bench

import (
	"context"
	"fmt"
	"strconv"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// writeLatency: seed 000 Fig. 6 — write latency of a single-replica write
// by authentication protocol.
func writeLatency(ctx context.Context, r *runner) error {
	sizes := r.sizes(powers(1<<10, 4<<20), []int64{64 << 10, 512 << 10})
	protos := []string{sdk.ProtoRaw, sdk.ProtoStream, sdk.ProtoRPC, sdk.ProtoRPCPull}
	return r.onClusters(ctx, r.links(false), 1, []string{"--bench-allow-raw"}, func(c *procCluster, l LinkSpec) error {
		clients := map[string]*sdk.Client{}
		for _, proto := range protos {
			cl, err := r.newClient(c, l, proto)
			if err != nil {
				return err
			}
			defer cl.Close()
			clients[proto] = cl
		}
		if err := prepare(ctx, clients[sdk.ProtoStream], "/wl", metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			return err
		}
		for _, size := range sizes {
			var lanes []*lane
			for _, proto := range protos {
				ln, err := r.openLane(ctx, proto, clients[proto], "/wl")
				if err != nil {
					return err
				}
				lanes = append(lanes, ln)
			}
			err := r.interleaved(ctx, lanes, size)
			closeLanes(ctx, lanes)
			if err != nil {
				return err
			}
			for _, ln := range lanes {
				p := Point{Mode: ln.mode, K: 1, Size: size, Link: l.String(), Group: l.String()}
				summarize(&p, ln.lat)
				r.add(p)
			}
		}
		return nil
	})
}

// replication: seed 000 Fig. 9 (left, centre) and Fig. 10 — write latency
// by strategy, vs size for K=2 and K=4, and vs K for 4 KiB and 512 KiB.
func replication(ctx context.Context, r *runner) error {
	const nodes = 4
	type point struct {
		k    int
		size int64
	}
	var want []point
	seen := map[point]bool{}
	add := func(p point) {
		if !seen[p] {
			seen[p] = true
			want = append(want, p)
		}
	}
	if r.cfg.Quick {
		add(point{4, 512 << 10})
	} else {
		for _, k := range []int{2, 4} {
			for _, size := range powers(1<<10, 4<<20) {
				add(point{k, size})
			}
		}
		for k := 1; k <= nodes; k++ {
			for _, size := range []int64{4 << 10, 512 << 10} {
				add(point{k, size})
			}
		}
	}
	return r.onClusters(ctx, r.links(true), nodes, nil, func(c *procCluster, l LinkSpec) error {
		cl, err := r.newClient(c, l, "")
		if err != nil {
			return err
		}
		defer cl.Close()
		for _, w := range want {
			var lanes []*lane
			for _, s := range plan.Replicated() {
				dir := fmt.Sprintf("/rep-%s-%d", s, w.k)
				if err := prepare(ctx, cl, dir, metaapi.Policy{Replicas: w.k, Strategy: s}); err != nil {
					return err
				}
				ln, err := r.openLane(ctx, s.String(), cl, dir)
				if err != nil {
					return err
				}
				lanes = append(lanes, ln)
			}
			err := r.interleaved(ctx, lanes, w.size)
			closeLanes(ctx, lanes)
			if err != nil {
				return fmt.Errorf("k=%d: %w", w.k, err)
			}
			for _, ln := range lanes {
				p := Point{Mode: ln.mode, K: w.k, Size: w.size, Link: l.String(), Group: l.String()}
				summarize(&p, ln.lat)
				r.add(p)
			}
		}
		return nil
	})
}

// goodput: seed 000 Fig. 9 (right) — bytes per second one storage node
// ingests, for ring and tree with K=4. Every replica stores every byte,
// so a node ingests what the client writes; writers keep several writes
// in flight.
func goodput(ctx context.Context, r *runner) error {
	const nodes, k, writers = 4, 4, 4
	sizes := r.sizes(powers(1<<10, 4<<20), []int64{512 << 10})
	return r.onClusters(ctx, r.links(true), nodes, nil, func(c *procCluster, l LinkSpec) error {
		cl, err := r.newClient(c, l, "")
		if err != nil {
			return err
		}
		defer cl.Close()
		for _, s := range []plan.Plan{{Strategy: plan.Ring}, {Strategy: plan.Tree}} {
			dir := "/gp-" + s.String()
			if err := prepare(ctx, cl, dir, metaapi.Policy{Replicas: k, Strategy: s}); err != nil {
				return err
			}
			for _, size := range sizes {
				all, elapsed, err := r.concurrent(ctx, cl, dir, size, writers)
				if err != nil {
					return fmt.Errorf("%s %d bytes: %w", s, size, err)
				}
				// Bytes per second over the whole run, warm-up included
				// (every write counts as ingest).
				total := float64(size) * float64(writers*(r.cfg.Warmup+r.cfg.Reps))
				p := Point{Mode: s.String(), K: k, Size: size, Link: l.String(), Group: l.String(),
					Throughput: total / elapsed.Seconds(), Concurrency: writers}
				summarize(&p, all)
				r.add(p)
			}
		}
		return nil
	})
}

// tableFill shows the engine's request table filling: a node with a tiny
// table and one handler worker, more and more concurrent 64 KiB writes;
// requests beyond the table are refused busy and retried by the client.
func tableFill(ctx context.Context, r *runner) error {
	const table, size = 4, 64 << 10
	conc := []int{1, 2, 4, 8, 16, 32}
	if r.cfg.Quick {
		conc = []int{1, 8, 32}
	}
	l := LinkSpec{}
	if len(r.cfg.Links) > 0 {
		l = r.cfg.Links[0]
	}
	c, err := startCluster(ctx, &r.cfg, 1, nodeArgs(l, "--request-table", strconv.Itoa(table), "--workers", "1"))
	if err != nil {
		return err
	}
	defer c.Close()
	for _, n := range conc {
		cl, err := r.newClient(c, l, "")
		if err != nil {
			return err
		}
		dir := fmt.Sprintf("/tf-%d", n)
		if err := prepare(ctx, cl, dir, metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			cl.Close()
			return err
		}
		before := cl.Stats().BusyRetries
		all, elapsed, firstErr := r.concurrent(ctx, cl, dir, size, n)
		if firstErr != nil {
			cl.Close()
			return firstErr
		}
		p := Point{Mode: fmt.Sprintf("table=%d", table), K: 1, Size: size, Link: l.String(), Concurrency: n,
			NACKs: int64(cl.Stats().BusyRetries - before), Group: "table",
			Throughput: float64(size) * float64(n*(r.cfg.Warmup+r.cfg.Reps)) / elapsed.Seconds()}
		summarize(&p, all)
		r.add(p)
		cl.Close()
	}
	return nil
}

// ---- output ----
