package bench

import (
	"fmt"
	"slices"
	"strconv"
)

// The odafs experiment's figures, drawn from its CSV rows (the header
// first), so a figure can be redrawn from a CSV file.

// csvColumns returns, for each row after the header, a function giving
// the value of a column by name ("" for a column the header lacks).
func csvColumns(rows [][]string) []func(string) string {
	if len(rows) == 0 {
		return nil
	}
	head := rows[0]
	var out []func(string) string
	for _, row := range rows[1:] {
		out = append(out, func(name string) string {
			i := slices.Index(head, name)
			if i < 0 || i >= len(row) {
				return ""
			}
			return row[i]
		})
	}
	return out
}

func csvFloat(s string) float64 {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0
	}
	return v
}

// plotODAFSPostmark draws odafs-postmark.csv's rows: reads a second and
// the node's CPU per read against the client cache's hit ratio.
func plotODAFSPostmark(base string, rows [][]string) error {
	thr := newPanel("read-only PostMark, 4 KiB files", "client cache hit ratio (%)", "reads/s")
	cpu := newPanel("node process CPU", "client cache hit ratio (%)", "µs per read")
	thr.logX, cpu.logX, cpu.logY = false, false, false
	for _, v := range csvColumns(rows) {
		series := fmt.Sprintf("%s, %s", v("mode"), v("fabric"))
		hit := 100 * csvFloat(v("hit_ratio"))
		thr.add(series, hit, csvFloat(v("reads_per_s")))
		cpu.add(series, hit, max(csvFloat(v("node_cpu_us_per_op")), 1e-3)) // 0 is drawn just above the axis
	}
	return render(base, [][]*panel{{thr, cpu}})
}

// plotODAFSThroughput draws odafs-throughput.csv's rows: reads and bytes
// a second, the node's CPU per read and ODAFS/DAFS against the read size.
func plotODAFSThroughput(base string, rows [][]string) error {
	ops := newPanel("two clients, random reads from the node's exported cache", "read size", "reads/s")
	mbs := newPanel("bytes read", "read size", "MB/s")
	cpu := newPanel("node process CPU", "read size", "µs per read")
	ratio := newPanel("ODAFS / DAFS, reads a second", "read size", "ratio")
	cpu.logY = false
	for _, p := range []*panel{ops, mbs, cpu, ratio} {
		p.sizeX = true
	}
	for _, v := range csvColumns(rows) {
		series := fmt.Sprintf("%s, %s", v("mode"), v("fabric"))
		size := csvFloat(v("size_bytes"))
		ops.add(series, size, csvFloat(v("reads_per_s")))
		mbs.add(series, size, csvFloat(v("mb_per_s")))
		cpu.add(series, size, max(csvFloat(v("node_cpu_us_per_op")), 1e-3))
		if r := csvFloat(v("odafs_over_dafs")); r > 0 {
			ratio.add(v("fabric"), size, r)
		}
	}
	return render(base, [][]*panel{{ops, mbs}, {cpu, ratio}})
}
