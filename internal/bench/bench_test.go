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
