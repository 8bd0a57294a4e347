package bench

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// panel is one chart of an experiment's figure.
type panel struct {
	title, xlabel, ylabel string
	logX, logY            bool
	sizeX                 bool // x values are byte sizes: label ticks in KiB/MiB
	series                map[string]plotter.XYs
}

func newPanel(title, xlabel, ylabel string) *panel {
	return &panel{title: title, xlabel: xlabel, ylabel: ylabel, logX: true, logY: true, series: map[string]plotter.XYs{}}
}

func (p *panel) add(series string, x, y float64) {
	if y > 0 && x > 0 {
		p.series[series] = append(p.series[series], plotter.XY{X: x, Y: y})
	}
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// plotExperiment draws the figure for an experiment: one row of panels
// per link setting.
func plotExperiment(out, name string, points []Point) error {
	groups := map[string][]Point{}
	var order []string
	for _, p := range points {
		if _, ok := groups[p.Group]; !ok {
			order = append(order, p.Group)
		}
		groups[p.Group] = append(groups[p.Group], p)
	}
	var rows [][]*panel
	for _, g := range order {
		pts := groups[g]
		var row []*panel
		switch name {
		case "write-latency":
			pl := newPanel("single-replica write, link "+g, "write size", "p50 latency (µs)")
			pl.sizeX = true
			for _, p := range pts {
				pl.add(p.Mode, float64(p.Size), us(p.P50))
			}
			row = append(row, pl)
		case "replication":
			for _, k := range []int{2, 4} {
				pl := newPanel(fmt.Sprintf("K=%d, link %s", k, g), "write size", "p50 latency (µs)")
				pl.sizeX = true
				for _, p := range pts {
					if p.K == k {
						pl.add(p.Mode, float64(p.Size), us(p.P50))
					}
				}
				row = append(row, pl)
			}
			for _, size := range []int64{4 << 10, 512 << 10} {
				pl := newPanel(fmt.Sprintf("%s writes, link %s", sizeLabel(size), g), "replicas K", "p50 latency (µs)")
				pl.logX = false
				for _, p := range pts {
					if p.Size == size {
						pl.add(p.Mode, float64(p.K), us(p.P50))
					}
				}
				row = append(row, pl)
			}
		case "goodput":
			pl := newPanel("node ingest, K=4, link "+g, "write size", "goodput (MB/s)")
			pl.sizeX = true
			for _, p := range pts {
				pl.add(p.Mode, float64(p.Size), p.Throughput/1e6)
			}
			row = append(row, pl)
		case "ec-latency", "ec-bandwidth":
			for _, km := range ecCodes {
				title, ylabel := fmt.Sprintf("full-stripe writes, RS(%d,%d), %s", km[0], km[1], g), "p50 latency (µs)"
				if name == "ec-bandwidth" {
					title, ylabel = fmt.Sprintf("encoding bandwidth, RS(%d,%d), %s", km[0], km[1], g), "parity generated (MB/s)"
				}
				pl := newPanel(title, "write size", ylabel)
				pl.sizeX = true
				for _, p := range pts {
					if p.K != km[0] || p.M != km[1] {
						continue
					}
					if name == "ec-latency" {
						pl.add(p.Mode, float64(p.Size), us(p.P50))
					} else {
						pl.add(p.Mode, float64(p.Size), p.Throughput/1e6)
					}
				}
				row = append(row, pl)
			}
		case "ec-recovery":
			pl := newPanel("rebuild 3 lost units, "+g, "unit size", "p50 time (µs)")
			pl.sizeX = true
			for _, p := range pts {
				pl.add(p.Mode, float64(p.Size), us(p.P50))
			}
			row = append(row, pl)
		case "table-fill":
			lat := newPanel("request table of 4, 64 KiB writes", "concurrent writes", "latency (µs)")
			nack := newPanel("refused busy and retried", "concurrent writes", "NACKs per 100 writes")
			nack.logY = false
			for _, p := range pts {
				lat.add("p50", float64(p.Concurrency), us(p.P50))
				lat.add("p99", float64(p.Concurrency), us(p.P99))
				nack.add("NACKs", float64(p.Concurrency), math.Max(1e-9, 100*float64(p.NACKs)/float64(p.Runs)))
			}
			row = append(row, lat, nack)
		}
		rows = append(rows, row)
	}
	return render(filepath.Join(out, name), rows)
}

// render draws the panels as one tiled figure, in SVG and PNG. Panels
// with no data (not measured in this run) are left out.
func render(base string, all [][]*panel) error {
	var rows [][]*panel
	for _, r := range all {
		var kept []*panel
		for _, p := range r {
			if len(p.series) > 0 {
				kept = append(kept, p)
			}
		}
		if len(kept) > 0 {
			rows = append(rows, kept)
		}
	}
	cols := 0
	for _, r := range rows {
		cols = max(cols, len(r))
	}
	if cols == 0 {
		return nil
	}
	plots := make([][]*plot.Plot, len(rows))
	for i, r := range rows {
		plots[i] = make([]*plot.Plot, cols)
		for j := range cols {
			if j < len(r) {
				p, err := r[j].build()
				if err != nil {
					return err
				}
				plots[i][j] = p
			} else {
				plots[i][j] = plot.New() // empty tile
				plots[i][j].HideAxes()
			}
		}
	}
	w, h := vg.Length(cols)*5*vg.Inch, vg.Length(len(rows))*3.6*vg.Inch
	tiles := draw.Tiles{Rows: len(rows), Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	for _, format := range []string{"svg", "png"} {
		var c vg.CanvasWriterTo
		if format == "svg" {
			c = vgsvg.New(w, h)
		} else {
			c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(110))}
		}
		dc := draw.New(c)
		canvases := plot.Align(plots, tiles, dc)
		for i := range plots {
			for j := range plots[i] {
				plots[i][j].Draw(canvases[i][j])
			}
		}
		f, err := os.Create(base + "." + format)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
}

func (pn *panel) build() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.X.Label.Text = pn.xlabel
	p.Y.Label.Text = pn.ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	names := make([]string, 0, len(pn.series))
	for n := range pn.series {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		pts := pn.series[n]
		sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := palette[i%len(palette)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(n, line, points)
	}
	if pn.logX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if pn.sizeX {
		p.X.Tick.Marker = sizeTicks{}
	}
	if pn.logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks125{}
	}
	if pn.logX || pn.logY {
		// Log axes need positive ranges with some margin.
		p.X.Min, p.X.Max = margin(p.X.Min, p.X.Max, pn.logX)
		p.Y.Min, p.Y.Max = margin(p.Y.Min, p.Y.Max, pn.logY)
	}
	return p, nil
}

