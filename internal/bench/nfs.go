package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// nfsBench: seed 001 §7 — sequential reads of one large file through the
// NFS gateway by read size and read-ahead depth: throughput, and CPU
// seconds per GiB of the client process and of the gateway process
// separately. The client is `sluice nfs-get` (a process of its own, so
// its CPU is its own); the gateway is `sluice nfs`. Only the TCP
// transport exists so far; the fabric transport will be a second mode
// of the same sweep.
func nfsBench(ctx context.Context, r *runner) error {
	size := int64(1 << 30)
	rsizes := []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}
	aheads := []int{0, 1, 4, 16}
	runs := 3
	if r.cfg.Quick {
		size, rsizes, aheads, runs = 256<<20, []int{4 << 10, 64 << 10, 1 << 20}, []int{0, 4}, 1
	}
	c, err := startCluster(ctx, r.cfg.Exe, 3, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	cl, err := client.New(client.Options{Conf: c.conf})
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := prepare(ctx, cl, "/nfs", metaapi.Policy{Replicas: 1, Strategy: metaapi.StrategyRing}); err != nil {
		return err
	}
	if _, err := cl.Put(ctx, "/nfs/f", bytes.NewReader(randomData(size)), 0o644); err != nil {
		return err
	}
	conf := filepath.Join(c.dir, "meta", "client.conf")
	addr, err := c.start(ctx, r.cfg.Exe, "nfs", regexp.MustCompile(`NFSv3 gateway listening on (\S+) `), "nfs", "--listen", "127.0.0.1:0", "--conf", conf)
	if err != nil {
		return err
	}
	gw := c.procs[len(c.procs)-1].cmd.Process.Pid

	type row struct {
		rsize, ahead                int
		mbps, clientCPU, gatewayCPU float64 // MB/s; CPU seconds per GiB
	}
	var rows []row
	gib := float64(size) / (1 << 30)
	for _, rs := range rsizes {
		for _, ra := range aheads {
			var mbps, ccpu, gcpu []float64
			for range runs {
				g0, err := procCPU(gw)
				if err != nil {
					return err
				}
				cmd := exec.CommandContext(ctx, r.cfg.Exe, "nfs-get", "--server", addr, "--rsize", strconv.Itoa(rs),
					"--readahead", strconv.Itoa(ra), "/nfs/f", "-")
				cmd.Stdout = io.Discard
				var errb strings.Builder
				cmd.Stderr = &errb
				start := time.Now()
				if err := cmd.Run(); err != nil {
					return fmt.Errorf("nfs-get rsize %d read-ahead %d: %v: %s", rs, ra, err, errb.String())
				}
				el := time.Since(start)
				g1, err := procCPU(gw)
				if err != nil {
					return err
				}
				st := cmd.ProcessState
				mbps = append(mbps, float64(size)/el.Seconds()/1e6)
				ccpu = append(ccpu, (st.UserTime()+st.SystemTime()).Seconds()/gib)
				gcpu = append(gcpu, (g1-g0).Seconds()/gib)
			}
			x := row{rs, ra, median(mbps), median(ccpu), median(gcpu)}
			rows = append(rows, x)
			fmt.Fprintf(r.cfg.Log, "   tcp  rsize %7d  read-ahead %2d  %7.1f MB/s  client %5.2f s/GiB  gateway %5.2f s/GiB\n",
				x.rsize, x.ahead, x.mbps, x.clientCPU, x.gatewayCPU)
		}
	}
	f, err := os.Create(filepath.Join(r.cfg.Out, "nfs.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write([]string{"experiment", "transport", "read_size", "read_ahead", "file_bytes", "runs", "mb_per_s", "client_cpu_s_per_gib", "gateway_cpu_s_per_gib"})
	for _, x := range rows {
		w.Write([]string{"nfs", "tcp", strconv.Itoa(x.rsize), strconv.Itoa(x.ahead), strconv.FormatInt(size, 10), strconv.Itoa(runs),
			strconv.FormatFloat(x.mbps, 'f', 1, 64), strconv.FormatFloat(x.clientCPU, 'f', 3, 64), strconv.FormatFloat(x.gatewayCPU, 'f', 3, 64)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	r.wrote = true
	return f.Close()
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// procCPU is the user plus system CPU time process pid has used
// (/proc/PID/stat, in clock ticks of 1/100 s on Linux).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: gateway CPU: %w", err)
	}
	// Fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: unreadable /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: unreadable /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
