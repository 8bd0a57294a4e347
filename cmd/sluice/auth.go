package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// `sluice auth`: principals, each a client.conf with its own rights.

func (a *app) authCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "auth",
		Short: "Manage principals: who may use the cluster, as which uids, where (admin)",
	}
	cmd.AddCommand(a.authAddCmd(), a.authLsCmd(), a.authRotateCmd(), a.authRmCmd(), a.authWhoamiCmd())
	return cmd
}

// confOut says where a new credential's client config goes.
type confOut struct {
	path, owner string
}

func (o *confOut) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.path, "conf-out", "", "write the principal's client config to FILE (mode 0600) instead of standard output")
	cmd.Flags().StringVar(&o.owner, "conf-owner", "", "with --conf-out: give the file (and directories made for it) to this USER[:GROUP] (names or numbers)")
}

// write renders the client config for a new credential, based on the
// caller's own (same cluster address and trust).
func (a *app) writeConf(o confOut, resp metaapi.AuthCredResp) error {
	conf, err := config.Load(config.Find(a.confPath))
	if err != nil {
		return err
	}
	conf.ClientID, conf.Credential, conf.Principal = uint64(resp.Principal.ID), resp.Credential, resp.Principal.Name
	if o.path == "" {
		if o.owner != "" {
			return fmt.Errorf("--conf-owner needs --conf-out")
		}
		raw, err := json.MarshalIndent(conf, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(a.stdout, "%s\n", raw)
		return err
	}
	uid, gid := -1, -1
	if o.owner != "" {
		if uid, gid, err = lookupOwner(o.owner); err != nil {
			return err
		}
	}
	made, err := mkdirsFor(o.path)
	if err != nil {
		return err
	}
	if err := config.Save(o.path, conf); err != nil {
		return err
	}
	if uid >= 0 {
		for _, p := range append(made, o.path) {
			if err := os.Lchown(p, uid, gid); err != nil {
				return fmt.Errorf("giving %s to %s: %w", p, o.owner, err)
			}
		}
	}
	fmt.Fprintf(a.stderr, "sluice: wrote the client config of principal %q to %s\n", resp.Principal.Name, o.path)
	return nil
}

// mkdirsFor makes the missing directories above path (mode 0700) and
// returns them.
func mkdirsFor(path string) ([]string, error) {
	var made []string
	for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(dir); err == nil || dir == filepath.Dir(dir) {
			break
		}
		made = append([]string{dir}, made...)
	}
	for _, d := range made {
		if err := os.Mkdir(d, 0o700); err != nil && !os.IsExist(err) {
			return nil, fmt.Errorf("making %s: %w", d, err)
		}
	}
	return made, nil
}

