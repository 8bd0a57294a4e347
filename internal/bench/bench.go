// Package bench runs `sluice bench`: the seed's experiments (seed 000
// Fig. 6, 9, 10) reproduced on one machine. Every experiment starts its
// own cluster of separate processes (one `sluice meta`, N `sluice node`)
// for each link setting — loopback as it is, or an emulated network link
// that makes the network the bottleneck — drives it from a client in this
// process attached through the same kind of link, measures warm-up plus
// several repetitions per point, and writes RESULTS_DIR/<experiment>.csv
// and a plot (.svg and .png).
//
// Latencies are of the data path: a write returns once every replica has
// the data durably (the meta commit that records a file's size is not in
// the measurement, as in the seed, which measures storage-node writes).
package bench

import (
	"context"
	"crypto/rand"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// LinkSpec is an emulated link (or none: plain loopback).
type LinkSpec struct {
	Rate  float64 // bytes per second; 0 = unlimited
	Delay time.Duration
}

// None reports whether no emulation is asked.
func (l LinkSpec) None() bool { return l.Rate == 0 && l.Delay == 0 }

// String names the link in CSV rows and plot titles.
func (l LinkSpec) String() string {
	if l.None() {
		return "none"
	}
	rate := "unlimited"
	if l.Rate > 0 {
		rate = strings.ReplaceAll(fabric.FormatRate(l.Rate), " ", "")
	}
	return rate + "+" + l.Delay.String()
}

// ParseLink reads "none" or "RATE[+DELAY]", e.g. "10Gbit+5us".
func ParseLink(s string) (LinkSpec, error) {
	if s == "none" || s == "" {
		return LinkSpec{}, nil
	}
	rateS, delayS, _ := strings.Cut(s, "+")
	var l LinkSpec
	var err error
	if l.Rate, err = fabric.ParseRate(rateS); err != nil {
		return l, err
	}
	if delayS != "" {
		if l.Delay, err = time.ParseDuration(delayS); err != nil {
			return l, fmt.Errorf("bench: link delay %q: %w", delayS, err)
		}
	}
	if _, err := fabric.NewLink(l.Rate, l.Delay); err != nil {
		return l, err
	}
	return l, nil
}

// Config configures a bench run.
type Config struct {
	Exe    string // the sluice binary clusters are started from
	Out    string // results directory
	Quick  bool   // the reduced set of points (under two minutes)
	Warmup int    // unmeasured operations per point
	Reps   int    // measured operations per point
	// Links overrides the link settings (default: none and 10 Gbit/s + 5
	// µs, and 1 Gbit/s + 5 µs for replication and goodput).
	Links []LinkSpec
	MTU   int
	// NodeListen is where the nodes listen (cluster.NodeListenAddr);
	// default loopback.
	NodeListen string
	Log        io.Writer
	// Size is the users experiment's file size (default
	// DefaultUsersSize; fio's file is twice that).
	Size int64
	// Parts are the odafs experiment's parts to run (OdafsParts; default
	// all).
	Parts []string
	// Duration is how long each run of the odafs server-throughput part
	// lasts (default 2 s, 1 s with Quick); the node's CPU at rest is
	// measured over as long.
	Duration time.Duration
	// Fabrics are the fabrics the odafs experiment's clients use ("tcp",
	// "shm"; default both).
	Fabrics []string
}

// Point is one measured point: one CSV row.
type Point struct {
	Experiment  string
	Mode        string
	K           int
	Size        int64
	Link        string
	P50, P99    time.Duration
	Throughput  float64 // bytes per second
	Runs        int
	Concurrency int // table-fill and goodput
	NACKs       int64
	M           int     // erasure codes: parity units (K is the data units)
	WireBytes   float64 // erasure codes: bytes on the network per byte written (from the protocol)
	Group       string  // which panel of the plot
}

// Experiments lists the experiment names in run order: those "all" runs.
var Experiments = []string{"write-latency", "replication", "goodput", "table-fill", "ec-latency", "ec-bandwidth", "ec-recovery"}

// Extra lists experiments run only by name: fuse needs FUSE and fio;
// repair kills nodes and takes several GiB of tmpfs; users runs command
// processes and, with fio and FUSE, a mount.
var Extra = []string{"fuse", "repair", "nfs", "users", "odafs"}

// Run runs the named experiments ("all" for every one).
func Run(ctx context.Context, cfg Config, names []string) error {
	repsGiven := cfg.Reps
	if cfg.Warmup == 0 {
		cfg.Warmup = 5
	}
	if cfg.Reps == 0 {
		cfg.Reps = 30
		if cfg.Quick {
			cfg.Reps = 12
		}
	}
	if cfg.MTU == 0 {
		cfg.MTU = fabric.DefaultMTU
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return err
	}
	if len(names) == 0 || slices.Contains(names, "all") {
		names = Experiments
	}
	shared := &sharedResults{}
	for _, name := range names {
		run, ok := map[string]func(context.Context, *runner) error{
			"write-latency": writeLatency,
			"replication":   replication,
			"goodput":       goodput,
			"table-fill":    tableFill,
			"ec-latency":    ecLatency,
			"ec-bandwidth":  ecBandwidth,
			"ec-recovery":   ecRecovery,
			"fuse":          fuseBench,
			"repair":        repairBench,
			"nfs":           nfsBench,
			"users":         usersBench,
			"odafs":         odafsBench,
		}[name]
		if !ok {
			return fmt.Errorf("bench: unknown experiment %q (known: %s, all)", name, strings.Join(slices.Concat(Experiments, Extra), ", "))
		}
		r := &runner{cfg: cfg, name: name, shared: shared, repsGiven: repsGiven}
		start := time.Now()
		fmt.Fprintf(cfg.Log, "== %s\n", name)
		if err := run(ctx, r); err != nil {
			return fmt.Errorf("bench %s: %w", name, err)
		}
		took := time.Since(start).Round(time.Second)
		if r.wrote { // an experiment with results of its own shape (fuse)
			fmt.Fprintf(cfg.Log, "   %s: done in %s -> %s\n", name, took, filepath.Join(cfg.Out, name+".csv"))
			continue
		}
		if err := r.write(); err != nil {
			return err
		}
		fmt.Fprintf(cfg.Log, "   %s: %d points in %s -> %s\n", name, len(r.points), took, filepath.Join(cfg.Out, name+".{csv,svg,png}"))
	}
	return nil
}

// runner collects one experiment's points.
type runner struct {
	cfg    Config
	name   string
	points []Point
	shared *sharedResults
	wrote  bool // the experiment wrote its own results (fuse)
	// repsGiven is --reps as given (0: not), for experiments whose
	// default differs from the latency experiments' (users).
	repsGiven int
}

// sharedResults are measurements several experiments of one run report.
type sharedResults struct {
	ec  []Point       // ec-latency and ec-bandwidth
	seq atomic.Uint64 // unique file names; concurrent writers can read the same clock
}

// fileName returns a path in dir no other writer of this run uses.
func (r *runner) fileName(dir, prefix string) string {
	return fmt.Sprintf("%s/%s-%d", dir, prefix, r.shared.seq.Add(1))
}

func (r *runner) links(extra bool) []LinkSpec {
	if len(r.cfg.Links) > 0 {
		return r.cfg.Links
	}
	ls := []LinkSpec{{}, {Rate: 1.25e9, Delay: 5 * time.Microsecond}}
	if extra {
		ls = append(ls, LinkSpec{Rate: 1.25e8, Delay: 5 * time.Microsecond})
	}
	return ls
}

func (r *runner) sizes(full, quick []int64) []int64 {
	if r.cfg.Quick {
		return quick
	}
	return full
}

// powers returns from, 2*from, ... up to to (inclusive).
func powers(from, to int64) []int64 {
	var out []int64
	for s := from; s <= to; s *= 2 {
		out = append(out, s)
	}
	return out
}

func (r *runner) add(p Point) {
	p.Experiment = r.name
	r.points = append(r.points, p)
	extra := ""
	if p.Concurrency > 0 {
		extra = fmt.Sprintf(" conc=%d nacks=%d", p.Concurrency, p.NACKs)
	}
	fmt.Fprintf(r.cfg.Log, "   %-14s k=%d %8s link=%-20s p50 %9s p99 %9s %8.1f MB/s%s\n", p.Mode, p.K, sizeLabel(p.Size), p.Link,
		p.P50.Round(time.Microsecond), p.P99.Round(time.Microsecond), p.Throughput/1e6, extra)
}

// onClusters runs fn on a fresh cluster of n node processes (started
// with the extra node arguments) for each link, closing each after.
func (r *runner) onClusters(ctx context.Context, links []LinkSpec, n int, extra []string, fn func(c *procCluster, l LinkSpec) error) error {
	for _, l := range links {
		c, err := startCluster(ctx, &r.cfg, n, nodeArgs(l, extra...))
		if err != nil {
			return err
		}
		err = fn(c, l)
		c.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// newClient connects to c through a link like the nodes'.
func (r *runner) newClient(c *procCluster, l LinkSpec, protocol string) (*sdk.Client, error) {
	return sdk.NewBench(sdk.Options{Conf: c.conf, MTU: r.cfg.MTU}, sdk.BenchOptions{Protocol: protocol, LinkRate: l.Rate, LinkDelay: l.Delay})
}

// prepare makes a directory with a policy.
func prepare(ctx context.Context, cl *sdk.Client, dir string, pol metaapi.Policy) error {
	if err := cl.MkdirAll(ctx, dir, 0o755); err != nil {
		return err
	}
	return cl.SetPolicy(ctx, dir, pol)
}

// randomData returns n random bytes.
func randomData(n int64) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// latencies writes size bytes warmup+reps times, appending to a new file
// in dir, and returns the measured latencies. The file is removed after.
func (r *runner) latencies(ctx context.Context, cl *sdk.Client, dir string, size int64, reps int) ([]time.Duration, error) {
	path := r.fileName(dir, fmt.Sprintf("lat-%d", size))
	f, err := cl.Create(ctx, path, 0o644)
	if err != nil {
		return nil, err
	}
	defer cl.Remove(context.WithoutCancel(ctx), path)
	buf := randomData(size)
	var out []time.Duration
	var off int64
	for i := 0; i < r.cfg.Warmup+reps; i++ {
		start := time.Now()
		if _, err := f.WriteData(ctx, buf, off); err != nil {
			return nil, err
		}
		if i >= r.cfg.Warmup {
			out = append(out, time.Since(start))
		}
		off += size
	}
	return out, nil
}

// lane is one mode under measurement: a client and the file it appends
// to.
type lane struct {
	mode string
	cl   *sdk.Client
	path string
	f    *sdk.File
	off  int64
	lat  []time.Duration
}

func (r *runner) openLane(ctx context.Context, mode string, cl *sdk.Client, dir string) (*lane, error) {
	path := r.fileName(dir, "lane")
	f, err := cl.Create(ctx, path, 0o644)
	if err != nil {
		return nil, err
	}
	return &lane{mode: mode, cl: cl, path: path, f: f}, nil
}

func closeLanes(ctx context.Context, lanes []*lane) {
	for _, l := range lanes {
		l.cl.Remove(context.WithoutCancel(ctx), l.path)
	}
}

// interleaved writes size bytes warmup+reps times on every lane, the lanes
// taking turns write by write (who goes first rotates), so that every mode
// sees the same machine — the same noise, the same state of the stores —
// and a ratio between modes means what it says.
func (r *runner) interleaved(ctx context.Context, lanes []*lane, size int64) error {
	buf := randomData(size)
	for i := 0; i < r.cfg.Warmup+r.cfg.Reps; i++ {
		for j := range lanes {
			l := lanes[(i+j)%len(lanes)]
			start := time.Now()
			if _, err := l.f.WriteData(ctx, buf, l.off); err != nil {
				return fmt.Errorf("%s, %d bytes: %w", l.mode, size, err)
			}
			if i >= r.cfg.Warmup {
				l.lat = append(l.lat, time.Since(start))
			}
			l.off += size
		}
	}
	return nil
}

// concurrent runs n writers, each appending to its own file, and returns
// every measured latency and the elapsed time of the whole run.
func (r *runner) concurrent(ctx context.Context, cl *sdk.Client, dir string, size int64, n int) ([]time.Duration, time.Duration, error) {
	var (
		mu       sync.Mutex
		all      []time.Duration
		firstErr error
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, err := r.latencies(ctx, cl, dir, size, r.cfg.Reps)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			all = append(all, lat...)
		}()
	}
	wg.Wait()
	return all, time.Since(start), firstErr
}

// summarize fills a point's latency columns.
func summarize(p *Point, lat []time.Duration) {
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	p.Runs = len(s)
	if len(s) == 0 {
		return
	}
	p.P50 = s[len(s)/2]
	p.P99 = s[min(len(s)-1, len(s)*99/100)]
	if p.Throughput == 0 && p.P50 > 0 {
		p.Throughput = float64(p.Size) / p.P50.Seconds()
	}
}

// ---- experiments ----

// CSVHeader is the header row every CSV has.
var CSVHeader = []string{"experiment", "mode", "k", "size_bytes", "link", "p50_us", "p99_us", "throughput_MBps", "runs", "concurrency", "nacks", "m", "wire_bytes_per_byte"}

func (r *runner) write() error {
	rows := [][]string{CSVHeader}
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }
	for _, p := range r.points {
		conc, nacks := "", ""
		if p.Concurrency > 0 {
			conc = strconv.Itoa(p.Concurrency)
		}
		if r.name == "table-fill" {
			nacks = strconv.FormatInt(p.NACKs, 10)
		}
		m, wire := "", ""
		if p.M > 0 {
			m = strconv.Itoa(p.M)
		}
		if p.WireBytes > 0 {
			wire = strconv.FormatFloat(p.WireBytes, 'f', 2, 64)
		}
		rows = append(rows, []string{p.Experiment, p.Mode, strconv.Itoa(p.K), strconv.FormatInt(p.Size, 10), p.Link,
			us(p.P50), us(p.P99), strconv.FormatFloat(p.Throughput/1e6, 'f', 1, 64), strconv.Itoa(p.Runs), conc, nacks, m, wire})
	}
	if err := writeCSV(filepath.Join(r.cfg.Out, r.name+".csv"), rows); err != nil {
		return err
	}
	return plotExperiment(r.cfg.Out, r.name, r.points)
}

// writeCSV writes rows (the header first) to path.
func writeCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.WriteAll(rows) // flushes
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func sizeLabel(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
