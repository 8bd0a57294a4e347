package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// connFlags bound a server's inbound connections (see internal/connlimit),
// for `node`, `up`, `meta` and `nfs`.
type connFlags struct {
	max, perHost int
	idle         time.Duration // 0: the server has no such flag
}

// add adds --max-conns and --max-conns-per-host with these defaults, and
// --conn-idle-timeout if idle is not 0.
func (f *connFlags) add(cmd *cobra.Command, max, perHost int, idle time.Duration) {
	cmd.Flags().IntVar(&f.max, "max-conns", max, "inbound connections held at once, those still opening included (negative: no bound)")
	cmd.Flags().IntVar(&f.perHost, "max-conns-per-host", perHost,
		"inbound connections held at once from one host (IPv4 address, IPv6 /64), so one host cannot starve the others; keep it above what one legitimate host opens (negative: no bound)")
	if idle != 0 {
		cmd.Flags().DurationVar(&f.idle, "conn-idle-timeout", idle, "close an inbound connection that has carried nothing for this long, at least 2 minutes (negative: never)")
	}
}

// minIdle is the shortest --conn-idle-timeout: a node sends nothing on a
// connection while it works on its request, and a client waits up to 2
// minutes for a reply; a much shorter timeout would cut slow requests off.
const minIdle = 2 * time.Minute

func (f *connFlags) check() error {
	if f.max == 0 || f.perHost == 0 {
		return fmt.Errorf("--max-conns %d, --max-conns-per-host %d: 0 would refuse every connection (negative: no bound)", f.max, f.perHost)
	}
	if f.idle > 0 && f.idle < minIdle {
		return fmt.Errorf("--conn-idle-timeout %s: below %s it could close connections whose requests are still being served (negative: never)", f.idle, minIdle)
	}
	return nil
}
