package main

import (
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/bench"
)

// TestBenchQuick runs `sluice bench --quick` end to end with a couple of
// repetitions: every experiment starts its clusters as real processes and
// writes a CSV (with the agreed columns) and its plots.
func TestBenchQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several clusters")
	}
	out := filepath.Join(t.TempDir(), "results")
	r := run(t, "", nil, "bench", "--quick", "--reps", "2", "--warmup", "1", "--out", out, "all")
	if r.code != 0 {
		t.Fatalf("bench failed: %s", r)
	}
	wantRows := map[string]int{"write-latency": 16, "replication": 15, "goodput": 6, "table-fill": 3}
	for exp, n := range wantRows {
		rows := readCSV(t, filepath.Join(out, exp+".csv"))
		if strings.Join(rows[0], ",") != strings.Join(bench.CSVHeader, ",") {
			t.Errorf("%s header %v", exp, rows[0])
		}
		if len(rows)-1 != n {
			t.Errorf("%s: %d rows, want %d", exp, len(rows)-1, n)
		}
		links := map[string]bool{}
		for _, row := range rows[1:] {
			if row[0] != exp {
				t.Errorf("%s row names experiment %q", exp, row[0])
			}
			links[row[4]] = true
			if p50, err := strconv.ParseFloat(row[5], 64); err != nil || p50 <= 0 {
				t.Errorf("%s row %v: bad p50", exp, row)
			}
			if runs, _ := strconv.Atoi(row[8]); runs < 2 {
				t.Errorf("%s row %v: %d runs", exp, row, runs)
			}
		}
		if exp != "table-fill" && (!links["none"] || !links["10Gbit/s+5µs"]) {
			t.Errorf("%s: links %v, want with and without emulation", exp, links)
		}
		for _, ext := range []string{".svg", ".png"} {
			if fi, err := os.Stat(filepath.Join(out, exp+ext)); err != nil || fi.Size() == 0 {
				t.Errorf("%s%s: %v", exp, ext, err)
			}
		}
	}
	// Bad input gets a clear error.
	for _, args := range [][]string{
		{"bench", "--out", out, "no-such-experiment"},
		{"bench", "--out", out, "--link", "10parsecs", "goodput"},
		{"bench", "--out", out, "--link", "1Gbit+2s", "goodput"},
	} {
		if r := run(t, "", nil, args...); r.code == 0 || !strings.Contains(r.stderr, "sluice:") {
			t.Errorf("%v: %s", args, r)
		}
	}
}

// TestBenchFuseQuick runs `sluice bench --quick fuse`: fio and the
// metadata test through a real mount, the SDK and a local directory, for
// replicas 1 and 3; every row measured, every mount row with its ratios.
func TestBenchFuseQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two clusters and mounts")
	}
	requireFUSE(t)
	out := filepath.Join(t.TempDir(), "results")
	r := run(t, "", nil, "bench", "--quick", "--out", out, "fuse")
	if r.code != 0 {
		t.Fatalf("bench fuse failed: %s", r)
	}
	rows := readCSV(t, filepath.Join(out, "fuse.csv"))
	if got := strings.Join(rows[0], ","); got != "experiment,op,replicas,via,value,unit,vs_sdk,vs_local,vs_sdk_file" {
		t.Fatalf("header %q", got)
	}
	// 7 operations locally; per policy 7 through the SDK (plus its file
	// API read) and 7 through the mount.
	if len(rows)-1 != 7+2*(7+1+7) {
		t.Fatalf("%d rows, want %d:\n%v", len(rows)-1, 7+2*15, rows)
	}
	for _, row := range rows[1:] {
		if v, err := strconv.ParseFloat(row[4], 64); err != nil || v <= 0 {
			t.Errorf("row %v: value %q", row, row[4])
		}
		if row[3] == "fuse" && (row[6] == "" || row[7] == "") {
			t.Errorf("mount row without ratios: %v", row)
		}
		if row[3] == "fuse" && row[1] == "seq-read" && row[8] == "" {
			t.Errorf("mount read without its ratio to the SDK's file API: %v", row)
		}
	}
}

