package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/sdk"
)

// The odafs experiment's server-throughput part (seed 004 §4.5, issue
// 19: "two clients, 4 to 64 KiB reads, +32% at 4 KiB"): two SDK clients
// in this process, each with several reads outstanding, read a file at
// random for a fixed time per run. The file fits the node's exported
// cache and the clients keep no blocks of their own (no client block
// cache), so every read is served by the node: by a read request
// (DAFS: a client without ODAFS options, see tpLeak) or through the
// references of the node's exported cache (ODAFS). Per read size and
// mode: reads a second (the median of the runs), the node process's CPU
// per read and ODAFS/DAFS (the median of the runs' ratios; the modes
// take turns run by run, so each ratio is of neighbouring runs).

const (
	odafsTPClients     = 2
	odafsTPOutstanding = 4 // reads in flight per client
	// odafsTPStall is how long a read may go on after its run's end
	// before it is cut off and counted as stalled (the shared-memory
	// fabric's optimistic reads have stalled for over a minute).
	odafsTPStall = 10 * time.Second
)

var odafsTPSizes = []int{4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10}

var odafsTPHeader = []string{"experiment", "mode", "fabric", "size_bytes", "clients", "outstanding_per_client", "seconds_per_run", "runs",
	"reads_per_s", "mb_per_s", "node_cpu_us_per_op", "optimistic_share", "slowest_read_ms", "stalled_reads", "odafs_over_dafs"}

// odafsDuration is the length of one throughput run.
func (r *runner) odafsDuration() time.Duration {
	switch {
	case r.cfg.Duration > 0:
		return r.cfg.Duration
	case r.cfg.Quick:
		return time.Second
	}
	return 2 * time.Second
}

// odafsTPFile is the size of the file the throughput part reads: well
// within the node's exported cache of 64 MiB.
func (r *runner) odafsTPFile() int64 {
	if r.cfg.Quick || r.repsGiven > 0 {
		return 4 << 20
	}
	return 16 << 20
}

// odafsTPRuns is the runs per point and mode.
func (r *runner) odafsTPRuns() int {
	if r.cfg.Quick || r.repsGiven > 0 {
		return 3
	}
	return 5
}

// loadAverage is /proc/loadavg's first three fields, for the log: the
// machine is shared.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// tpLeak: DAFS is a client without ODAFS options, not one with
// odafs.Options.Entries negative. With ODAFS options set, every read the
// SDK sends by request (readOptimistic declined it) keeps its pooled
// read buffer (ReadReq plus 128 KiB, registered with the fabric) until
// the client closes — readOptimistic's deferred release sees the piece
// its return statement zeroed — so such a client allocates and zeroes
// 4 MiB per read and grows by as much (docs/benchmarks.md). The node
// cannot tell the two clients apart.

// tpMode is one way of reading: its clients and their open files.
type tpMode struct {
	name  string
	cls   []*sdk.Client
	files []*sdk.File
}

// tpRun is what one run measured.
type tpRun struct {
	reads      int64
	elapsed    time.Duration
	cpu        time.Duration
	optimistic uint64
	slowest    time.Duration
	stalled    int // reads cut off odafsTPStall after the run's end
}

