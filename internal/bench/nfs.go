package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// nfsBench: seed 001 §7 — sequential reads of one large file, held in
// the gateway's cache, through the NFS gateway by read size and
// read-ahead depth, over TCP and over the fabric transport: throughput,
// CPU seconds per GiB of the client process and of the gateway process
// separately, and bytes copied per byte delivered as the transports
// count them. The client is `sluice nfs-get` (a process of its own, so
// its CPU is its own); the gateway is `sluice nfs`, serving both
// transports from the same cache, so its shared work is identical.
func nfsBench(ctx context.Context, r *runner) error {
	size := int64(1 << 30)
	rsizes := []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}
	aheads := []int{0, 1, 4, 16}
	runs := 3
	if r.cfg.Quick {
		size, rsizes, aheads, runs = 256<<20, []int{4 << 10, 64 << 10, 1 << 20}, []int{0, 4}, 1
	}
	transports := []string{"tcp", "fabric"}
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
	if err := prepare(ctx, cl, "/nfs", metaapi.Policy{Replicas: 1, Strategy: plan.Plan{Strategy: plan.Ring}}); err != nil {
		return err
	}
	if _, err := cl.Put(ctx, "/nfs/f", bytes.NewReader(randomData(size)), 0o644); err != nil {
		return err
	}
	conf := filepath.Join(c.dir, "meta", "client.conf")
	cacheMiB := strconv.FormatInt(size>>20+64, 10)
	ready, err := c.start(ctx, r.cfg.Exe, "nfs",
		"nfs", "--listen", "127.0.0.1:0", "--fabric-listen", "127.0.0.1:0", "--cache-mib", cacheMiB, "--conf", conf,
		// The benchmark only reads, and may run as a user who cannot bind
		// the reserved port a secure export wants.
		"--export", "/ 127.0.0.1(ro,insecure)")
	if err != nil {
		return err
	}
	addr := map[string]string{"tcp": ready.NFS, "fabric": ready.NFSFabric}
	gw := c.procs[len(c.procs)-1].Pid()

	type run struct {
		mbps, clientCPU, gatewayCPU, copies, socketCopies float64
	}
	one := func(tr string, rs, ra int) (run, error) {
		g0, err := procCPU(gw)
		if err != nil {
			return run{}, err
		}
		sf := filepath.Join(c.dir, "nfs-stats.json")
		cmd := exec.CommandContext(ctx, r.cfg.Exe, "nfs-get", "--transport", tr, "--server", addr[tr], "--rsize", strconv.Itoa(rs),
			"--readahead", strconv.Itoa(ra), "--stats-json", sf, "/nfs/f", os.DevNull)
		var errb strings.Builder
		cmd.Stderr = &errb
		if err := cmd.Run(); err != nil {
			return run{}, fmt.Errorf("nfs-get %s rsize %d read-ahead %d: %v: %s", tr, rs, ra, err, errb.String())
		}
		g1, err := procCPU(gw)
		if err != nil {
			return run{}, err
		}
		b, err := os.ReadFile(sf)
		if err != nil {
			return run{}, err
		}
		type server struct {
			TCP    struct{ BytesOut, Copied int64 }
			Fabric struct{ InlineBytes, Copied int64 }
		}
		var st struct {
			Bytes        int64
			Seconds      float64
			ClientTCP    struct{ BytesIn, Copied int64 }                  `json:"client_tcp"`
			ClientFabric struct{ InlineBytes, PulledBytes, Copied int64 } `json:"client_fabric"`
			ServerBefore server                                           `json:"server_before"`
			ServerAfter  server                                           `json:"server_after"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return run{}, err
		}
		if st.Bytes != size || st.Seconds <= 0 {
			return run{}, fmt.Errorf("nfs-get %s read %d of %d bytes", tr, st.Bytes, size)
		}
		gib := float64(size) / (1 << 30)
		ps := cmd.ProcessState
		x := run{
			mbps:       float64(size) / st.Seconds / 1e6,
			clientCPU:  (ps.UserTime() + ps.SystemTime()).Seconds() / gib,
			gatewayCPU: (g1 - g0).Seconds() / gib,
		}
		sa, sb := st.ServerAfter, st.ServerBefore
		var copied, sock int64
		if tr == "tcp" {
			copied = st.ClientTCP.Copied + sa.TCP.Copied - sb.TCP.Copied
			sock = st.ClientTCP.BytesIn + sa.TCP.BytesOut - sb.TCP.BytesOut
		} else {
			copied = st.ClientFabric.Copied + sa.Fabric.Copied - sb.Fabric.Copied
			// Pulled bytes cross the emulation's socket once at each end;
			// inline bytes are counted at both ends already.
			sock = 2*st.ClientFabric.PulledBytes + st.ClientFabric.InlineBytes + sa.Fabric.InlineBytes - sb.Fabric.InlineBytes
		}
		x.copies = float64(copied) / float64(size)
		x.socketCopies = float64(sock) / float64(size)
		return x, nil
	}

	type row struct {
		transport    string
		rsize, ahead int
		run
	}
	var rows []row
	// Warm the gateway's cache (the seed read a file held in the
	// server's cache).
	if _, err := one("tcp", 1<<20, 4); err != nil {
		return err
	}
	for _, rs := range rsizes {
		for _, ra := range aheads {
			var got [2][]run
			// Transports alternate within each point, so drift on this
			// shared machine hits both alike.
			for range runs {
				for i, tr := range transports {
					x, err := one(tr, rs, ra)
					if err != nil {
						return err
					}
					got[i] = append(got[i], x)
				}
			}
			for i, tr := range transports {
				pick := func(f func(run) float64) float64 {
					v := make([]float64, len(got[i]))
					for j, x := range got[i] {
						v[j] = f(x)
					}
					return median(v)
				}
				x := row{tr, rs, ra, run{
					mbps:         pick(func(x run) float64 { return x.mbps }),
					clientCPU:    pick(func(x run) float64 { return x.clientCPU }),
					gatewayCPU:   pick(func(x run) float64 { return x.gatewayCPU }),
					copies:       pick(func(x run) float64 { return x.copies }),
					socketCopies: pick(func(x run) float64 { return x.socketCopies }),
				}}
				rows = append(rows, x)
				fmt.Fprintf(r.cfg.Log, "   %-6s rsize %7d  read-ahead %2d  %7.1f MB/s  client %5.2f s/GiB  gateway %5.2f s/GiB  copied %.3f B/B (+%.2f socket)\n",
					tr, rs, ra, x.mbps, x.clientCPU, x.gatewayCPU, x.copies, x.socketCopies)
			}
		}
	}

	// Peak throughput of each transport, and the ratio.
	peak := map[string]row{}
	for _, x := range rows {
		if x.mbps > peak[x.transport].mbps {
			peak[x.transport] = x
		}
	}
	pt, pf := peak["tcp"], peak["fabric"]
	if pt.mbps > 0 {
		fmt.Fprintf(r.cfg.Log, "   peak: tcp %.1f MB/s (rsize %d, read-ahead %d), fabric %.1f MB/s (rsize %d, read-ahead %d): fabric/tcp %.2fx (seed 001: 1.70x)\n",
			pt.mbps, pt.rsize, pt.ahead, pf.mbps, pf.rsize, pf.ahead, pf.mbps/pt.mbps)
	}

	out := [][]string{{"experiment", "transport", "read_size", "read_ahead", "file_bytes", "runs", "mb_per_s",
		"client_cpu_s_per_gib", "gateway_cpu_s_per_gib", "copied_bytes_per_byte", "socket_bytes_per_byte"}}
	ff := func(v float64, p int) string { return strconv.FormatFloat(v, 'f', p, 64) }
	for _, x := range rows {
		out = append(out, []string{"nfs", x.transport, strconv.Itoa(x.rsize), strconv.Itoa(x.ahead), strconv.FormatInt(size, 10), strconv.Itoa(runs),
			ff(x.mbps, 1), ff(x.clientCPU, 3), ff(x.gatewayCPU, 3), ff(x.copies, 4), ff(x.socketCopies, 3)})
	}
	if err := writeCSV(filepath.Join(r.cfg.Out, "nfs.csv"), out); err != nil {
		return err
	}
	r.wrote = true

	// The figure: throughput at the shallowest and deepest read-ahead,
	// the client's and the gateway's CPU, and copies.
	lo, hi := aheads[0], aheads[len(aheads)-1]
	name := func(x row) string { return fmt.Sprintf("%s, read-ahead %d", x.transport, x.ahead) }
	thr := newPanel("sequential read, 1 GiB held in the gateway's cache", "read size", "MB/s")
	ccpu := newPanel("client process CPU", "read size", "CPU s per GiB")
	gcpu := newPanel("gateway process CPU", "read size", "CPU s per GiB")
	cop := newPanel("copies in memory by the transports", "read size", "bytes copied per byte")
	for _, p := range []*panel{thr, ccpu, gcpu, cop} {
		p.sizeX = true
	}
	cop.logY = false
	for _, x := range rows {
		if x.ahead != lo && x.ahead != hi {
			continue
		}
		thr.add(name(x), float64(x.rsize), x.mbps)
		ccpu.add(name(x), float64(x.rsize), x.clientCPU)
		gcpu.add(name(x), float64(x.rsize), x.gatewayCPU)
		cop.add(name(x), float64(x.rsize), max(x.copies, 1e-4))
	}
	return render(filepath.Join(r.cfg.Out, "nfs"), [][]*panel{{thr, ccpu}, {gcpu, cop}})
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
