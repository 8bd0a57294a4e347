package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/crc32c"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
	"golang.org/x/sys/unix"
)

// The users experiment (issue 18): what users run, against raw loopback
// TCP measured in the same run. `sluice put` and `sluice get` are
// processes of their own (start-up, connecting and the meta round trips
// included, as a user waits for them) against a cluster of separate
// processes; fio writes and reads through a `sluice mount` process. The
// SDK's Put and Get in this process, as the client benchmarks measure
// them, are beside them for comparison.

// DefaultUsersSize is the users experiment's file size: the issue's.
const DefaultUsersSize = 256 << 20

// usersRow is one result: an operation done one way with a policy, the
// median over runs.
type usersRow struct {
	op       string // tcp, floor (floorOnce), put, put-pipe, get, seq-write, seq-read
	replicas int    // 0 for raw TCP
	via      string // loopback, cli, sdk, fuse
	bytes    int64
	mbps     []float64
	cpu      []float64 // CPU seconds per GiB of the CLI process
}

func usersBench(ctx context.Context, r *runner) error {
	size := r.cfg.Size
	if size <= 0 {
		size = DefaultUsersSize
	}
	runs := 5
	if r.cfg.Quick {
		runs = 3
	}
	if r.repsGiven > 0 {
		runs = r.repsGiven
	}
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
	policies := []int{1, 3}
	for _, k := range policies {
		if err := prepare(ctx, cl, fmt.Sprintf("/r%d", k), metaapi.Policy{Replicas: k, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
			return err
		}
	}
	conf := filepath.Join(c.dir, "meta", "client.conf")
	src, got := filepath.Join(c.dir, "src"), filepath.Join(c.dir, "got")
	data := randomData(size)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		return err
	}

	rows := map[string]*usersRow{}
	var order []string
	row := func(op string, k int, via string, n int64) *usersRow {
		key := fmt.Sprintf("%s/%d/%s", op, k, via)
		if rows[key] == nil {
			rows[key] = &usersRow{op: op, replicas: k, via: via, bytes: n}
			order = append(order, key)
		}
		return rows[key]
	}
	// cli runs one command, stdin from in if given (through a pipe, as
	// from another program), and returns its wall and CPU time.
	cli := func(in []byte, args ...string) (time.Duration, float64, error) {
		cmd := exec.CommandContext(ctx, r.cfg.Exe, append([]string{"--conf", conf}, args...)...)
		var errb strings.Builder
		cmd.Stdout, cmd.Stderr = &errb, &errb
		if in != nil {
			cmd.Stdin = bytes.NewReader(in)
		}
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return 0, 0, fmt.Errorf("sluice %s: %v: %s", strings.Join(args, " "), err, errb.String())
		}
		el := time.Since(start)
		ps := cmd.ProcessState
		return el, (ps.UserTime() + ps.SystemTime()).Seconds(), nil
	}
	gib := float64(size) / (1 << 30)
	// op is one way of doing a put or a get: it returns the wall time
	// and, for a process, its CPU seconds.
	type op struct {
		name, via string
		run       func(remote string) (time.Duration, float64, error)
	}
	puts := []op{
		{"put", "cli", func(remote string) (time.Duration, float64, error) { return cli(nil, "put", src, remote) }},
		// From a pipe (another program's output) rather than a file:
		// streamed through buffers, as it cannot be mapped.
		{"put-pipe", "cli", func(remote string) (time.Duration, float64, error) { return cli(data, "put", "-", remote) }},
		// The SDK as the client benchmarks drive it: Put from the same
		// file, Get into a discarding writer.
		{"put", "sdk", func(remote string) (time.Duration, float64, error) {
			f, err := os.Open(src)
			if err != nil {
				return 0, 0, err
			}
			defer f.Close()
			start := time.Now()
			_, err = cl.Put(ctx, remote, f, 0o644)
			return time.Since(start), 0, err
		}},
	}
	gets := []op{
		{"get", "cli", func(remote string) (time.Duration, float64, error) {
			defer os.Remove(got)
			return cli(nil, "get", remote, got)
		}},
		{"get", "sdk", func(remote string) (time.Duration, float64, error) {
			start := time.Now()
			n, err := cl.Get(ctx, remote, io.Discard)
			if err == nil && n != size {
				err = fmt.Errorf("get %s: %d of %d bytes", remote, n, size)
			}
			return time.Since(start), 0, err
		}},
	}
	// One round: raw TCP, then per policy every put and every get, who
	// goes first rotating from round to round, so that each way meets
	// the cluster in each state alike (a removed file's chunks are
	// deleted, and their files kept for reuse, a moment later). The
	// warm-up round (i == 0) is not recorded; it checks the data.
	row("tcp", 0, "loopback", size) // the rows in this order
	row("floor", 0, "loopback", size)
	row("floor", 0, "reused-file", size)
	for _, k := range policies {
		for _, o := range append(puts[:len(puts):len(puts)], gets...) {
			row(o.name, k, o.via, size)
		}
	}
	round := func(i int, measure bool) error {
		tcp, err := tcpOnce(ctx, size)
		if err != nil {
			return err
		}
		floor, err := floorOnce(ctx, c.dir, size, false)
		if err != nil {
			return err
		}
		reused, err := floorOnce(ctx, c.dir, size, true)
		if err != nil {
			return err
		}
		if measure {
			x := row("tcp", 0, "loopback", size)
			x.mbps = append(x.mbps, tcp/1e6)
			x = row("floor", 0, "loopback", size)
			x.mbps = append(x.mbps, floor/1e6)
			x = row("floor", 0, "reused-file", size)
			x.mbps = append(x.mbps, reused/1e6)
		}
		record := func(o op, k int, el time.Duration, cpu float64) {
			if measure {
				x := row(o.name, k, o.via, size)
				x.mbps = append(x.mbps, float64(size)/el.Seconds()/1e6)
				if o.via == "cli" {
					x.cpu = append(x.cpu, cpu/gib)
				}
			}
		}
		for _, k := range policies {
			var stored []string
			for j := range puts {
				o := puts[(i+j)%len(puts)]
				remote := fmt.Sprintf("/r%d/%s-%s-%d", k, o.name, o.via, i)
				el, cpu, err := o.run(remote)
				if err != nil {
					return fmt.Errorf("%s (%s): %w", o.name, o.via, err)
				}
				record(o, k, el, cpu)
				stored = append(stored, remote)
			}
			if !measure {
				if _, _, err := cli(nil, "get", stored[0], got); err != nil {
					return err
				}
				if err := sameFile(got, data); err != nil {
					return fmt.Errorf("get %s: %w", stored[0], err)
				}
			}
			for j := range gets {
				o := gets[(i+j)%len(gets)]
				el, cpu, err := o.run(stored[0])
				if err != nil {
					return fmt.Errorf("%s (%s): %w", o.name, o.via, err)
				}
				record(o, k, el, cpu)
			}
			for _, p := range stored {
				if err := cl.Remove(ctx, p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	fmt.Fprintf(r.cfg.Log, "   %s file, %d runs after one warm-up, sluice put/get processes against a 3-node cluster\n", sizeLabel(size), runs)
	for i := 0; i <= runs; i++ {
		if err := round(i, i > 0); err != nil {
			return err
		}
	}

	if err := r.usersMount(ctx, c, conf, 2*size, runs, policies, row); err != nil {
		return err
	}
	return r.writeUsers(rows, order)
}

// usersMount runs fio's 1 MiB sequential write (ending with an fsync)
// and read of n bytes through a `sluice mount` process, when fio and
// FUSE are there.
func (r *runner) usersMount(ctx context.Context, c *procCluster, conf string, n int64, runs int, policies []int, row func(string, int, string, int64) *usersRow) error {
	if _, err := exec.LookPath("fio"); err != nil {
		fmt.Fprintf(r.cfg.Log, "   skipping the mount part: no fio (Debian: apt-get install fio)\n")
		return nil
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		fmt.Fprintf(r.cfg.Log, "   skipping the mount part: no /dev/fuse (%v)\n", err)
		return nil
	}
	mnt := filepath.Join(c.dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	if _, err := c.start(ctx, r.cfg.Exe, "mount", "mount", mnt, "--conf", conf); err != nil {
		return err
	}
	fmt.Fprintf(r.cfg.Log, "   fio through sluice mount: %s, 1 MiB blocks, %d runs\n", sizeLabel(n), runs)
	for i := 0; i < runs; i++ {
		tcp, err := tcpOnce(ctx, n)
		if err != nil {
			return err
		}
		x := row("tcp", 0, "loopback-fio", n)
		x.mbps = append(x.mbps, tcp/1e6)
		for _, k := range policies {
			file := filepath.Join(mnt, fmt.Sprintf("r%d", k), fmt.Sprintf("fio-%d", i))
			w, err := runFio(ctx, file, "write", 1<<20, n)
			if err != nil {
				return err
			}
			rd, err := runFio(ctx, file, "read", 1<<20, n)
			if err != nil {
				return err
			}
			if err := os.Remove(file); err != nil {
				return err
			}
			x := row("seq-write", k, "fuse", n)
			x.mbps = append(x.mbps, w.bw/1e6)
			x = row("seq-read", k, "fuse", n)
			x.mbps = append(x.mbps, rd.bw/1e6)
		}
	}
	return nil
}

// tcpOnce measures one-stream loopback TCP (bytes per second): n bytes in
// 1 MiB writes to a reader that discards them.
func tcpOnce(ctx context.Context, n int64) (float64, error) {
	return loopbackOnce(ctx, n, func(c net.Conn) (int64, error) {
		return io.CopyBuffer(io.Discard, c, make([]byte, 1<<20))
	})
}

// floorOnce measures the least any store does with what it receives, as
// loopback TCP (bytes per second) into a receiver that keeps the n bytes
// in a file in dir, received straight into its mapped pages (which a
// goroutine populates ahead, as the nodes' direct placement does), with
// a CRC-32C over them: no framing, no metadata, no policy. The file is
// a new one, or with reuse the one the last call with reuse left (as a
// node reuses a deleted chunk's file). Where dir is tmpfs, every page of
// a new file is a fresh one the kernel zeroes first; raw TCP (tcpOnce)
// neither keeps nor zeroes anything.
func floorOnce(ctx context.Context, dir string, n int64, reuse bool) (float64, error) {
	return loopbackOnce(ctx, n, func(c net.Conn) (int64, error) {
		var f *os.File
		var err error
		if reuse {
			f, err = os.OpenFile(filepath.Join(dir, "floor-reused"), os.O_RDWR|os.O_CREATE, 0o600)
		} else {
			f, err = os.CreateTemp(dir, "floor-*")
			if err == nil {
				defer os.Remove(f.Name())
			}
		}
		if err != nil {
			return 0, err
		}
		defer f.Close()
		if err := f.Truncate(n); err != nil {
			return 0, err
		}
		mem, err := unix.Mmap(int(f.Fd()), 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return 0, err
		}
		defer unix.Munmap(mem)
		var stop atomic.Bool
		populated := make(chan struct{})
		go func() {
			defer close(populated)
			for p := int64(0); p < n && !stop.Load(); p += 2 << 20 {
				if unix.Madvise(mem[p:min(n, p+2<<20)], unix.MADV_POPULATE_WRITE) != nil {
					return
				}
			}
		}()
		defer func() { stop.Store(true); <-populated }()
		var got int64
		var sum uint32
		for got < n {
			k, err := c.Read(mem[got:min(n, got+1<<20)])
			sum = crc32c.Update(sum, mem[got:got+int64(k)])
			got += int64(k)
			if err == io.EOF {
				break
			}
			if err != nil {
				return got, err
			}
		}
		_ = sum
		return got, nil
	})
}

// loopbackOnce sends n bytes over one loopback TCP connection in 1 MiB
// writes to recv and returns the throughput (bytes per second).
func loopbackOnce(ctx context.Context, n int64, recv func(net.Conn) (int64, error)) (float64, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{0, err}
			return
		}
		defer c.Close()
		got, err := recv(c)
		done <- result{got, err}
	}()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return 0, err
	}
	buf := randomData(1 << 20)
	for sent := int64(0); sent < n; {
		m := min(int64(len(buf)), n-sent)
		if _, err := c.Write(buf[:m]); err != nil {
			c.Close()
			// A receiver that failed hung up: its error is the cause.
			if res := <-done; res.err != nil {
				err = res.err
			}
			return 0, fmt.Errorf("bench: loopback TCP: %w", err)
		}
		sent += m
	}
	c.Close()
	res := <-done
	el := time.Since(start)
	if res.err == nil && res.n != n {
		res.err = fmt.Errorf("received %d of %d bytes", res.n, n)
	}
	if res.err != nil {
		return 0, fmt.Errorf("bench: loopback TCP: %w", res.err)
	}
	return float64(n) / el.Seconds(), nil
}

// sameFile checks that the file at path holds want.
func sameFile(path string, want []byte) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !bytes.Equal(b, want) {
		return errors.New("the file read back differs from the one stored")
	}
	return nil
}