func margin(lo, hi float64, log bool) (float64, float64) {
	if !log {
		return lo, hi
	}
	if lo <= 0 {
		lo = hi / 10
	}
	if lo == hi {
		return lo / 2, hi * 2
	}
	return lo / 1.3, hi * 1.3
}

// sizeTicks labels powers of two as 1K, 4K, ..., 1M, 4M.
type sizeTicks struct{}

func (sizeTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for e := 0; e < 40; e++ {
		v := math.Ldexp(1, e)
		if v < min || v > max {
			continue
		}
		label := ""
		if e%2 == 0 {
			label = sizeLabel(int64(v))
		}
		out = append(out, plot.Tick{Value: v, Label: label})
	}
	return out
}

// logTicks125 labels a log axis at 1, 2 and 5 times powers of ten, with
// unlabelled minor ticks in between, so even a narrow range is readable.
type logTicks125 struct{}

func (logTicks125) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for e := math.Floor(math.Log10(min)) - 1; e <= math.Ceil(math.Log10(max)); e++ {
		base := math.Pow(10, e)
		for m := 1; m < 10; m++ {
			v := float64(m) * base
			if v < min || v > max {
				continue
			}
			label := ""
			if m == 1 || m == 2 || m == 5 {
				label = compact(v)
			}
			out = append(out, plot.Tick{Value: v, Label: label})
		}
	}
	return out
}

// compact writes 1500 as 1.5k, 20000 as 20k, 0.5 as 0.5.
func compact(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
