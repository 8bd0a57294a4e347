package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/plan"
	"github.com/sluicefs/sluice/internal/sdk"
)

func (a *app) policyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Set or show a directory's redundancy policy"}
	var (
		replicas int
		strategy string
		ec       string
		cell     int64
	)
	set := &cobra.Command{
		Use:   "set PATH (--replicas K [--strategy S] | --ec K+M [--cell BYTES])",
		Short: "Set the policy new files under directory PATH get",
		Long: `Set the policy new files under directory PATH get: K copies of every
chunk (--replicas), or a Reed-Solomon erasure code (--ec K+M: stripes of K
data cells and M parity cells on K+M distinct nodes; any K of them rebuild
the rest). Existing files keep the policy they were created with.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var pol metaapi.Policy
			switch fl := cmd.Flags(); {
			case fl.Changed("ec") && (fl.Changed("replicas") || fl.Changed("strategy")):
				return fmt.Errorf("--ec and --replicas/--strategy are exclusive: a directory is either replicated or erasure-coded")
			case fl.Changed("ec"):
				code, err := metaapi.ParseEC(ec)
				if err != nil {
					return err
				}
				code.Cell = cell
				pol.EC = &code
			case fl.Changed("cell"):
				return fmt.Errorf("--cell goes with --ec")
			case fl.Changed("replicas"):
				p, err := plan.Parse(strategy)
				if err != nil {
					return err
				}
				pol = metaapi.Policy{Replicas: replicas, Strategy: p}
			default:
				return fmt.Errorf("--replicas is required (or --ec K+M for an erasure code)")
			}
			if err := pol.Validate(); err != nil {
				return err
			}
			need, what := pol.Replicas, fmt.Sprintf("--replicas %d is", pol.Replicas)
			if pol.EC != nil {
				need, what = pol.EC.Units(), fmt.Sprintf("--ec %s needs %d distinct nodes, which is", pol.EC, pol.EC.Units())
			}
			return a.withClient(func(c *sdk.Client) error {
				st, err := c.Status(cmd.Context())
				if err != nil {
					return err
				}
				up := 0
				for _, n := range st.Nodes {
					if n.State == metaapi.NodeUp {
						up++
					}
				}
				if need > up {
					return fmt.Errorf("%s more than the %d storage nodes that are up", what, up)
				}
				return c.SetPolicy(cmd.Context(), args[0], pol)
			})
		},
	}
	set.Flags().IntVar(&replicas, "replicas", 0, "number of copies of each chunk")
	set.Flags().StringVar(&strategy, "strategy", plan.Default.String(), "replication strategy: "+strings.Join(plan.Names(), ", "))
	set.Flags().StringVar(&ec, "ec", "", "erasure code K+M: K data and M parity units per stripe (e.g. 4+2, 6+3, 10+4)")
	set.Flags().Int64Var(&cell, "cell", metaapi.DefaultECCell, "erasure code: bytes of each stripe on each unit (a multiple of 512)")
	get := &cobra.Command{
		Use:   "get PATH",
		Short: "Show the effective policy of PATH and where it comes from",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				pr, err := c.GetPolicy(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				at, err := c.Stat(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if at.Type != metaapi.TypeDir && at.Policy != nil {
					fmt.Fprintf(a.stdout, "%s: %s (fixed when the file was created)\n", args[0], at.Policy)
					return nil
				}
				from := "set here"
				if pr.From != at.Ino {
					from = fmt.Sprintf("inherited from the directory with inode %d", pr.From)
				}
				fmt.Fprintf(a.stdout, "%s: %s (%s)\n", args[0], pr.Policy, from)
				return nil
			})
		},
	}
	cmd.AddCommand(set, get)
	return cmd
}

func (a *app) statusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster: meta address, storage nodes up or down, capacity used",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withClient(func(c *sdk.Client) error {
				st, err := c.Status(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(st)
				}
				fmt.Fprintf(a.stdout, "meta: %s  epoch: %d  files: %d  dirs: %d  chunks: %d\n", st.MetaAddr, st.Epoch, st.Files, st.Dirs, st.Chunks)
				if st.TempFiles > 0 {
					fmt.Fprintf(a.stdout, "temporary files of puts: %d holding up to %s (a writer that died leaves its file until meta's --temp-grace)\n", st.TempFiles, human(st.TempBytes))
				}
				if st.Degraded > 0 {
					fmt.Fprintf(a.stdout, "degraded stripe groups: %d (sluice repair --degraded)\n", st.Degraded)
				}
				a.printRedundancy(st)
				sp := st.Totals
				fmt.Fprintf(a.stdout, "space: %s of %s used (%s reclaimable), %s free, on %d file system(s)\n",
					human(sp.Used), human(sp.Capacity), human(sp.Reclaimable), human(sp.Free), sp.Disks)
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NODE\tADDR\tDOMAIN\tSTATE\tUSED\tRECLAIMABLE\tFREE\tCAPACITY\tCHUNKS\tPLACED\tLAST HEARTBEAT")
				for _, n := range st.Nodes {
					hb := "never"
					if n.LastHeartbeat > 0 {
						hb = time.Since(time.Unix(0, n.LastHeartbeat)).Round(time.Second).String() + " ago"
					}
					state, placed := string(n.State), "-"
					if n.Draining {
						state += ",draining"
					}
					if n.Full {
						state += ",full"
					}
					if n.Members >= 0 {
						placed = strconv.FormatInt(n.Members, 10)
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.ID, n.Addr, n.Domain, state, human(n.Used), human(n.Reclaimable), human(n.Free), human(n.Capacity), n.Chunks, placed, hb)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				for _, n := range st.Nodes {
					if why := blockedText(n.Blocked); why != "" {
						fmt.Fprintf(a.stdout, "draining %v: %s\n", n.ID, why)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

// printRedundancy prints the redundancy tallies and the repair queue,
// with a progress bar and an ETA while repairs are under way.
func (a *app) printRedundancy(st metaapi.StatusResp) {
	r, rp := st.Redundancy, st.Repair
	if w := st.Waiting; w != nil {
		fmt.Fprintf(a.stdout, "redundancy: waiting for nodes (%d of %d reported since meta started)\n", w.Reported, w.Known)
	} else if r.ScannedAt == 0 {
		fmt.Fprintln(a.stdout, "redundancy: not scanned yet")
	} else {
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "REDUNDANCY (%s ago)\tFULL\tREDUCED\tCRITICAL\tUNAVAILABLE\n", time.Since(time.Unix(0, r.ScannedAt)).Round(time.Second))
		for _, row := range []struct {
			name string
			c    metaapi.RedundancyCounts
		}{{"replicated chunks", r.Replicated}, {"stripe groups", r.Striped}} {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", row.name, row.c.Full, row.c.Reduced, row.c.Critical, row.c.Unavailable)
		}
		tw.Flush()
	}
	if rp.Pending == 0 {
		fmt.Fprintf(a.stdout, "repair: idle (%d chunks repaired, %s copied since meta started)\n", rp.Done, human(rp.Bytes))
		return
	}
	for _, b := range rp.Blocked {
		fmt.Fprintf(a.stdout, "repair stuck: %s\n", b)
	}
	if rp.Stuck >= rp.Pending {
		fmt.Fprintf(a.stdout, "repair: stuck (%d chunks or stripe groups wait, no ETA)\n", rp.Pending)
		return
	}
	total := rp.WaveDone + rp.Pending
	const width = 30
	filled := int(int64(width) * rp.WaveDone / max(total, 1))
	eta := "unknown"
	if rp.ETA >= 0 {
		eta = (time.Duration(rp.ETA) * time.Second).String()
	}
	fmt.Fprintf(a.stdout, "repair: [%s%s] %d%% %d/%d chunks, %d running, %s/s, ETA %s\n",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), 100*rp.WaveDone/max(total, 1), rp.WaveDone, total, rp.Running, human(int64(rp.Rate)), eta)
}

func human(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func (a *app) repairCmd() *cobra.Command {
	var (
		mode     string
		degraded bool
	)
	cmd := &cobra.Command{
		Use:   "repair (PATH | --degraded)",
		Short: "Rebuild the lost, stale or unreadable units of an erasure-coded file",
		Long: `Have meta reconcile every stripe group of the erasure-coded file PATH now
and wait: each group's units are fenced at a new epoch and checked, and the
units that are lost (node down, chunk missing), stale or left by an
unfinished write are rebuilt, each at the node that will hold it: in place
when its node is up, on another live node (chosen by meta) when it is down.
Meta repairs such groups by itself too, after --repair-grace; this does it
at once and reports what it rebuilt. --mode distributed (the default) has
each of K survivors send its unit times its decoding coefficient, which the
rebuilding node XORs; --mode gather has them send their units whole for the
rebuilding node to decode alone. --degraded repairs every file with a stripe
group a failed write recorded as degraded (sluice status counts them).
Needs write permission on the file, and a meta that repairs (not started
with --repair-parallel 0).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if degraded != (len(args) == 0) || len(args) > 1 {
				return fmt.Errorf("give one PATH, or --degraded")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if degraded {
				return a.withClient(func(c *sdk.Client) error {
					reps, err := c.RepairDegraded(cmd.Context(), mode)
					for ino, rep := range reps {
						fmt.Fprintf(a.stdout, "inode %d: %d stripe groups checked, %d units rebuilt, %d groups whole again\n", ino, rep.Groups, len(rep.Rebuilt), rep.Cleared)
					}
					if err == nil && len(reps) == 0 {
						fmt.Fprintln(a.stdout, "no stripe group is recorded as degraded")
					}
					return err
				})
			}
			return a.withClient(func(c *sdk.Client) error {
				rep, err := c.Repair(cmd.Context(), args[0], mode)
				for _, u := range rep.Rebuilt {
					where := "in place"
					if u.Moved {
						where = "moved from a node that is down"
					}
					fmt.Fprintf(a.stdout, "group %v: rebuilt unit %d on node %v (%s, %s) in %s\n", u.Group, u.Unit, u.Node, where, human(u.Bytes), u.Elapsed.Round(time.Microsecond))
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "%s: %d stripe groups checked, %d units rebuilt\n", args[0], rep.Groups, len(rep.Rebuilt))
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&mode, "mode", sdk.RepairDistributed, "distributed or gather")
	cmd.Flags().BoolVar(&degraded, "degraded", false, "repair every stripe group recorded as degraded")
	return cmd
}

// blockedText says what keeps a draining node's members from moving.
func blockedText(bs []metaapi.Blocked) string {
	parts := make([]string, 0, len(bs))
	for _, b := range bs {
		parts = append(parts, fmt.Sprintf("%d cannot move: %s", b.Count, b.Why))
	}
	return strings.Join(parts, "; ")
}

// parseNodeID accepts a node id as status prints it ("n3") or bare ("3").
func parseNodeID(s string) (ids.NodeID, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "n"), 10, 32)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("node %q: want a node id such as n3 (see sluice status)", s)
	}
	return ids.NodeID(n), nil
}

