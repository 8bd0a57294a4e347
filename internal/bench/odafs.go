package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// The odafs experiment (issue 19; seed 004's Table 7, Fig. 16 and its
// server throughput, and its claim that optimistic reads leave the
// server's CPU idle), in three parts against one node process of its own
// with --export-cache, which serves both fabrics (--fabric auto):
//   - latency: 4 KiB reads of blocks the node holds, by read request and
//     optimistically through the node's exported cache, one at a time,
//     the ways taking turns op by op; for each its latency and the node
//     process's CPU time per read (from /proc);
//   - postmark: the thesis' read-only PostMark (odafsPostmark);
//   - throughput: two clients reading 4-64 KiB at random
//     (odafsThroughput, odafs_throughput.go).

const (
	odafsBlock = 4 << 10
	odafsFile  = 4 << 20 // the blocks read: all within the exported cache
)

// OdafsParts are the parts of the odafs experiment (Config.Parts).
var OdafsParts = []string{"latency", "postmark", "throughput"}

// odafsFiles are the files the parts read, written once for both
// fabrics.
type odafsFiles struct {
	lat     []byte // /od/f
	pmFiles int    // /pm/0 ... of 4 KiB each
	tp      []byte // /od/tp
}

func odafsBench(ctx context.Context, r *runner) error {
	parts := map[string]bool{}
	for _, p := range r.cfg.Parts {
		if !slices.Contains(OdafsParts, p) {
			return fmt.Errorf("unknown part %q (known: %s)", p, strings.Join(OdafsParts, ", "))
		}
		parts[p] = true
	}
	if len(parts) == 0 {
		for _, p := range OdafsParts {
			parts[p] = true
		}
	}
	// A client over shared memory gets an exported cache of its own:
	// 32 MiB holds the throughput part's file.
	c, err := startCluster(ctx, &r.cfg, 1, []string{"--fabric", "auto", "--export-cache", "64MiB", "--export-block", "4KiB",
		"--export-client-cache", "32MiB"})
	if err != nil {
		return err
	}
	defer c.Close()
	var nodePid int
	for _, p := range c.nodes {
		nodePid = p.Pid()
	}
	files, err := odafsSetup(ctx, r, c, parts)
	if err != nil {
		return err
	}
	// The node's CPU time at rest, to tell it from what the reads cost.
	idle0, err := procCPU(nodePid)
	if err != nil {
		return err
	}
	idleStart := time.Now()
	time.Sleep(r.odafsDuration())
	idle1, err := procCPU(nodePid)
	if err != nil {
		return err
	}
	idleRate := float64(idle1-idle0) / float64(time.Since(idleStart))
	fmt.Fprintf(r.cfg.Log, "   node at rest: %.1f%% of a core; load average %s\n", 100*idleRate, loadAverage())

	rows := [][]string{{"experiment", "mode", "fabric", "size_bytes", "ops", "p50_us", "p99_us", "node_cpu_us_per_op", "optimistic_share"}}
	pm := [][]string{{"experiment", "mode", "fabric", "hit_ratio", "reads", "reads_per_s", "node_cpu_us_per_op", "served_without_request"}}
	tp := [][]string{odafsTPHeader}
	fabrics := []fabric.Fabric{fabric.FabricTCP, fabric.FabricShm}
	if len(r.cfg.Fabrics) > 0 {
		fabrics = nil
		for _, f := range r.cfg.Fabrics {
			if f != string(fabric.FabricTCP) && f != string(fabric.FabricShm) {
				return fmt.Errorf("fabric %q: tcp or shm", f)
			}
			fabrics = append(fabrics, fabric.Fabric(f))
		}
	}
	for _, fm := range fabrics {
		fmt.Fprintf(r.cfg.Log, "   fabric %s\n", fm)
		if parts["latency"] {
			got, err := odafsOnce(ctx, r, c, nodePid, fm, files.lat)
			if err != nil {
				return fmt.Errorf("fabric %s: %w", fm, err)
			}
			rows = append(rows, got...)
		}
		if parts["postmark"] {
			got, err := odafsPostmark(ctx, r, c, nodePid, fm, files.pmFiles)
			if err != nil {
				return fmt.Errorf("fabric %s: postmark: %w", fm, err)
			}
			pm = append(pm, got...)
		}
		if parts["throughput"] {
			got, err := odafsThroughput(ctx, r, c, nodePid, fm, files.tp)
			if err != nil {
				return fmt.Errorf("fabric %s: throughput: %w", fm, err)
			}
			tp = append(tp, got...)
		}
	}
	fmt.Fprintf(r.cfg.Log, "   load average after: %s\n", loadAverage())
	r.wrote = true
	if parts["latency"] {
		if err := writeCSV(filepath.Join(r.cfg.Out, "odafs.csv"), rows); err != nil {
			return err
		}
	}
	if parts["postmark"] {
		if err := writeCSV(filepath.Join(r.cfg.Out, "odafs-postmark.csv"), pm); err != nil {
			return err
		}
		if err := plotODAFSPostmark(filepath.Join(r.cfg.Out, "odafs-postmark"), pm); err != nil {
			return err
		}
	}
	if parts["throughput"] {
		if err := writeCSV(filepath.Join(r.cfg.Out, "odafs-throughput.csv"), tp); err != nil {
			return err
		}
		return plotODAFSThroughput(filepath.Join(r.cfg.Out, "odafs-throughput"), tp)
	}
	return nil
}

