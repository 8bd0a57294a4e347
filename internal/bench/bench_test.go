package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseLink(t *testing.T) {
	for in, want := range map[string]string{
		"none":        "none",
		"10Gbit+5us":  "10Gbit/s+5µs",
		"1Gbit":       "1Gbit/s+0s",
		"800MB/s+1ms": "6.4Gbit/s+1ms",
	} {
		l, err := ParseLink(in)
		if err != nil || l.String() != want {
			t.Errorf("ParseLink(%q) = %v, %v; want %s", in, l, err, want)
		}
	}
	for _, bad := range []string{"10parsecs", "1Gbit+soon", "1bit", "1Gbit+5s"} {
		if _, err := ParseLink(bad); err == nil {
			t.Errorf("ParseLink(%q) accepted", bad)
		}
	}
}

// TestPlotsEveryExperiment renders each experiment's figure from points
// shaped like a real run's, including panels with nothing to show.
func TestPlotsEveryExperiment(t *testing.T) {
	dir := t.TempDir()
	ms := time.Millisecond
	pts := map[string][]Point{
		"write-latency": {{Mode: "stream", K: 1, Size: 4096, P50: ms, Group: "none"}, {Mode: "raw", K: 1, Size: 65536, P50: 2 * ms, Group: "none"}},
		"replication": {{Mode: "ring", K: 4, Size: 512 << 10, P50: 3 * ms, Group: "none"},
			{Mode: "host-ring", K: 4, Size: 512 << 10, P50: 7 * ms, Group: "10Gbit/s+5µs"}},
		"goodput":    {{Mode: "tree", K: 4, Size: 1 << 20, P50: ms, Throughput: 3e8, Group: "none"}},
		"table-fill": {{Mode: "table=4", K: 1, Size: 65536, P50: ms, P99: 9 * ms, Concurrency: 8, NACKs: 3, Runs: 10, Group: "table"}},
	}
	for name, p := range pts {
		if err := plotExperiment(dir, name, p); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, ext := range []string{".svg", ".png"} {
			fi, err := os.Stat(filepath.Join(dir, name+ext))
			if err != nil || fi.Size() < 1000 {
				t.Fatalf("%s%s: %v", name, ext, err)
			}
		}
		svg, _ := os.ReadFile(filepath.Join(dir, name+".svg"))
		if !strings.Contains(string(svg), "µs") && name != "goodput" {
			t.Errorf("%s.svg has no axis label with units", name)
		}
	}
}

// TestPlotsODAFS draws the odafs figures from CSV rows shaped like a
// real run's, a node CPU of 0 among them (shared memory, optimistic).
func TestPlotsODAFS(t *testing.T) {
	dir := t.TempDir()
	pm := [][]string{{"experiment", "mode", "fabric", "hit_ratio", "reads", "reads_per_s", "node_cpu_us_per_op", "served_without_request"},
		{"odafs-postmark", "dafs", "tcp", "0.25", "2000", "4870", "55.00", "0.235"},
		{"odafs-postmark", "odafs", "shm", "0.25", "2000", "154367", "0.00", "1.000"}}
	tp := [][]string{odafsTPHeader,
		{"odafs-throughput", "dafs", "tcp", "4096", "2", "4", "2.000", "5", "10583", "43.3", "36.70", "0.000", "3.1", "0", ""},
		{"odafs-throughput", "odafs", "tcp", "4096", "2", "4", "2.000", "5", "21674", "88.8", "13.40", "1.000", "1.2", "0", "2.31"},
		{"odafs-throughput", "odafs", "shm", "65536", "2", "4", "2.000", "5", "48083", "3151.2", "0.00", "1.000", "0.4", "0", "7.52"}}
	if err := plotODAFSPostmark(filepath.Join(dir, "pm"), pm); err != nil {
		t.Fatal(err)
	}
	if err := plotODAFSThroughput(filepath.Join(dir, "tp"), tp); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"pm.svg", "pm.png", "tp.svg", "tp.png"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Size() < 1000 {
			t.Fatalf("%s: %v", f, err)
		}
	}
	svg, _ := os.ReadFile(filepath.Join(dir, "tp.svg"))
	for _, want := range []string{"reads/s", "µs per read", "odafs, shm", "4KiB"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("tp.svg lacks %q", want)
		}
	}
}