// odafsThroughput runs the throughput part with the clients reaching the
// node by fm; data is /od/tp's content.
func odafsThroughput(ctx context.Context, r *runner, c *procCluster, nodePid int, fm fabric.Fabric, data []byte) ([][]string, error) {
	var modes []*tpMode
	defer func() {
		for _, m := range modes {
			for _, cl := range m.cls {
				cl.Close()
			}
		}
	}()
	for _, name := range []string{"dafs", "odafs"} {
		m := &tpMode{name: name}
		modes = append(modes, m)
		for range odafsTPClients {
			// ReadReq: reads of at most 64 KiB need no more, and each
			// read an ODAFS client sends by request (the warm-up's)
			// holds its pooled buffer until the client closes (see
			// tpLeak).
			o := sdk.Options{Conf: c.conf, MTU: r.cfg.MTU, Fabric: fm, ReadReq: 64 << 10}
			if name == "odafs" {
				o.ODAFS = &odafs.Options{CacheBytes: -1, BlockSize: odafsBlock} // references only
			}
			cl, err := sdk.New(o)
			if err != nil {
				return nil, err
			}
			m.cls = append(m.cls, cl)
			f, err := cl.Open(ctx, "/od/tp")
			if err != nil {
				return nil, err
			}
			m.files = append(m.files, f)
			if err := tpWarm(f, int64(len(data))); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	runs, d := r.odafsTPRuns(), r.odafsDuration()
	fmt.Fprintf(r.cfg.Log, "   throughput, %d clients x %d outstanding, %s file, %d runs of %s: %-5s %8s %12s %10s %12s %6s\n",
		odafsTPClients, odafsTPOutstanding, sizeLabel(int64(len(data))), runs, d, "mode", "size", "reads/s", "MB/s", "node CPU/op", "ratio")
	var rows [][]string
	for _, size := range odafsTPSizes {
		got := map[string][]tpRun{}
		var ratios []float64
		for run := range runs {
			var perSec [2]float64
			for j := range modes {
				i := (run + j) % len(modes) // the modes take turns going first
				m := modes[i]
				x, err := m.run(ctx, nodePid, data, size, d, uint64(run))
				if err != nil {
					return nil, fmt.Errorf("%s, %s reads: %w", m.name, sizeLabel(int64(size)), err)
				}
				got[m.name] = append(got[m.name], x)
				perSec[i] = float64(x.reads) / x.elapsed.Seconds()
			}
			if perSec[0] > 0 {
				ratios = append(ratios, perSec[1]/perSec[0])
			}
		}
		for _, m := range modes {
			var ps []float64
			var reads int64
			var cpu time.Duration
			var opt uint64
			var slowest time.Duration
			stalled := 0
			for _, x := range got[m.name] {
				slowest = max(slowest, x.slowest)
				stalled += x.stalled
				ps = append(ps, float64(x.reads)/x.elapsed.Seconds())
				reads += x.reads
				cpu += x.cpu
				opt += x.optimistic
			}
			perSec := median(ps)
			cpuPer := float64(cpu.Microseconds()) / float64(max(reads, 1))
			share := float64(opt) / float64(max(reads, 1))
			ratio := ""
			if m.name == "odafs" && len(ratios) > 0 {
				ratio = strconv.FormatFloat(median(ratios), 'f', 2, 64)
			}
			fmt.Fprintf(r.cfg.Log, "   %-5s %-5s %8s %12.0f %10.1f %10.1fµs %6s  (%.0f%% optimistic, slowest read %s, %d stalled)\n",
				fm, m.name, sizeLabel(int64(size)), perSec, perSec*float64(size)/1e6, cpuPer, ratio, 100*share, slowest.Round(time.Microsecond), stalled)
			ff := func(v float64, p int) string { return strconv.FormatFloat(v, 'f', p, 64) }
			rows = append(rows, []string{"odafs-throughput", m.name, string(fm), strconv.Itoa(size), strconv.Itoa(odafsTPClients),
				strconv.Itoa(odafsTPOutstanding), ff(d.Seconds(), 3), strconv.Itoa(runs), ff(perSec, 0), ff(perSec*float64(size)/1e6, 1),
				ff(cpuPer, 2), ff(share, 3), ff(float64(slowest.Microseconds())/1e3, 1), strconv.Itoa(stalled), ratio})
		}
	}
	return rows, nil
}

// tpWarm reads every export span (the largest read references cover) of
// f, of size bytes, once: it fills the exported cache and gives an ODAFS
// client its references. The reads are odafsTPOutstanding at a time, so
// the client's connection pool holds a connection for each reader before
// anything is measured.
func tpWarm(f *sdk.File, size int64) error {
	const span = 64 << 10
	var wg sync.WaitGroup
	errs := make([]error, odafsTPOutstanding)
	for g := range odafsTPOutstanding {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, span)
			for off := int64(g) * span; off < size; off += odafsTPOutstanding * span {
				if _, err := f.ReadAt(buf, off); err != nil {
					errs[g] = fmt.Errorf("warming at %d: %w", off, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// run reads size bytes at random offsets (multiples of size) of the
// file, odafsTPOutstanding at a time per client, for d; the node's CPU
// time is read before and after. A run with reads that stall lasts
// until they return, and is counted over that time; a read still going
// odafsTPStall after the run's end is cut off and counted as stalled.
func (m *tpMode) run(ctx context.Context, nodePid int, data []byte, size int, d time.Duration, seed uint64) (tpRun, error) {
	rctx, cancel := context.WithTimeout(ctx, d+odafsTPStall)
	defer cancel()
	var before uint64
	for _, cl := range m.cls {
		before += cl.Stats().Optimistic
	}
	c0, err := procCPU(nodePid)
	if err != nil {
		return tpRun{}, err
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		reads   int64
		slowest time.Duration
		stalled int
		first   error
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range len(m.files) * odafsTPOutstanding {
		f := m.files[w%len(m.files)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			buf := make([]byte, size)
			var n int64
			var err error
			var slow time.Duration
			stall := 0
			for t0 := time.Now(); t0.Before(deadline) && rctx.Err() == nil; t0 = time.Now() {
				off := rng.Int64N(int64(len(data)/size)) * int64(size)
				_, err = f.ReadAtContext(rctx, buf, off)
				slow = max(slow, time.Since(t0))
				if err != nil && rctx.Err() != nil && ctx.Err() == nil {
					stall, err = 1, nil // cut off: the run's time is up
					break
				}
				if err != nil {
					err = fmt.Errorf("read at %d: %w", off, err)
					break
				}
				if n%61 == 0 && !bytes.Equal(buf, data[off:off+int64(size)]) {
					err = fmt.Errorf("read at %d: wrong bytes", off)
					break
				}
				n++
			}
			mu.Lock()
			defer mu.Unlock()
			reads += n
			slowest = max(slowest, slow)
			stalled += stall
			if first == nil {
				first = err
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	c1, err := procCPU(nodePid)
	if first == nil {
		first = err
	}
	if first != nil {
		return tpRun{}, first
	}
	var after uint64
	for _, cl := range m.cls {
		after += cl.Stats().Optimistic
	}
	return tpRun{reads: reads, elapsed: el, cpu: c1 - c0, optimistic: after - before, slowest: slowest, stalled: stalled}, nil
}