func lookupOwner(spec string) (uid, gid int, err error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	u, err := user.Lookup(name)
	if err != nil {
		if u, err = user.LookupId(name); err != nil {
			return 0, 0, fmt.Errorf("--conf-owner: no user %q", name)
		}
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	if hasGroup {
		g, err := user.LookupGroup(group)
		if err != nil {
			if g, err = user.LookupGroupId(group); err != nil {
				return 0, 0, fmt.Errorf("--conf-owner: no group %q", group)
			}
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	return uid, gid, nil
}

func (a *app) authAddCmd() *cobra.Command {
	var (
		r                     metaapi.Rights
		uids, gids            string
		rootSquash, allSquash bool
		out                   confOut
	)
	cmd := &cobra.Command{
		Use:   "add NAME",
		Short: "Add a principal and print (or write) its client config",
		Long: `Add a principal and print (or write, with --conf-out) the client config
holding its credential. Meta keeps only a hash of the credential: this is the
only time it is shown. The principal acts only as the uids (and gids) it is
given, sees only its --path (as "/"), and only --admin principals drain nodes,
run checks or manage principals.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if r.UIDs, err = metaapi.ParseIDRanges(uids); err != nil {
				return fmt.Errorf("--uids: %w", err)
			}
			if r.GIDs, err = metaapi.ParseIDRanges(gids); err != nil {
				return fmt.Errorf("--gids: %w", err)
			}
			switch {
			case rootSquash && allSquash:
				return fmt.Errorf("--root-squash and --all-squash: choose one")
			case rootSquash:
				r.Squash = metaapi.SquashRoot
			case allSquash:
				r.Squash = metaapi.SquashAll
			}
			return a.withClient(func(c *sdk.Client) error {
				var resp metaapi.AuthCredResp
				if err := c.Meta().Call(cmd.Context(), metaapi.OpAuthAdd, metaapi.AuthAddReq{Name: args[0], Rights: r}, &resp); err != nil {
					return fmt.Errorf("adding principal %q: %w", args[0], err)
				}
				return a.writeConf(out, resp)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&r.Path, "path", "/", "confine the principal to this directory, which it sees as /")
	f.BoolVar(&r.ReadOnly, "read-only", false, "allow reading only")
	f.BoolVar(&rootSquash, "root-squash", false, "requests as uid 0 act as nobody (65534), and gid 0 is dropped")
	f.BoolVar(&allSquash, "all-squash", false, "every request acts as nobody (65534)")
	f.StringVar(&uids, "uids", "", "uids it may act as, e.g. 1000-1999,2500 (default: any)")
	f.StringVar(&gids, "gids", "", "gids it may act with (default: the --uids ranges if given, else any)")
	f.BoolVar(&r.Admin, "admin", false, "may administer the cluster: drain nodes, run checks, manage principals")
	out.flags(cmd)
	return cmd
}

func (a *app) authLsCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List principals and their rights",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withClient(func(c *sdk.Client) error {
				var resp metaapi.AuthListResp
				if err := c.Meta().Call(cmd.Context(), metaapi.OpAuthList, struct{}{}, &resp); err != nil {
					return fmt.Errorf("listing principals: %w", err)
				}
				if asJSON {
					enc := json.NewEncoder(a.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(resp.Principals)
				}
				tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tID\tPATH\tACCESS\tUIDS\tGIDS\tSQUASH\tADMIN\tCREATED\tROTATED")
				for _, p := range resp.Principals {
					r := p.Rights
					access, squash, admin, rotated, gids := "rw", "none", "no", "-", r.GIDs.String()
					if len(r.GIDs) == 0 && len(r.UIDs) > 0 {
						gids = "as uids"
					}
					if r.ReadOnly {
						access = "ro"
					}
					if r.Squash != metaapi.SquashNone {
						squash = string(r.Squash)
					}
					if r.Admin {
						admin = "yes"
					}
					if p.Rotated != 0 {
						rotated = time.Unix(0, p.Rotated).Format(time.DateTime)
					}
					fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.ID, r.Path, access, r.UIDs, gids, squash, admin,
						time.Unix(0, p.Created).Format(time.DateTime), rotated)
				}
				return tw.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func (a *app) authRotateCmd() *cobra.Command {
	var out confOut
	cmd := &cobra.Command{
		Use:   "rotate NAME",
		Short: "Give a principal a new credential; the old one (and what it was granted) stops working within seconds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				var resp metaapi.AuthCredResp
				if err := c.Meta().Call(cmd.Context(), metaapi.OpAuthRotate, metaapi.AuthNameReq{Name: args[0]}, &resp); err != nil {
					return fmt.Errorf("rotating principal %q: %w", args[0], err)
				}
				return a.writeConf(out, resp)
			})
		},
	}
	out.flags(cmd)
	return cmd
}

func (a *app) authRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a principal: its mounts and clients fail within seconds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(c *sdk.Client) error {
				if err := c.Meta().Call(cmd.Context(), metaapi.OpAuthRemove, metaapi.AuthNameReq{Name: args[0]}, nil); err != nil {
					return fmt.Errorf("removing principal %q: %w", args[0], err)
				}
				return nil
			})
		},
	}
}

func (a *app) authWhoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the principal the client config names and its rights",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.withClient(func(c *sdk.Client) error {
				var p metaapi.Principal
				if err := c.Meta().Call(cmd.Context(), metaapi.OpWhoami, struct{}{}, &p); err != nil {
					return err
				}
				r := p.Rights
				fmt.Fprintf(a.stdout, "principal %s (id %d): path %s, uids %s, gids %s, squash %q, read-only %v, admin %v\n",
					p.Name, p.ID, r.Path, r.UIDs, r.GIDs, r.Squash, r.ReadOnly, r.Admin)
				return nil
			})
		},
	}
}