func (a *app) revokeNodeCmd() *cobra.Command {
	return a.nodeAdminCmd("revoke NODE",
		"Retire a storage node's identity: meta refuses its certificate from now on (admin)",
		"Retire a storage node's identity: meta refuses every certificate naming the node (a stolen key\n"+
			"included) and takes it for down at once, so its data is repaired elsewhere after --repair-grace.\n"+
			"Drain it first to keep full redundancy throughout. It may join again, keeping its id, with a token\n"+
			"from `sluice join-token --node NODE`.",
		"revoke", "%v's identity is revoked: meta refuses its certificates", (*sdk.Client).RevokeNode)
}

func (a *app) removeNodeCmd() *cobra.Command {
	return a.nodeAdminCmd("remove NODE",
		"Take a drained storage node (or a dead one whose data was repaired elsewhere) out of the cluster for good (admin)",
		"Take a storage node out of the cluster for good: meta forgets it (status no longer lists it, placements\n"+
			"never choose it) and refuses its certificate. Refused while the node is up and not draining, or is still\n"+
			"placed in chunks: drain it first (sluice node drain NODE). Its id may later be given to a new node (--id).",
		"remove", "%v is removed from the cluster", (*sdk.Client).RemoveNode)
}

// nodeAdminCmd is a `sluice node VERB NODE` that makes one call about a
// node and says what it did (done, given the node).
func (a *app) nodeAdminCmd(use, short, long, verb, done string, call func(*sdk.Client, context.Context, ids.NodeID) error) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseNodeID(args[0])
			if err != nil {
				return err
			}
			return a.withClient(func(c *sdk.Client) error {
				if err := call(c, cmd.Context(), id); err != nil {
					return fmt.Errorf("%s %v: %w", verb, id, err)
				}
				fmt.Fprintf(a.stdout, "sluice: "+done+"\n", id)
				return nil
			})
		},
	}
}

