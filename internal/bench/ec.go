package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Erasure-coding experiments: seed 000 Fig. 15 (encoding latency and
// bandwidth by mode) and TriEC Fig. 10 (recovery time, distributed repair
// against gathering at one node).

var ecCodes = [][2]int{{3, 2}, {6, 3}}

var ecModes = []string{sdk.ECStream, sdk.ECPerChunk, sdk.ECCentral}

// ecSize rounds a write size up to whole stripes of 512-byte-multiple
// cells, so every measured write is a full stripe (as in the seed, where
// a write is one stripe of K units): the cell is the size over K.
func ecSize(size int64, k int) (actual, cell int64) {
	cell = (size/int64(k) + metaapi.MinECCell - 1) / metaapi.MinECCell * metaapi.MinECCell
	cell = max(cell, metaapi.MinECCell)
	return cell * int64(k), cell
}

// wireBytes is the bytes sent on the network per byte written, from the
// protocol (the fallback where loopback traffic cannot be counted): the client sends the data once; streaming and per-chunk data
// units each send every parity unit its partial parity (K·M partials of a
// unit each, M times the data), central encoding sends the M parity units
// from the client (M/K of the data).
func wireBytes(mode string, k, m int) float64 {
	if mode == sdk.ECCentral {
		return 1 + float64(m)/float64(k)
	}
	return 1 + float64(m)
}

// loopbackBytes is the bytes the loopback interface has carried
// (/proc/net/dev), or an error where there is no such count.
func loopbackBytes() (int64, error) {
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			break
		}
		return strconv.ParseInt(f[8], 10, 64) // transmitted bytes
	}
	return 0, fmt.Errorf("bench: no loopback interface in /proc/net/dev")
}

// measureWire writes n full stripes with one lane alone and returns the
// loopback bytes per byte written (TCP/IP headers included; the cluster's
// heartbeats add a little), or the protocol's figure when the machine has
// no loopback count.
func (r *runner) measureWire(ctx context.Context, ln *lane, size int64, n int, k, m int) (float64, bool, error) {
	buf := randomData(size)
	before, err := loopbackBytes()
	if err != nil {
		return wireBytes(ln.mode, k, m), false, nil
	}
	for range n {
		if _, err := ln.f.WriteData(ctx, buf, ln.off); err != nil {
			return 0, false, err
		}
		ln.off += size
	}
	after, err := loopbackBytes()
	if err != nil {
		return wireBytes(ln.mode, k, m), false, nil
	}
	return float64(after-before) / float64(int64(n)*size), true, nil
}

