package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/client"
	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/nfsclient"
	"github.com/sluicefs/sluice/internal/oncrpc"
)

func (a *app) nfsCmd() *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "nfs",
		Short: "Serve the cluster over NFSv3 (NFS and MOUNT on one TCP port), in the foreground until SIGINT/SIGTERM",
		Long: `Serve the cluster's namespace as an NFSv3 export for machines that cannot
mount it with FUSE. NFS and MOUNT are served on the one port --listen names,
so a client told that port needs no portmapper (libnfs:
nfs://HOST/PATH?nfsport=P&mountport=P). The export is "/"; MOUNT also
accepts any directory below it. Callers are who their AUTH_SYS credentials
say (AUTH_NONE is nobody, 65534), and meta checks permissions as for the
FUSE mount: as with every AUTH_SYS server, only listen where the clients'
uids can be trusted. Every WRITE is durable on every replica when it is
answered (FILE_SYNC), so COMMIT has nothing left to do.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withClient(func(cl *client.Client) error {
				g, err := nfs3.New(nfs3.Options{Client: cl, Logger: a.logger().With("svc", "nfs")})
				if err != nil {
					return err
				}
				ln, err := net.Listen("tcp", listen)
				if err != nil {
					return fmt.Errorf("nfs: %w", err)
				}
				srv := &oncrpc.Server{Programs: g.Programs(), MaxRecord: nfs3.MaxData + 64<<10, Logger: a.logger().With("svc", "nfs")}
				fmt.Fprintf(a.stdout, "sluice: NFSv3 gateway listening on %s (NFS and MOUNT; export /)\n", ln.Addr())
				errc := make(chan error, 1)
				go func() { errc <- srv.Serve(ln) }()
				select {
				case err := <-errc:
					return err
				case <-cmd.Context().Done():
					return srv.Close()
				}
			})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2049", "address to serve NFS and MOUNT on (e.g. 0.0.0.0:2049 to export to the network)")
	return cmd
}

// nfsClientFlags are the Sluice NFS client's settings.
type nfsClientFlags struct {
	server              string
	rsize, wsize, ahead int
}

func (f *nfsClientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", "127.0.0.1:2049", "the NFS server (NFS and MOUNT on this one port)")
	cmd.Flags().IntVar(&f.rsize, "rsize", nfs3.MaxData, "bytes per READ")
	cmd.Flags().IntVar(&f.wsize, "wsize", nfs3.MaxData, "bytes per WRITE")
	cmd.Flags().IntVar(&f.ahead, "readahead", 4, "READs in flight beyond the one being written out")
}

// mount connects to the server and mounts its export "/", as the
// calling user (AUTH_SYS).
func (f *nfsClientFlags) mount(ctx context.Context) (*nfsclient.Client, func(), error) {
	rc, err := oncrpc.Dial(ctx, f.server)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	cred := &oncrpc.AuthSysCred{Machine: host, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	if gids, err := os.Getgroups(); err == nil {
		for _, g := range gids[:min(len(gids), 16)] {
			cred.GIDs = append(cred.GIDs, uint32(g))
		}
	}
	c, err := nfsclient.Mount(ctx, rc, "/", nfsclient.Options{Cred: cred, ReadSize: f.rsize, WriteSize: f.wsize, ReadAhead: f.ahead})
	if err != nil {
		rc.Close()
		return nil, nil, err
	}
	return c, func() { rc.Close() }, nil
}

func (a *app) nfsGetCmd() *cobra.Command {
	var f nfsClientFlags
	cmd := &cobra.Command{
		Use:   "nfs-get REMOTE LOCAL",
		Short: "Copy a file from an NFSv3 server (Sluice's NFS client) to LOCAL (- for stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := f.mount(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			fh, err := c.Lookup(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			var w io.Writer = a.stdout
			if args[1] != "-" {
				out, err := os.Create(args[1])
				if err != nil {
					return err
				}
				defer out.Close()
				w = out
			}
			_, err = c.ReadTo(cmd.Context(), fh, w)
			return err
		},
	}
	f.add(cmd)
	return cmd
}

func (a *app) nfsPutCmd() *cobra.Command {
	var f nfsClientFlags
	cmd := &cobra.Command{
		Use:   "nfs-put LOCAL REMOTE",
		Short: "Copy LOCAL (- for stdin) to a file on an NFSv3 server (Sluice's NFS client)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var src io.Reader = os.Stdin
			if args[0] != "-" {
				in, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer in.Close()
				src = in
			}
			c, done, err := f.mount(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			fh, err := c.Create(cmd.Context(), args[1], 0o644)
			if err != nil {
				return err
			}
			_, err = c.WriteFrom(cmd.Context(), fh, bufio.NewReaderSize(src, 1<<20))
			return err
		},
	}
	f.add(cmd)
	return cmd
}