func (a *app) drainCmd() *cobra.Command {
	var cancel, noWait bool
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Move every chunk off a storage node before it is removed (progress until it holds none)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseNodeID(args[0])
			if err != nil {
				return err
			}
			return a.withClient(func(c *sdk.Client) error {
				ctx := cmd.Context()
				if err := c.Drain(ctx, id, cancel); err != nil {
					return fmt.Errorf("drain %v: %w", id, err)
				}
				if cancel {
					fmt.Fprintf(a.stdout, "sluice: %v is no longer draining\n", id)
					return nil
				}
				fmt.Fprintf(a.stdout, "sluice: draining %v: its data moves to the other nodes; it gets no new data\n", id)
				if noWait {
					return nil
				}
				asked := time.Now()
				last, total, lastWhy := int64(-2), int64(-1), ""
				for {
					st, err := c.Status(ctx)
					if err != nil {
						return err
					}
					left, why := int64(-1), ""
					for _, n := range st.Nodes {
						if n.ID == id {
							left, why = n.Members, blockedText(n.Blocked)
						}
					}
					if total < 0 && left >= 0 {
						total = left
					}
					fresh := st.Redundancy.ScannedAt > asked.UnixNano()
					if fresh && left == 0 && st.Repair.Pending == 0 {
						fmt.Fprintf(a.stdout, "sluice: %v holds no data any more: it can be stopped and removed\n", id)
						return nil
					}
					if left != last && left >= 0 {
						fmt.Fprintf(a.stdout, "sluice: draining %v: %d of %d members moved, %d left, %d repairs pending\n", id, max(total-left, 0), total, left, st.Repair.Pending)
						last = left
					}
					if why != lastWhy && why != "" {
						fmt.Fprintf(a.stdout, "sluice: draining %v: %s\n", id, why)
					}
					lastWhy = why
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(time.Second):
					}
				}
			})
		},
	}
	cmd.Flags().BoolVar(&cancel, "cancel", false, "stop draining the node (data already moved stays where it is)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return at once instead of following the progress")
	return cmd
}
