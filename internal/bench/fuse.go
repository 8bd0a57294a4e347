package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// The fuse experiment (issue 5): fio through a real mount against the
// same operations through the SDK and on a plain local directory (tmpfs,
// like the nodes' data), with replicas 1 and 3.

// fuseRow is one result: an operation done one way, a median over runs.
type fuseRow struct {
	op       string // seq-write, seq-read, rand-write, rand-read, create, stat, remove
	replicas int    // 0 for the local directory
	via      string // fuse, sdk (streaming Put/Get), sdk-file (1 MiB ReadAt, as fio), local
	value    float64
	unit     string // MB/s or ops/s
}

// fuseSizes are one run's sizes.
type fuseSizes struct {
	seq, rand int64 // bytes of the sequential and random files
	files     int   // metadata test
	workers   int   // metadata test: concurrent callers
	runs      int   // runs per point (median)
}

func fuseBench(ctx context.Context, r *runner) error {
	if _, err := exec.LookPath("fio"); err != nil {
		return errors.New("the fuse experiment runs fio: install it (Debian: apt-get install fio)")
	}
	sz := fuseSizes{seq: 1 << 30, rand: 16 << 20, files: 10000, workers: 4, runs: 3}
	if r.cfg.Quick {
		sz = fuseSizes{seq: 128 << 20, rand: 4 << 20, files: 2000, workers: 4, runs: 1}
	}
	var rows []fuseRow
	add := func(op string, k int, via string, vals []float64, unit string) {
		sort.Float64s(vals)
		rows = append(rows, fuseRow{op, k, via, vals[len(vals)/2], unit})
		fmt.Fprintf(r.cfg.Log, "   %-10s replicas=%d %-5s %10.1f %s\n", op, k, via, vals[len(vals)/2], unit)
	}

	local, err := os.MkdirTemp(tmpfsBase(), "sluice-bench-local-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(local)
	if err := r.fuseSide(ctx, local, "local", 0, sz, add); err != nil {
		return fmt.Errorf("local directory: %w", err)
	}
	for _, k := range []int{1, 3} {
		if err := r.fuseCluster(ctx, k, sz, add); err != nil {
			return fmt.Errorf("replicas %d: %w", k, err)
		}
	}
	return r.writeFuse(rows)
}

// fuseCluster measures one policy: a 3-node cluster, mounted.
func (r *runner) fuseCluster(ctx context.Context, k int, sz fuseSizes, add func(string, int, string, []float64, string)) error {
	c, err := startCluster(ctx, &r.cfg, 3, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	cl, err := sdk.New(sdk.Options{Conf: c.conf})
	if err != nil {
		return err
	}
	defer cl.Close()
	dir := fmt.Sprintf("/r%d", k)
	if err := prepare(ctx, cl, dir, metaapi.Policy{Replicas: k, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
		return err
	}
	mnt := filepath.Join(c.dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	conf := filepath.Join(c.dir, "meta", "client.conf")
	if _, err := c.start(ctx, r.cfg.Exe, "mount", "mount", mnt, "--conf", conf); err != nil {
		return err
	}
	if err := r.sdkSide(ctx, cl, dir, k, sz, add); err != nil {
		return fmt.Errorf("sdk: %w", err)
	}
	if err := r.fuseSide(ctx, filepath.Join(mnt, dir), "fuse", k, sz, add); err != nil {
		return fmt.Errorf("fuse: %w", err)
	}
	return nil
}

// fuseSide runs fio and the metadata test in a directory (a mount or the
// local one).
func (r *runner) fuseSide(ctx context.Context, dir, via string, k int, sz fuseSizes, add func(string, int, string, []float64, string)) error {
	var sw, sr, rw, rr []float64
	for i := 0; i < sz.runs; i++ {
		seq := filepath.Join(dir, fmt.Sprintf("seq-%d", i))
		res, err := runFio(ctx, seq, "write", 1<<20, sz.seq)
		if err != nil {
			return err
		}
		sw = append(sw, res.bw/1e6)
		if res, err = runFio(ctx, seq, "read", 1<<20, sz.seq); err != nil {
			return err
		}
		sr = append(sr, res.bw/1e6)
		os.Remove(seq)
		rnd := filepath.Join(dir, fmt.Sprintf("rand-%d", i))
		if res, err = runFio(ctx, rnd, "randwrite", 4<<10, sz.rand); err != nil {
			return err
		}
		rw = append(rw, res.iops)
		if res, err = runFio(ctx, rnd, "randread", 4<<10, sz.rand); err != nil {
			return err
		}
		rr = append(rr, res.iops)
		os.Remove(rnd)
	}
	add("seq-write", k, via, sw, "MB/s")
	add("seq-read", k, via, sr, "MB/s")
	add("rand-write", k, via, rw, "ops/s")
	add("rand-read", k, via, rr, "ops/s")
	return metaRuns(sz, k, via, add, func(i int) metaOps {
		d := filepath.Join(dir, fmt.Sprintf("meta-%d", i))
		name := func(n int) string { return filepath.Join(d, metaName(n, sz.workers)) }
		return metaOps{
			setup: func() error {
				for w := range sz.workers {
					if err := os.MkdirAll(filepath.Join(d, strconv.Itoa(w)), 0o755); err != nil {
						return err
					}
				}
				return nil
			},
			create: func(n int) error {
				f, err := os.Create(name(n))
				if err == nil {
					err = f.Close()
				}
				return err
			},
			stat: func(n int) error {
				_, err := os.Stat(name(n))
				return err
			},
			remove: func(n int) error { return os.Remove(name(n)) },
		}
	})
}

// sdkSide does the same operations through the SDK: Put and Get for the
// sequential ones (its streaming paths), 4 KiB WriteAt and ReadAt at
// random offsets, and Create, Stat and Remove.
func (r *runner) sdkSide(ctx context.Context, cl *sdk.Client, dir string, k int, sz fuseSizes, add func(string, int, string, []float64, string)) error {
	var sw, sr, sf, rw, rr []float64
	pattern := randomData(16 << 20)
	for i := 0; i < sz.runs; i++ {
		seq := fmt.Sprintf("%s/sdk-seq-%d", dir, i)
		start := time.Now()
		if _, err := cl.Put(ctx, seq, io.LimitReader(&cyclic{b: pattern}, sz.seq), 0o644); err != nil {
			return err
		}
		sw = append(sw, float64(sz.seq)/time.Since(start).Seconds()/1e6)
		start = time.Now()
		if n, err := cl.Get(ctx, seq, io.Discard); err != nil || n != sz.seq {
			return fmt.Errorf("get %s: %d bytes, %v", seq, n, err)
		}
		sr = append(sr, float64(sz.seq)/time.Since(start).Seconds()/1e6)
		// As fio reads: 1 MiB at a time into one buffer, through the
		// SDK's file API (Get above streams into io.Discard, several
		// requests in flight, and never copies to a program's memory).
		sq, err := cl.Open(ctx, seq)
		if err != nil {
			return err
		}
		block := make([]byte, 1<<20)
		start = time.Now()
		for off := int64(0); off < sz.seq; off += int64(len(block)) {
			if _, err := sq.ReadAtContext(ctx, block, off); err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("read %s at %d: %w", seq, off, err)
			}
		}
		sf = append(sf, float64(sz.seq)/time.Since(start).Seconds()/1e6)
		cl.Remove(ctx, seq)

		rnd := fmt.Sprintf("%s/sdk-rand-%d", dir, i)
		if _, err := cl.Put(ctx, rnd, io.LimitReader(&cyclic{b: pattern}, sz.rand), 0o644); err != nil {
			return err
		}
		f, err := cl.Open(ctx, rnd)
		if err != nil {
			return err
		}
		ops := int(sz.rand / 4096)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		buf := make([]byte, 4096)
		start = time.Now()
		for j := 0; j < ops; j++ {
			if _, err := f.WriteAtContext(ctx, pattern[j%1024*4096:][:4096], rng.Int64N(int64(ops))*4096); err != nil {
				return err
			}
		}
		rw = append(rw, float64(ops)/time.Since(start).Seconds())
		start = time.Now()
		for j := 0; j < ops; j++ {
			if _, err := f.ReadAtContext(ctx, buf, rng.Int64N(int64(ops))*4096); err != nil {
				return err
			}
		}
		rr = append(rr, float64(ops)/time.Since(start).Seconds())
		cl.Remove(ctx, rnd)
	}
	add("seq-write", k, "sdk", sw, "MB/s")
	add("seq-read", k, "sdk", sr, "MB/s")
	add("seq-read", k, "sdk-file", sf, "MB/s")
	add("rand-write", k, "sdk", rw, "ops/s")
	add("rand-read", k, "sdk", rr, "ops/s")
	return metaRuns(sz, k, "sdk", add, func(i int) metaOps {
		d := fmt.Sprintf("%s/sdk-meta-%d", dir, i)
		name := func(n int) string { return d + "/" + metaName(n, sz.workers) }
		return metaOps{
			setup: func() error {
				for w := range sz.workers {
					if err := cl.MkdirAll(ctx, d+"/"+strconv.Itoa(w), 0o755); err != nil {
						return err
					}
				}
				return nil
			},
			create: func(n int) error {
				f, err := cl.Create(ctx, name(n), 0o644)
				if err == nil {
					err = f.Close()
				}
				return err
			},
			stat:   func(n int) error { _, err := cl.Stat(ctx, name(n)); return err },
			remove: func(n int) error { return cl.Remove(ctx, name(n)) },
		}
	})
}

// metaName places file n in its worker's directory: as in mdtest's
// unique-directory mode, each caller works in a directory of its own (a
// kernel serialises creates and removes within one directory).
func metaName(n, workers int) string {
	return strconv.Itoa(n%workers) + "/" + strconv.Itoa(n)
}

// metaOps are the metadata test's operations on file n of one run.
type metaOps struct {
	setup                func() error
	create, stat, remove func(n int) error
}

// metaRuns times creating, stating and removing sz.files files with
// sz.workers concurrent callers, sz.runs times.
func metaRuns(sz fuseSizes, k int, via string, add func(string, int, string, []float64, string), mk func(run int) metaOps) error {
	var cr, st, rm []float64
	for i := 0; i < sz.runs; i++ {
		ops := mk(i)
		if err := ops.setup(); err != nil {
			return err
		}
		for _, phase := range []struct {
			f   func(int) error
			out *[]float64
		}{{ops.create, &cr}, {ops.stat, &st}, {ops.remove, &rm}} {
			el, err := parallel(sz.files, sz.workers, phase.f)
			if err != nil {
				return err
			}
			*phase.out = append(*phase.out, float64(sz.files)/el.Seconds())
		}
	}
	add("create", k, via, cr, "ops/s")
	add("stat", k, via, st, "ops/s")
	add("remove", k, via, rm, "ops/s")
	return nil
}

// parallel calls f(0..n-1) from w goroutines, goroutine g taking g,
// g+w, g+2w... (so with metaName each works in its own directory), and
// returns the elapsed time.
func parallel(n, w int, f func(int) error) (time.Duration, error) {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	start := time.Now()
	for g := range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += w {
				if err := f(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start), firstErr
}

// cyclic repeats b forever (an io.Reader of incompressible-looking data
// that costs no generation time).
type cyclic struct {
	b   []byte
	off int
}

func (c *cyclic) Read(p []byte) (int, error) {
	n := copy(p, c.b[c.off:])
	c.off = (c.off + n) % len(c.b)
	return n, nil
}

// fioResult is what one fio job measured.
type fioResult struct {
	bw   float64 // bytes per second
	iops float64
}

// runFio runs one fio job on file: rw is write, read, randwrite or
// randread, in bs blocks over size bytes, with psync I/O through the page
// cache as a program would; writes end with an fsync (durable), reads
// start with the file's cached pages dropped.
func runFio(ctx context.Context, file, rw string, bs, size int64) (fioResult, error) {
	args := []string{"--name=job", "--filename=" + file, "--rw=" + rw, "--bs=" + strconv.FormatInt(bs, 10),
		"--size=" + strconv.FormatInt(size, 10), "--ioengine=psync", "--invalidate=1", "--output-format=json"}
	write := rw == "write" || rw == "randwrite"
	if write {
		args = append(args, "--end_fsync=1")
	}
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, "fio", args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return fioResult{}, fmt.Errorf("fio %s on %s: %v: %s", rw, file, err, errb.String())
	}
	// fio may print notes before the JSON document.
	js := out.Bytes()
	if i := bytes.IndexByte(js, '{'); i > 0 {
		js = js[i:]
	}
	var doc struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				BW   float64 `json:"bw_bytes"`
				IOPS float64 `json:"iops"`
			} `json:"read"`
			Write struct {
				BW   float64 `json:"bw_bytes"`
				IOPS float64 `json:"iops"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(js, &doc); err != nil || len(doc.Jobs) != 1 {
		return fioResult{}, fmt.Errorf("fio %s on %s: unreadable output (%v): %.200s", rw, file, err, out.String())
	}
	j := doc.Jobs[0]
	if j.Error != 0 {
		return fioResult{}, fmt.Errorf("fio %s on %s: job error %d: %s", rw, file, j.Error, errb.String())
	}
	if write {
		return fioResult{j.Write.BW, j.Write.IOPS}, nil
	}
	return fioResult{j.Read.BW, j.Read.IOPS}, nil
}

// writeFuse writes fuse.csv: every row with its ratio to the SDK's figure
// for the same operation and policy, and to the local directory's.
func (r *runner) writeFuse(rows []fuseRow) error {
	find := func(op string, k int, via string) float64 {
		for _, x := range rows {
			if x.op == op && x.replicas == k && x.via == via {
				return x.value
			}
		}
		return 0
	}
	out := [][]string{{"experiment", "op", "replicas", "via", "value", "unit", "vs_sdk", "vs_local", "vs_sdk_file"}}
	ratio := func(a, b float64) string {
		if b == 0 {
			return ""
		}
		return strconv.FormatFloat(a/b, 'f', 2, 64)
	}
	fmt.Fprintf(r.cfg.Log, "   %-10s %8s %12s %8s %8s %12s\n", "op", "replicas", "fuse", "vs sdk", "vs local", "vs sdk file")
	for _, x := range rows {
		vsSDK, vsLocal, vsFile := "", "", ""
		if x.via != "local" {
			vsLocal = ratio(x.value, find(x.op, 0, "local"))
		}
		if x.via == "fuse" {
			vsSDK = ratio(x.value, find(x.op, x.replicas, "sdk"))
			vsFile = ratio(x.value, find(x.op, x.replicas, "sdk-file"))
			fmt.Fprintf(r.cfg.Log, "   %-10s %8d %8.1f %-5s %8s %8s %12s\n", x.op, x.replicas, x.value, x.unit, vsSDK, vsLocal, vsFile)
		}
		out = append(out, []string{"fuse", x.op, strconv.Itoa(x.replicas), x.via, strconv.FormatFloat(x.value, 'f', 1, 64), x.unit, vsSDK, vsLocal, vsFile})
	}
	if err := writeCSV(filepath.Join(r.cfg.Out, "fuse.csv"), out); err != nil {
		return err
	}
	r.wrote = true
	return nil
}