// measureEC writes full stripes with every mode, interleaved, for both
// codes and every size, on a cluster of nine node processes per link. It
// runs once per bench run: ec-latency and ec-bandwidth are two views of
// the same measurements.
func measureEC(ctx context.Context, r *runner) ([]Point, error) {
	if r.shared.ec != nil {
		return r.shared.ec, nil
	}
	const nodes = 9
	sizes := r.sizes(powers(1<<10, 4<<20), []int64{64 << 10, 512 << 10})
	var out []Point
	err := r.onClusters(ctx, r.links(true), nodes, nil, func(c *procCluster, l LinkSpec) error {
		clients := map[string]*sdk.Client{}
		for _, mode := range ecModes {
			cl, err := sdk.NewBench(sdk.Options{Conf: c.conf, MTU: r.cfg.MTU}, sdk.BenchOptions{ECMode: mode, LinkRate: l.Rate, LinkDelay: l.Delay})
			if err != nil {
				return err
			}
			defer cl.Close()
			clients[mode] = cl
		}
		for _, km := range ecCodes {
			k, m := km[0], km[1]
			last := int64(0)
			for _, size := range sizes {
				actual, cell := ecSize(size, k)
				if actual == last {
					continue // two sizes round up to the same stripe
				}
				last = actual
				dir := fmt.Sprintf("/ec-%d-%d-%d", k, m, cell)
				if err := prepare(ctx, clients[sdk.ECStream], dir, metaapi.Policy{EC: &metaapi.ErasureCode{Data: k, Parity: m, Cell: cell}}); err != nil {
					return err
				}
				var lanes []*lane
				for _, mode := range ecModes {
					ln, err := r.openLane(ctx, mode, clients[mode], dir)
					if err != nil {
						return err
					}
					lanes = append(lanes, ln)
				}
				err := r.interleaved(ctx, lanes, actual)
				// Bytes on the wire, each mode alone (a few MiB's worth).
				wire := map[string]float64{}
				for _, ln := range lanes {
					if err != nil {
						break
					}
					wire[ln.mode], _, err = r.measureWire(ctx, ln, actual, int(min(20, max(3, (4<<20)/actual))), k, m)
				}
				closeLanes(ctx, lanes)
				if err != nil {
					return fmt.Errorf("RS(%d,%d): %w", k, m, err)
				}
				for _, ln := range lanes {
					p := Point{Mode: ln.mode, K: k, M: m, Size: actual, Link: l.String(),
						Group: "link " + l.String(), WireBytes: wire[ln.mode]}
					summarize(&p, ln.lat)
					out = append(out, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r.shared.ec = out
	return out, nil
}

// ecLatency: seed 000 Fig. 15 (left) — write latency of full-stripe
// writes by encoding mode.
func ecLatency(ctx context.Context, r *runner) error {
	pts, err := measureEC(ctx, r)
	if err != nil {
		return err
	}
	for _, p := range pts {
		p.Throughput = float64(p.Size) / p.P50.Seconds()
		r.add(p)
	}
	return nil
}

// ecBandwidth: seed 000 Fig. 15 (right) — encoding bandwidth: parity
// bytes generated per second of write latency.
func ecBandwidth(ctx context.Context, r *runner) error {
	pts, err := measureEC(ctx, r)
	if err != nil {
		return err
	}
	for _, p := range pts {
		p.Throughput = float64(p.Size) * float64(p.M) / float64(p.K) / p.P50.Seconds()
		r.add(p)
	}
	return nil
}

// ecRecovery: TriEC Fig. 10 — time to rebuild M lost units of an RS(6,3)
// group at the nodes that hold them, by unit size: distributed repair
// (survivors send partial decodings, the rebuilder XORs) against gathering
// the survivors' units at the rebuilder and decoding there.
func ecRecovery(ctx context.Context, r *runner) error {
	const k, m, nodes = 6, 3, 9
	lost := []int{0, 1, 6} // two data units and a parity unit
	sizes := r.sizes(powers(256<<10, 16<<20), []int64{1 << 20, 4 << 20})
	reps := 7
	if r.cfg.Quick {
		reps = 3
	}
	return r.onClusters(ctx, r.links(false), nodes, nil, func(c *procCluster, l LinkSpec) error {
		cl, err := r.newClient(c, l, "")
		if err != nil {
			return err
		}
		defer cl.Close()
		const cell = 64 << 10
		if err := prepare(ctx, cl, "/rec", metaapi.Policy{EC: &metaapi.ErasureCode{Data: k, Parity: m, Cell: cell}}); err != nil {
			return err
		}
		for _, unit := range sizes {
			path := fmt.Sprintf("/rec/u%d", unit)
			if _, err := cl.Put(ctx, path, bytes.NewReader(randomData(k*unit)), 0o644); err != nil {
				return err
			}
			lat := map[string][]time.Duration{}
			modes := []string{sdk.RepairDistributed, sdk.RepairGather}
			for i := 0; i < 1+reps; i++ {
				for j := range modes {
					mode := modes[(i+j)%len(modes)]
					// Meta fences the group, then has the lost units'
					// nodes rebuild them; the time is the rebuild step's.
					units, err := cl.Rebuild(ctx, path, 0, lost, mode)
					if err != nil {
						return fmt.Errorf("%s rebuild of %d-byte units: %w", mode, unit, err)
					}
					if len(units) != len(lost) {
						return fmt.Errorf("%s rebuild of %d-byte units rebuilt %d units, not %d", mode, unit, len(units), len(lost))
					}
					if i > 0 {
						lat[mode] = append(lat[mode], units[0].Elapsed)
					}
				}
			}
			cl.Remove(ctx, path)
			for _, mode := range modes {
				p := Point{Mode: mode, K: k, M: m, Size: unit, Link: l.String(), Group: "RS(6,3), link " + l.String()}
				summarize(&p, lat[mode])
				p.Throughput = float64(len(lost)) * float64(unit) / p.P50.Seconds()
				r.add(p)
			}
		}
		return nil
	})
}