// TestBenchUsersTiny runs `sluice bench users` at a tiny size with one
// repetition: sluice put (from a file and from a pipe) and sluice get
// processes, the SDK, and fio through a mount when there are fio and
// FUSE, each with a positive figure and its ratio to raw TCP (and, but
// for the mount's, to the store floor) measured in the same run.
func TestBenchUsersTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster and, with fio, a mount")
	}
	out := filepath.Join(t.TempDir(), "results")
	r := run(t, "", nil, "bench", "--size-mib", "2", "--reps", "1", "--out", out, "users")
	if r.code != 0 {
		t.Fatalf("bench users failed: %s", r)
	}
	rows := readCSV(t, filepath.Join(out, "users.csv"))
	if got := strings.Join(rows[0], ","); got != "experiment,op,replicas,via,bytes,runs,mb_per_s,vs_tcp,cli_cpu_s_per_gib,vs_floor" {
		t.Fatalf("header %q", got)
	}
	want := map[string]bool{"tcp/0/loopback": true, "floor/0/loopback": true, "floor/0/reused-file": true}
	for _, k := range []string{"1", "3"} {
		for _, x := range []string{"put-pipe/cli", "put/cli", "get/cli", "put/sdk", "get/sdk"} {
			op, via, _ := strings.Cut(x, "/")
			want[op+"/"+k+"/"+via] = true
		}
	}
	_, noFio := exec.LookPath("fio")
	_, noFuse := os.Stat("/dev/fuse")
	if noFio == nil && noFuse == nil {
		want["tcp/0/loopback-fio"] = true
		for _, k := range []string{"1", "3"} {
			want["seq-write/"+k+"/fuse"], want["seq-read/"+k+"/fuse"] = true, true
		}
	} else if !strings.Contains(string(r.stdout), "skipping the mount part") {
		t.Errorf("no fio or FUSE, and no word of skipping the mount: %s", r.stdout)
	}
	got := map[string]bool{}
	for _, row := range rows[1:] {
		key := row[1] + "/" + row[2] + "/" + row[3]
		got[key] = true
		if !want[key] {
			t.Errorf("unexpected row %v", row)
		}
		if v, err := strconv.ParseFloat(row[6], 64); err != nil || v <= 0 {
			t.Errorf("row %v: MB/s %q", row, row[6])
		}
		if runs, _ := strconv.Atoi(row[5]); runs != 1 {
			t.Errorf("row %v: %d runs, want 1", row, runs)
		}
		if v, err := strconv.ParseFloat(row[7], 64); row[1] != "tcp" && (err != nil || v <= 0) {
			t.Errorf("row %v: ratio to TCP %q", row, row[7])
		}
		if v, err := strconv.ParseFloat(row[8], 64); row[3] == "cli" && (err != nil || v <= 0) {
			t.Errorf("row %v: CLI CPU %q", row, row[8])
		}
		if v, err := strconv.ParseFloat(row[9], 64); (row[3] == "cli" || row[3] == "sdk") && (err != nil || v <= 0) {
			t.Errorf("row %v: ratio to the store floor %q", row, row[9])
		}
	}
	for key := range want {
		if !got[key] {
			t.Errorf("no row %s", key)
		}
	}
	for _, ext := range []string{".svg", ".png"} {
		if fi, err := os.Stat(filepath.Join(out, "users"+ext)); err != nil || fi.Size() == 0 {
			t.Errorf("users%s: %v", ext, err)
		}
	}
	if r := run(t, "", nil, "bench", "--out", out, "--size-mib", "0", "users"); r.code == 0 || !strings.Contains(r.stderr, "--size-mib") {
		t.Errorf("--size-mib 0: %s", r)
	}
}

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return rows
}

