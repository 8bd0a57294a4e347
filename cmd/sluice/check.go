package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

func (a *app) checkCmd() *cobra.Command {
	var asJSON, verify, repair bool
	cmd := &cobra.Command{
		Use:   "check [--verify] [--repair]",
		Short: "Check the whole cluster as fsck would: namespace, layouts and what every node holds",
		Long: `check walks meta's namespace and layouts and has every storage node that is
up list the chunks it holds, then reports with counts and examples:
directory entries naming nothing, inodes no directory names, wrong link
counts, chunks and stripe groups some block of which has fewer intact
copies than their policy asks, stripe groups whose units disagree on
version, copies nodes hold that no file needs, chunks past their file's
end. With --verify every node reads every block it holds against its
checksum (a scrub at full speed), so the intact copies counted are known,
not assumed. With --repair it fixes what is safe to fix (entries naming
nothing are removed, unnamed inodes linked into /lost+found, link counts
set, chunks below their policy reconciled) and says what it did. The
exit status is 1 if any problem was found. Only root may run it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withClient(func(c *sdk.Client) error {
				last := time.Now() // quiet for a check that takes a moment
				res, err := c.Check(cmd.Context(), verify, repair, func(st metaapi.CheckResp) {
					if asJSON || time.Since(last) < 2*time.Second {
						return
					}
					last = time.Now()
					done, listed := 0, int64(0)
					for _, n := range st.Nodes {
						listed += n.Listed
						if n.Done {
							done++
						}
					}
					fmt.Fprintf(a.stderr, "checking: %d of %d nodes listed their chunks (%d copies so far)\n", done, len(st.Nodes), listed)
				})
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					if err := enc.Encode(res); err != nil {
						return err
					}
				} else {
					a.printCheck(res)
				}
				var found int64
				for _, p := range res.Problems {
					found += p.Count
				}
				if found > 0 {
					return fmt.Errorf("check found %d problems", found)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&verify, "verify", false, "have every node read every block it holds against its checksum")
	cmd.Flags().BoolVar(&repair, "repair", false, "fix what is safe to fix, and say what was done")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func (a *app) printCheck(r metaapi.CheckResp) {
	reached := 0
	for _, n := range r.Nodes {
		if n.Done {
			reached++
		}
	}
	how := "listed"
	if r.Verify {
		how = "read and verified"
	}
	fmt.Fprintf(a.stdout, "checked %d files, %d directories, %d chunks; %d of %d nodes %s what they hold (%s)\n",
		r.Files, r.Dirs, r.Chunks, reached, len(r.Nodes), how, time.Duration(r.Done-r.Started).Round(time.Millisecond))
	if len(r.Problems) == 0 {
		fmt.Fprintln(a.stdout, "no problems found")
		return
	}
	for _, p := range r.Problems {
		fmt.Fprintf(a.stdout, "%s: %d\n", p.Kind, p.Count)
		for _, e := range p.Examples {
			fmt.Fprintf(a.stdout, "  %s\n", e)
		}
		if p.Count > int64(len(p.Examples)) && len(p.Examples) > 0 {
			fmt.Fprintf(a.stdout, "  ... and %d more\n", p.Count-int64(len(p.Examples)))
		}
		switch {
		case p.Repaired > 0:
			fmt.Fprintf(a.stdout, "  repaired %d: %s\n", p.Repaired, p.Action)
		case p.Action != "":
			fmt.Fprintf(a.stdout, "  %s\n", p.Action)
		}
	}
}
