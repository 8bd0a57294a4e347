package bench

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

// The repair experiment (issue 6): lose one node holding a share of N
// bytes and time meta restoring full redundancy by itself, for replicas 3
// and RS(4,2), reported as bytes of repaired data per second; and what
// repair costs clients: their write throughput while it runs against the
// same clients' throughput before, with the repair rate unlimited and
// limited (--repair-rate).

// pollEvery is how often the experiment asks meta for its status (the
// times it reports are this coarse).
const pollEvery = 50 * time.Millisecond

// repairRow is one run.
type repairRow struct {
	policy             string
	load               bool  // clients wrote during the repair
	limit              int64 // --repair-rate, bytes/s (0: none)
	data, repaired     int64
	detect, repair     time.Duration // kill to the first repair; first repair to full redundancy
	baseMBs, duringMBs float64
}

func repairBench(ctx context.Context, r *runner) error {
	size := int64(1 << 30)
	if r.cfg.Quick {
		size = 256 << 20
	}
	var rows []repairRow
	for _, pol := range []struct {
		name string
		p    metaapi.Policy
	}{
		{"replicas-3", metaapi.Policy{Replicas: 3, Strategy: plan.Plan{Strategy: plan.Ring}}},
		{"rs-4+2", metaapi.Policy{EC: &metaapi.ErasureCode{Data: 4, Parity: 2, Cell: metaapi.DefaultECCell}}},
	} {
		for _, run := range []struct {
			load  bool
			limit int64
		}{{false, 0}, {true, 0}, {true, 64 << 20}} {
			row, err := r.repairRun(ctx, pol.name, pol.p, size, run.limit, run.load)
			if err != nil {
				return fmt.Errorf("%s, limit %d: %w", pol.name, run.limit, err)
			}
			rows = append(rows, row)
			clients := "no client load"
			if row.load {
				clients = fmt.Sprintf("clients %.0f MB/s during, %.0f before (%.2f)", row.duringMBs, row.baseMBs, row.duringMBs/row.baseMBs)
			}
			fmt.Fprintf(r.cfg.Log, "   %-10s limit %-9s repaired %s in %s (%.2f GiB/s) after %s to notice; %s\n",
				row.policy, limitLabel(row.limit), sizeLabel(row.repaired), row.repair.Round(10*time.Millisecond),
				float64(row.repaired)/(1<<30)/row.repair.Seconds(), row.detect.Round(100*time.Millisecond), clients)
		}
	}
	return r.writeRepair(rows)
}

func limitLabel(l int64) string {
	if l == 0 {
		return "none"
	}
	return sizeLabel(l) + "/s"
}