// TestBenchODAFSTiny runs `sluice bench odafs` with few reads: a node
// process with an exported cache, 4 KiB reads by request and
// optimistically over TCP and shared memory, each with a latency, the
// node's CPU per read, and (optimistic) the share of reads that went
// optimistically; and the server-throughput part in runs of 20 ms: for
// each fabric, read size and mode a rate, DAFS never optimistic, ODAFS
// always, and ODAFS/DAFS.
func TestBenchODAFSTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	out := filepath.Join(t.TempDir(), "results")
	r := run(t, "", nil, "bench", "--reps", "300", "--duration", "20ms", "--out", out, "odafs")
	if r.code != 0 {
		t.Fatalf("bench odafs failed: %s", r)
	}
	rows := readCSV(t, filepath.Join(out, "odafs.csv"))
	if got := strings.Join(rows[0], ","); got != "experiment,mode,fabric,size_bytes,ops,p50_us,p99_us,node_cpu_us_per_op,optimistic_share" {
		t.Fatalf("header %q", got)
	}
	modes := map[string]bool{}
	for _, row := range rows[1:] {
		modes[row[1]+"/"+row[2]] = true
		if v, err := strconv.ParseFloat(row[5], 64); err != nil || v <= 0 {
			t.Errorf("row %v: p50 %q", row, row[5])
		}
		if row[1] == "optimistic" {
			if v, err := strconv.ParseFloat(row[8], 64); err != nil || v < 0.9 {
				t.Errorf("row %v: only %q of the reads went optimistically", row, row[8])
			}
		}
	}
	if !modes["request/tcp"] || !modes["optimistic/tcp"] || !modes["request/shm"] || !modes["optimistic/shm"] || len(rows) != 5 {
		t.Fatalf("rows %v", rows)
	}

	tp := readCSV(t, filepath.Join(out, "odafs-throughput.csv"))
	if got := strings.Join(tp[0], ","); got != "experiment,mode,fabric,size_bytes,clients,outstanding_per_client,seconds_per_run,runs,reads_per_s,mb_per_s,node_cpu_us_per_op,optimistic_share,slowest_read_ms,stalled_reads,odafs_over_dafs" {
		t.Fatalf("throughput header %q", got)
	}
	points := map[string]bool{}
	for _, row := range tp[1:] {
		points[row[1]+"/"+row[2]+"/"+row[3]] = true
		if v, err := strconv.ParseFloat(row[8], 64); err != nil || v <= 0 {
			t.Errorf("row %v: reads/s %q", row, row[8])
		}
		share, err := strconv.ParseFloat(row[11], 64)
		ratio, rerr := strconv.ParseFloat(row[14], 64)
		switch {
		case err != nil:
			t.Errorf("row %v: optimistic share %q", row, row[11])
		case row[1] == "dafs" && (share != 0 || row[14] != ""):
			t.Errorf("row %v: a DAFS read went optimistically, or a ratio on a DAFS row", row)
		case row[1] == "odafs" && (share < 0.9 || rerr != nil || ratio <= 0):
			t.Errorf("row %v: only %q of the ODAFS reads went optimistically, or ratio %q", row, row[11], row[14])
		}
	}
	for _, m := range []string{"dafs", "odafs"} {
		for _, fm := range []string{"tcp", "shm"} {
			for _, size := range []string{"4096", "65536"} {
				if !points[m+"/"+fm+"/"+size] {
					t.Errorf("no throughput point %s/%s/%s in %v", m, fm, size, tp)
				}
			}
		}
	}
	if len(tp) != 21 {
		t.Errorf("%d throughput rows, want 20", len(tp)-1)
	}
	for _, f := range []string{"odafs-throughput.svg", "odafs-postmark.svg"} {
		if fi, err := os.Stat(filepath.Join(out, f)); err != nil || fi.Size() < 1000 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