// odafsSetup writes the files the parts read.
func odafsSetup(ctx context.Context, r *runner, c *procCluster, parts map[string]bool) (*odafsFiles, error) {
	cl, err := sdk.New(sdk.Options{Conf: c.conf, MTU: r.cfg.MTU})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	f := &odafsFiles{}
	for _, dir := range []string{"/od", "/pm"} {
		if err := prepare(ctx, cl, dir, metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			return nil, err
		}
	}
	if parts["latency"] {
		f.lat = randomData(odafsFile)
		if _, err := cl.Put(ctx, "/od/f", bytes.NewReader(f.lat), 0o644); err != nil {
			return nil, err
		}
	}
	if parts["postmark"] {
		f.pmFiles = 2000
		if r.repsGiven > 0 || r.cfg.Quick {
			f.pmFiles = 200
		}
		data := randomData(odafsBlock)
		for i := range f.pmFiles {
			if _, err := cl.Put(ctx, fmt.Sprintf("/pm/%d", i), bytes.NewReader(data), 0o644); err != nil {
				return nil, err
			}
		}
	}
	if parts["throughput"] {
		f.tp = randomData(r.odafsTPFile())
		if _, err := cl.Put(ctx, "/od/tp", bytes.NewReader(f.tp), 0o644); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// odafsOnce runs the latency part with the client reaching the node by
// fm; data is /od/f's content.
func odafsOnce(ctx context.Context, r *runner, c *procCluster, nodePid int, fm fabric.Fabric, data []byte) ([][]string, error) {
	req, err := sdk.New(sdk.Options{Conf: c.conf, MTU: r.cfg.MTU, Fabric: fm})
	if err != nil {
		return nil, err
	}
	defer req.Close()
	opt, err := sdk.New(sdk.Options{Conf: c.conf, MTU: r.cfg.MTU, Fabric: fm, ODAFS: &odafs.Options{CacheBytes: -1, BlockSize: odafsBlock}})
	if err != nil {
		return nil, err
	}
	defer opt.Close()
	fr, err := req.Open(ctx, "/od/f")
	if err != nil {
		return nil, err
	}
	fo, err := opt.Open(ctx, "/od/f")
	if err != nil {
		return nil, err
	}
	buf := make([]byte, odafsBlock)
	// One read of every block by request fills the exported cache and
	// gives the optimistic client its references.
	for off := int64(0); off < odafsFile; off += odafsBlock {
		if _, err := fo.ReadAt(buf, off); err != nil {
			return nil, err
		}
	}
	n := 20000
	if r.cfg.Quick {
		n = 4000
	}
	if r.repsGiven > 0 {
		n = r.repsGiven
	}
	type mode struct {
		name string
		f    *sdk.File
		lat  []time.Duration
		cpu  time.Duration
	}
	modes := []*mode{{name: "request", f: fr}, {name: "optimistic", f: fo}}
	// The ways take turns in blocks of ops, each block's node CPU time
	// read before and after (the kernel counts it in 10 ms ticks).
	const block = 2500
	rng := rand.New(rand.NewPCG(1, 2))
	offs := make([]int64, n)
	for i := range offs {
		offs[i] = rng.Int64N(odafsFile/odafsBlock) * odafsBlock
	}
	before := opt.Stats()
	for b := 0; b*block < n; b++ {
		for j := range modes {
			m := modes[(b+j)%len(modes)]
			c0, err := procCPU(nodePid)
			if err != nil {
				return nil, err
			}
			for i := b * block; i < min(n, (b+1)*block); i++ {
				off := offs[i]
				start := time.Now()
				if _, err := m.f.ReadAt(buf, off); err != nil {
					return nil, fmt.Errorf("%s read at %d: %w", m.name, off, err)
				}
				m.lat = append(m.lat, time.Since(start))
				if i%997 == 0 && !bytes.Equal(buf, data[off:off+odafsBlock]) {
					return nil, fmt.Errorf("%s read at %d: wrong bytes", m.name, off)
				}
			}
			c1, err := procCPU(nodePid)
			if err != nil {
				return nil, err
			}
			m.cpu += c1 - c0
		}
	}
	st := opt.Stats()
	share := float64(st.Optimistic-before.Optimistic) / float64(n)
	var rows [][]string
	fmt.Fprintf(r.cfg.Log, "   %-11s %8s %8s %14s\n", "mode", "p50", "p99", "node CPU/op")
	for _, m := range modes {
		var p Point
		summarize(&p, m.lat)
		cpuPer := float64(m.cpu.Microseconds()) / float64(n)
		sh := ""
		if m.name == "optimistic" {
			sh = strconv.FormatFloat(share, 'f', 3, 64)
		}
		fmt.Fprintf(r.cfg.Log, "   %-11s %8s %8s %12.1fµs %s\n", m.name, p.P50.Round(100*time.Nanosecond), p.P99.Round(100*time.Nanosecond), cpuPer, sh)
		rows = append(rows, []string{"odafs", m.name, string(fm), strconv.Itoa(odafsBlock), strconv.Itoa(n),
			strconv.FormatFloat(float64(p.P50.Nanoseconds())/1e3, 'f', 1, 64), strconv.FormatFloat(float64(p.P99.Nanoseconds())/1e3, 'f', 1, 64),
			strconv.FormatFloat(cpuPer, 'f', 2, 64), sh})
	}
	return rows, nil
}

// odafsPostmark is the thesis' read-only PostMark (§4.5.1.2, Fig. 16) on
// one machine: files of 4 KiB, each opened once (open delegations), read
// whole at random by a client whose block cache holds a share of them
// (the hit ratio), the misses by request (DAFS, a cache but no
// references) or optimistically through the node's exported cache
// (ODAFS); reads per second and the node's CPU per read.
func odafsPostmark(ctx context.Context, r *runner, c *procCluster, nodePid int, fm fabric.Fabric, files int) ([][]string, error) {
	reads := 20000
	switch {
	case r.repsGiven > 0:
		reads = r.repsGiven
	case r.cfg.Quick:
		reads = 2000
	}
	var rows [][]string
	fmt.Fprintf(r.cfg.Log, "   postmark, %d files of 4 KiB: %-6s %6s %10s %12s\n", files, "mode", "hits", "reads/s", "node CPU/op")
	for _, hit := range []float64{0.25, 0.5, 0.75} {
		cache := int64(hit * float64(files) * odafsBlock)
		for _, mode := range []string{"dafs", "odafs"} {
			o := &odafs.Options{CacheBytes: cache, BlockSize: odafsBlock}
			if mode == "dafs" {
				o.Entries = -1
			}
			cl, err := sdk.New(sdk.Options{Conf: c.conf, MTU: r.cfg.MTU, Fabric: fm, ODAFS: o})
			if err != nil {
				return nil, err
			}
			fs := make([]*sdk.File, files)
			buf := make([]byte, odafsBlock)
			for i := range fs {
				if fs[i], err = cl.Open(ctx, fmt.Sprintf("/pm/%d", i)); err != nil {
					cl.Close()
					return nil, err
				}
				if _, err := fs[i].ReadAt(buf, 0); err != nil { // warm: references, and the cache
					cl.Close()
					return nil, err
				}
			}
			rng := rand.New(rand.NewPCG(7, uint64(hit*100)))
			before := cl.Stats()
			c0, err := procCPU(nodePid)
			if err != nil {
				cl.Close()
				return nil, err
			}
			start := time.Now()
			for range reads {
				if _, err := fs[rng.IntN(files)].ReadAt(buf, 0); err != nil {
					cl.Close()
					return nil, err
				}
			}
			el := time.Since(start)
			c1, err := procCPU(nodePid)
			after := cl.Stats()
			cl.Close()
			if err != nil {
				return nil, err
			}
			perSec := float64(reads) / el.Seconds()
			cpuPer := float64((c1 - c0).Microseconds()) / float64(reads)
			opt := float64(after.Optimistic-before.Optimistic) / float64(reads)
			fmt.Fprintf(r.cfg.Log, "   %-6s %-6s %5.0f%% %10.0f %10.1fµs  (%.0f%% from cache or optimistic)\n", fm, mode, 100*hit, perSec, cpuPer, 100*opt)
			rows = append(rows, []string{"odafs-postmark", mode, string(fm), strconv.FormatFloat(hit, 'f', 2, 64), strconv.Itoa(reads),
				strconv.FormatFloat(perSec, 'f', 0, 64), strconv.FormatFloat(cpuPer, 'f', 2, 64), strconv.FormatFloat(opt, 'f', 3, 64)})
		}
	}
	return rows, nil
}