// repairRun fills a fresh 7-node cluster with size bytes under pol,
// measures clients' write throughput, kills the node holding most, and
// measures the repair and clients meanwhile.
func (r *runner) repairRun(ctx context.Context, name string, pol metaapi.Policy, size, limit int64, withLoad bool) (repairRow, error) {
	row := repairRow{policy: name, limit: limit, data: size, load: withLoad}
	c, err := startClusterWith(ctx, &r.cfg, 7, []string{"--node-timeout", "2s", "--repair-grace", "1s",
		"--repair-rate", strconv.FormatInt(limit, 10)}, nil)
	if err != nil {
		return row, err
	}
	defer c.Close()
	cl, err := sdk.New(sdk.Options{Conf: c.conf})
	if err != nil {
		return row, err
	}
	defer cl.Close()
	if err := prepare(ctx, cl, "/data", pol); err != nil {
		return row, err
	}
	if err := prepare(ctx, cl, "/load", pol); err != nil {
		return row, err
	}
	const file = 64 << 20
	buf := randomData(file)
	for n := int64(0); n < size; n += file {
		if _, err := cl.Put(ctx, r.fileName("/data", "f"), bytes.NewReader(buf[:min(file, size-n)]), 0o644); err != nil {
			return row, err
		}
	}
	// Clients before: two writers of 16 MiB files for a few seconds.
	load := func(stop <-chan struct{}) (float64, error) {
		var bytesDone atomic.Int64
		var firstErr error
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					// A few names, rewritten: the space the load takes stays
					// bounded (each Put replaces a file, whose chunks go).
					p := fmt.Sprintf("/load/w%d-%d", w, i%4)
					if _, err := cl.Put(ctx, p, bytes.NewReader(buf[:16<<20]), 0o644); err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
						return
					}
					bytesDone.Add(16 << 20)
				}
			}()
		}
		wg.Wait()
		return float64(bytesDone.Load()) / 1e6 / time.Since(start).Seconds(), firstErr
	}
	if withLoad {
		// The same status polling as during the repair, so that both
		// measurements bear its cost.
		stop := make(chan struct{})
		go func() {
			for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(pollEvery) {
				cl.Status(ctx)
			}
			close(stop)
		}()
		if row.baseMBs, err = load(stop); err != nil {
			return row, err
		}
	}
	st, err := waitRedundant(ctx, cl, time.Now(), time.Minute)
	if err != nil {
		return row, err
	}
	var victim metaapi.NodeInfo
	for _, n := range st.Nodes {
		if n.Members > victim.Members {
			victim = n
		}
	}
	if err := c.killNode(victim.ID); err != nil {
		return row, err
	}
	killed := time.Now()
	// Clients write on while meta notices, waits out the grace period and
	// repairs; their throughput counts while repairs are running.
	before := st.Repair
	var started, finished time.Time
	for started.IsZero() {
		if s, err := cl.Status(ctx); err == nil && s.Repair.Done+s.Repair.Pending > before.Done {
			started = time.Now()
		}
		if time.Since(killed) > time.Minute {
			return row, fmt.Errorf("no repair started within a minute of losing node %v", victim.ID)
		}
		time.Sleep(pollEvery)
	}
	stopLoad := make(chan struct{})
	during := make(chan float64, 1)
	go func() {
		if !withLoad {
			during <- 0
			return
		}
		mbs, _ := load(stopLoad)
		during <- mbs
	}()
	// Repairs are done when the queue the scan filled is empty.
	for finished.IsZero() {
		if s, err := cl.Status(ctx); err == nil && s.Repair.Pending == 0 && s.Repair.Done > before.Done {
			finished = time.Now()
		}
		if time.Since(started) > 10*time.Minute {
			close(stopLoad)
			return row, fmt.Errorf("repairs still pending 10 minutes after they started")
		}
		time.Sleep(pollEvery)
	}
	close(stopLoad)
	row.duringMBs = <-during
	row.detect, row.repair = started.Sub(killed), finished.Sub(started)
	// A scan after the repairs must find everything whole.
	if st, err = waitRedundant(ctx, cl, finished, 5*time.Minute); err != nil {
		return row, err
	}
	row.repaired = st.Repair.Bytes - before.Bytes
	return row, nil
}

// waitRedundant waits for a scan after since that finds every chunk and
// group whole and nothing pending.
func waitRedundant(ctx context.Context, cl *sdk.Client, since time.Time, timeout time.Duration) (metaapi.StatusResp, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := cl.WaitRepaired(ctx, since)
	if err != nil {
		err = fmt.Errorf("bench: %w", err)
	}
	return st, err
}

func (r *runner) writeRepair(rows []repairRow) error {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].policy < rows[j].policy })
	out := [][]string{{"experiment", "policy", "client_load", "repair_rate_limit", "data_bytes", "repaired_bytes", "detect_s", "repair_s", "repair_gib_per_s",
		"client_mb_per_s_before", "client_mb_per_s_during", "client_ratio"}}
	for _, x := range rows {
		ratio := ""
		if x.load {
			ratio = strconv.FormatFloat(x.duringMBs/x.baseMBs, 'f', 2, 64)
		}
		out = append(out, []string{"repair", x.policy, strconv.FormatBool(x.load), strconv.FormatInt(x.limit, 10), strconv.FormatInt(x.data, 10), strconv.FormatInt(x.repaired, 10),
			strconv.FormatFloat(x.detect.Seconds(), 'f', 2, 64), strconv.FormatFloat(x.repair.Seconds(), 'f', 2, 64),
			strconv.FormatFloat(float64(x.repaired)/(1<<30)/x.repair.Seconds(), 'f', 3, 64),
			strconv.FormatFloat(x.baseMBs, 'f', 1, 64), strconv.FormatFloat(x.duringMBs, 'f', 1, 64), ratio})
	}
	if err := writeCSV(filepath.Join(r.cfg.Out, "repair.csv"), out); err != nil {
		return err
	}
	r.wrote = true
	return nil
}
