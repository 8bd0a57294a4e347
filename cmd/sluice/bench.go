package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/bench"
	"github.com/sluicefs/sluice/internal/chaos"
	"github.com/sluicefs/sluice/internal/cluster"
)

func (a *app) benchCmd() *cobra.Command {
	var (
		cfg     bench.Config
		links   []string
		sizeMiB int64
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
  repair         time to restore full redundancy after losing a node of a 7-node cluster holding 1 GiB,
                 replicas 3 and RS(4,2), repair rate unlimited and 64 MiB/s, with clients' write
                 throughput during repair against before; writes OUT/repair.csv
  nfs            sequential read of a 1 GiB file through the NFS gateway (sluice nfs-get against
                 sluice nfs) by read size (4 KiB-1 MiB) and read-ahead (0-16): MB/s and CPU seconds
                 per GiB of the client and the gateway processes (seed 001 §7); TCP only so far;
                 writes OUT/nfs.csv
  users          what users run against raw loopback TCP measured in the same run: sluice put (of a
                 file and from a pipe) and sluice get processes (a --size-mib file on tmpfs,
                 replicas 1 and 3) against a cluster of separate processes, the SDK's Put and Get
                 beside them, and fio's 1 MiB sequential write (with end fsync) and read of twice
                 that through a sluice mount process (skipped without fio or /dev/fuse); medians
                 of --reps runs (default 5, 3 with --quick) after one warm-up; writes
                 OUT/users.csv with ratios to TCP
  odafs          seed 004's optimistic reads against a node process with an exported cache, over
                 TCP and shared memory, in parts (--part): latency (4 KiB reads by request and
                 optimistically, the node's CPU per read; OUT/odafs.csv), postmark (read-only
                 PostMark at client cache hit ratios of 25-75%, DAFS against ODAFS;
                 OUT/odafs-postmark.csv) and throughput (two clients reading 4-64 KiB at random,
                 4 reads outstanding each, for --duration per run: reads/s, MB/s, the node's CPU
                 per read, ODAFS/DAFS; OUT/odafs-throughput.csv)

Also: sluice bench chaos (fault injection; see its --help).

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
			if cfg.Reps < 0 || cfg.Warmup < 0 || cfg.Duration < 0 {
				return fmt.Errorf("--reps, --warmup and --duration must not be negative")
			}
			if sizeMiB < 1 || sizeMiB > 1<<20 {
				return fmt.Errorf("--size-mib %d: must be 1 to 1048576", sizeMiB)
			}
			cfg.Size = sizeMiB << 20
			return bench.Run(cmd.Context(), cfg, args)
		},
	}
	cmd.Flags().Int64Var(&sizeMiB, "size-mib", bench.DefaultUsersSize>>20, "users: the file size in MiB (fio's file is twice that)")
	cmd.Flags().StringVar(&cfg.Out, "out", "bench-results", "directory for the CSV files and plots")
	cmd.Flags().BoolVar(&cfg.Quick, "quick", false, "only the points the headline comparisons need (under two minutes)")
	cmd.Flags().IntVar(&cfg.Reps, "reps", 0, "measured operations per point (default 30, 12 with --quick)")
	cmd.Flags().IntVar(&cfg.Warmup, "warmup", 0, "unmeasured operations per point (default 5)")
	cmd.Flags().StringSliceVar(&links, "link", nil, "link settings to run (repeatable; default none, 10Gbit+5us and, for replication and goodput, 1Gbit+5us)")
	cmd.Flags().IntVar(&cfg.MTU, "mtu", 0, "MTU of the client (nodes use their default)")
	cmd.Flags().StringSliceVar(&cfg.Parts, "part", nil, "odafs: the parts to run: "+strings.Join(bench.OdafsParts, ", ")+" (default all)")
	cmd.Flags().StringSliceVar(&cfg.Fabrics, "fabric", nil, "odafs: the fabrics the clients use: tcp, shm (default both)")
	cmd.Flags().DurationVar(&cfg.Duration, "duration", 0, "odafs: how long each server-throughput run lasts (default 2s, 1s with --quick)")
	cmd.Flags().StringVar(&cfg.NodeListen, "node-listen", cluster.DefaultNodeListen, "the storage nodes' address: HOST (ports the system picks) or HOST:PORT (node i on PORT+i-1)")
	cmd.AddCommand(a.benchChaosCmd())
	return cmd
}

func (a *app) benchChaosCmd() *cobra.Command {
	var o chaos.Options
	var keep bool
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Fault injection: a workload on replicas 3 and RS(3,2) while nodes and meta are killed -9 and restarted; reports bytes lost (must be 0)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			exe, err := os.Executable()
			if err != nil {
				return err
			}
			o.Binary = exe
			if o.Duration <= 0 || o.Nodes < 5 || o.MaxDown < 1 || o.MaxDown > 2 {
				return fmt.Errorf("--duration must be positive, --nodes at least 5 and --max-down 1 or 2")
			}
			if o.Dir == "" {
				base := "/dev/shm"
				if _, err := os.Stat(base); err != nil {
					base = os.TempDir()
				}
				if o.Dir, err = os.MkdirTemp(base, "sluice-chaos-"); err != nil {
					return err
				}
				if !keep {
					defer os.RemoveAll(o.Dir)
				}
			}
			o.Logf = func(format string, args ...any) { fmt.Fprintf(a.stdout, format+"\n", args...) }
			fmt.Fprintf(a.stdout, "sluice: chaos for %s in %s (%d nodes, seed %d)\n", o.Duration, o.Dir, o.Nodes, o.Seed)
			rep, err := chaos.Run(cmd.Context(), o)
			fmt.Fprintf(a.stdout, "sluice: chaos: %s\n", rep)
			if err != nil {
				return fmt.Errorf("chaos: %w (logs in %s)", err, o.Dir)
			}
			if rep.BytesLost > 0 || rep.WrongReads > 0 {
				return fmt.Errorf("chaos: %d bytes lost, %d wrong reads (logs in %s)", rep.BytesLost, rep.WrongReads, o.Dir)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&o.Duration, "duration", time.Minute, "how long faults are injected")
	cmd.Flags().IntVar(&o.Nodes, "nodes", 5, "storage nodes")
	cmd.Flags().IntVar(&o.MaxDown, "max-down", 1, "nodes down at once at most (the policies tolerate 2)")
	cmd.Flags().DurationVar(&o.MetaEvery, "meta-every", 20*time.Second, "kill -9 and restart meta this often (0: never)")
	cmd.Flags().Uint64Var(&o.Seed, "seed", uint64(time.Now().UnixNano()), "random seed")
	cmd.Flags().StringVar(&o.Dir, "dir", "", "data and logs (default a fresh directory in /dev/shm, removed after)")
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the data and logs")
	return cmd
}
