package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/bench"
)

func (a *app) benchCmd() *cobra.Command {
	var (
		cfg   bench.Config
		links []string
	)
	cmd := &cobra.Command{
		Use:   "bench [EXPERIMENT...|all]",
		Short: "Reproduce the seed's experiments: " + strings.Join(bench.Experiments, ", ") + " (CSV and plots)",
		Long: `Runs the experiments of seed 000 on this machine. Every experiment starts
its own cluster (meta and storage nodes as separate processes) for each
link setting, runs warm-up plus repetitions per point, and writes
OUT/<experiment>.csv with a plot (.svg and .png).

Experiments:
  write-latency  single-replica write latency vs size by protocol: raw, stream, rpc, rpc-pull (Fig. 6)
  replication    latency vs size for K=2 and K=4 and vs K, every strategy (Fig. 9, 10)
  goodput        bytes per second a node ingests vs write size, ring and tree (Fig. 9 right)
  table-fill     latency and busy NACKs as concurrent writes fill the request table
  ec-latency     full-stripe write latency vs size, RS(3,2) and RS(6,3): stream, per-chunk, central (Fig. 15 left)
  ec-bandwidth   parity bytes generated per second vs write size, same runs (Fig. 15 right)
  ec-recovery    time to rebuild 3 lost units of RS(6,3) vs unit size: distributed vs gather (TriEC Fig. 10)

Run by name only (not by "all"):
  fuse           fio and a metadata test through a FUSE mount vs the SDK vs a local tmpfs directory,
                 replicas 1 and 3 (needs /dev/fuse and fio); writes OUT/fuse.csv

Links: "none" (loopback as it is) or RATE[+DELAY], e.g. 10Gbit+5us.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			cfg.Exe = exe
			cfg.Log = a.stdout
			for _, s := range links {
				l, err := bench.ParseLink(s)
				if err != nil {
					return err
				}
				cfg.Links = append(cfg.Links, l)
			}
			if cfg.Reps < 0 || cfg.Warmup < 0 {
				return fmt.Errorf("--reps and --warmup must not be negative")
			}
			return bench.Run(cmd.Context(), cfg, args)
		},
	}
	cmd.Flags().StringVar(&cfg.Out, "out", "bench-results", "directory for the CSV files and plots")
	cmd.Flags().BoolVar(&cfg.Quick, "quick", false, "only the points the headline comparisons need (under two minutes)")
	cmd.Flags().IntVar(&cfg.Reps, "reps", 0, "measured operations per point (default 30, 12 with --quick)")
	cmd.Flags().IntVar(&cfg.Warmup, "warmup", 0, "unmeasured operations per point (default 5)")
	cmd.Flags().StringSliceVar(&links, "link", nil, "link settings to run (repeatable; default none, 10Gbit+5us and, for replication and goodput, 1Gbit+5us)")
	cmd.Flags().IntVar(&cfg.MTU, "mtu", 0, "MTU of the client (nodes use their default)")
	return cmd
}
