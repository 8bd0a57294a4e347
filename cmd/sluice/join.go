package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// envJoin is the environment variable `sluice node` takes its join
// token from when --join is not given (a command line is visible to
// every user of the host; the environment is not).
const envJoin = "SLUICE_JOIN_TOKEN"

func (a *app) joinTokenCmd() *cobra.Command {
	var (
		ttl  time.Duration
		node string
	)
	cmd := &cobra.Command{
		Use:   "join-token",
		Short: "Create a one-time token a new storage node joins the cluster with (admin)",
		Long: "Create a one-time join token: `sluice node --join TOKEN` uses it once to join the cluster and get\n" +
			"its certificate. The token also pins the cluster CA, so the node verifies it reached this cluster's meta.\n" +
			"It is printed alone on standard output; keep it secret until it is used or expired.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if ttl <= 0 || ttl > time.Duration(metaapi.MaxJoinTTL) {
				return fmt.Errorf("--ttl %s: must be positive and at most %s", ttl, time.Duration(metaapi.MaxJoinTTL))
			}
			var id ids.NodeID
			if node != "" {
				var err error
				if id, err = parseNodeID(node); err != nil {
					return err
				}
			}
			return a.withClient(func(c *sdk.Client) error {
				resp, err := c.JoinToken(cmd.Context(), ttl, id)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, resp.Token)
				fmt.Fprintf(a.stderr, "sluice: join token valid once, until %s\n", time.Unix(0, resp.Expires).UTC().Format(time.RFC3339))
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token stays valid")
	cmd.Flags().StringVar(&node, "node", "", "a token for this existing node (e.g. n3) to join again keeping its id and data: one that lost its credentials, or set up before TLS")
	return cmd
}