// writeUsers writes users.csv and its plot: every row's median and its
// ratio to the medians of raw TCP and of the store floor measured
// alongside it (the floor's for the rows of the same size).
func (r *runner) writeUsers(rows map[string]*usersRow, order []string) error {
	ff := func(v float64, p int) string { return strconv.FormatFloat(v, 'f', p, 64) }
	out := [][]string{{"experiment", "op", "replicas", "via", "bytes", "runs", "mb_per_s", "vs_tcp", "cli_cpu_s_per_gib", "vs_floor"}}
	thr := newPanel("what users run, against raw loopback TCP", "replicas", "MB/s (median)")
	ratio := newPanel("ratio to raw TCP in the same run", "replicas", "x TCP")
	for _, p := range []*panel{thr, ratio} {
		p.logX, p.logY = false, false
	}
	fmt.Fprintf(r.cfg.Log, "   %-9s %8s %-12s %10s %7s %12s %8s\n", "op", "replicas", "via", "MB/s", "x TCP", "CPU s/GiB", "x floor")
	for _, key := range order {
		x := rows[key]
		mbps := median(x.mbps)
		tcpKey := "tcp/0/loopback"
		if x.via == "fuse" {
			tcpKey = "tcp/0/loopback-fio"
		}
		vs, cpu, vsFloor := "", "", ""
		if f := rows["floor/0/loopback"]; f != nil && x.op != "tcp" && x.op != "floor" && x.via != "fuse" {
			vsFloor = ff(mbps/median(f.mbps), 2)
		}
		if x.op == "floor" {
			for _, k := range []float64{1, 3} {
				thr.add("store floor ("+x.via+")", k, mbps)
			}
		}
		if t := rows[tcpKey]; t != nil && x.op != "tcp" && x.op != "floor" {
			vs = ff(mbps/median(t.mbps), 2)
			series := x.op + " (" + x.via + ")"
			thr.add(series, float64(x.replicas), mbps)
			ratio.add(series, float64(x.replicas), mbps/median(t.mbps))
		}
		if x.op == "tcp" {
			for _, k := range []float64{1, 3} {
				thr.add("raw TCP ("+x.via+")", k, mbps)
			}
		}
		if len(x.cpu) > 0 {
			cpu = ff(median(x.cpu), 2)
		}
		if t := rows["tcp/0/loopback"]; x.op == "floor" && t != nil {
			vs = ff(mbps/median(t.mbps), 2)
			for _, k := range []float64{1, 3} {
				ratio.add("store floor ("+x.via+")", k, mbps/median(t.mbps))
			}
		}
		fmt.Fprintf(r.cfg.Log, "   %-9s %8d %-12s %10.1f %7s %12s %8s\n", x.op, x.replicas, x.via, mbps, vs, cpu, vsFloor)
		out = append(out, []string{"users", x.op, strconv.Itoa(x.replicas), x.via, strconv.FormatInt(x.bytes, 10),
			strconv.Itoa(len(x.mbps)), ff(mbps, 1), vs, cpu, vsFloor})
	}
	if err := writeCSV(filepath.Join(r.cfg.Out, "users.csv"), out); err != nil {
		return err
	}
	r.wrote = true
	return render(filepath.Join(r.cfg.Out, "users"), [][]*panel{{thr, ratio}})
}
