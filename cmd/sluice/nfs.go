package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/daemonconf"
	"github.com/sluicefs/sluice/internal/fabricrpc"
	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/nfsclient"
	"github.com/sluicefs/sluice/internal/nfsexport"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/readyfile"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// exportsFrom builds the export table from --exports FILE and each
// --export line; with neither, nfsexport.Default().
func exportsFrom(file string, lines []string) ([]nfsexport.Export, error) {
	var exports []nfsexport.Export
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--exports: %w", err)
		}
		if exports, err = nfsexport.Parse(file, string(b)); err != nil {
			return nil, fmt.Errorf("--exports %w", err)
		}
	}
	for _, l := range lines {
		e, err := nfsexport.ParseLine(l)
		if err != nil {
			return nil, fmt.Errorf("--export %q: %w", l, err)
		}
		if exports, err = nfsexport.Add(exports, e); err != nil {
			return nil, fmt.Errorf("--export %q: %w", l, err)
		}
	}
	if file == "" && len(lines) == 0 {
		return nfsexport.Default(), nil
	}
	if len(exports) == 0 {
		return nil, fmt.Errorf("--exports %s: no exports in it", file)
	}
	return exports, nil
}

func (a *app) nfsCmd() *cobra.Command {
	var listen, fabricListen, exportsFile string
	var exportLines []string
	var fo fabricRPCFlags
	var cf connFlags
	var od odafsFlags
	var cacheMiB, bufferMiB int64
	var readyPath string
	cmd := &cobra.Command{
		Use:   "nfs",
		Short: "Serve the cluster over NFSv3 (NFS and MOUNT on one TCP port), in the foreground until SIGINT/SIGTERM",
		Long: `Serve the cluster's namespace as an NFSv3 export for machines that cannot
mount it with FUSE. NFS and MOUNT are served on the one port --listen names,
so a client told that port needs no portmapper (libnfs:
nfs://HOST/PATH?nfsport=P&mountport=P).

Exports are declared as in /etc/exports, one per --export (repeatable) or
one per line of an --exports file:

  --export '/proj 10.0.0.0/8(rw) 192.168.1.7(ro,all_squash)'

A client is an IPv4 or IPv6 address, a network (ADDRESS/BITS) or * (every
address); host names are refused. Options: ro (default) or rw; root_squash
(default: uid 0, gid 0 and group 0 act as anonuid/anongid), no_root_squash
or all_squash; secure (default: calls from ports below 1024 only, which
only root can bind) or insecure; anonuid=N and anongid=N (default 65534).
Without exports the gateway exports / read-write to this machine only
(127.0.0.1 and ::1), root squashed and secure. MOUNT accepts an export or
any directory below it; every NFS call is checked against its file
handle's export. Callers are who their AUTH_SYS credentials say, as the
export maps them, and meta checks permissions as for the FUSE mount. A lone
WRITE is durable on every replica when it is answered (FILE_SYNC); UNSTABLE
WRITEs that continue one another are buffered and sent in the background
(answered UNSTABLE), made durable by COMMIT; should sending them fail, the
write verifier changes and clients send them again. Sequential READs are
read ahead. Write-behind and read-ahead share --buffer-mib.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			exports, err := exportsFrom(exportsFile, exportLines)
			if err != nil {
				return err
			}
			if err := od.check(cmd.Flags()); err != nil {
				return err
			}
			var credential string
			return a.withClient(func(cl *sdk.Client) error {
				if cacheMiB > 1<<30 {
					return fmt.Errorf("--cache-mib %d: more than 1 PiB", cacheMiB)
				}
				cache := cacheMiB << 20
				if cache <= 0 {
					cache = -1 // none
				}
				if bufferMiB > 1<<30 {
					return fmt.Errorf("--buffer-mib %d: more than 1 PiB", bufferMiB)
				}
				buffers := bufferMiB << 20
				if buffers <= 0 {
					buffers = -1 // none: every WRITE written through
				}
				if err := errors.Join(fo.check(), cf.check()); err != nil {
					return err
				}
				srv, err := nfs3.Listen(nfs3.ServeOptions{Options: nfs3.Options{Client: cl, Logger: a.logger().With("svc", "nfs"), CacheBytes: cache,
					BufferBytes: buffers, Exports: exports, HandleKey: nfs3.HandleKey(credential)},
					Listen: listen, FabricListen: fabricListen, Fabric: nfs3.FabricOptions{BufSize: fo.bufSize, BufCount: fo.bufCount, ChunkMin: fo.chunkMin},
					MaxConns: cf.max, MaxConnsPerHost: cf.perHost})
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "sluice: NFSv3 gateway listening on %s (NFS and MOUNT)\n", srv.Addr())
				for _, e := range exports {
					fmt.Fprintf(a.stdout, "sluice: export %s\n", e)
				}
				if exportsFile == "" && len(exportLines) == 0 {
					if ap, err := netip.ParseAddrPort(srv.Addr().String()); err == nil && !ap.Addr().IsLoopback() {
						a.logger().Warn("nfs: no --export given: only this machine's clients (127.0.0.1, ::1) are admitted")
					}
				}
				info := readyfile.Info{NFS: srv.Addr().String()}
				if fa := srv.FabricAddr(); fa != nil {
					fmt.Fprintf(a.stdout, "sluice: NFSv3 over the fabric listening on %s\n", fa)
					info.NFSFabric = fa.String()
				}
				if err := writeReady(readyPath, info); err != nil {
					// Serving an ended context closes the transports.
					ended, cancel := context.WithCancel(cmd.Context())
					cancel()
					srv.Serve(ended)
					return err
				}
				return srv.Serve(cmd.Context())
			}, func(o *sdk.Options) { credential = o.Conf.Credential }, od.tune)
		},
	}
	cmd.Flags().StringArrayVar(&exportLines, "export", nil, "an export, as a line of /etc/exports: PATH CLIENT(OPTIONS)... (repeatable; see above)")
	cmd.Flags().StringVar(&exportsFile, "exports", "", "a file of exports, one per line as in /etc/exports (# comments, \\ continues a line)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:2049", "address to serve NFS and MOUNT on (e.g. 0.0.0.0:2049 to serve the network, with --export naming its clients)")
	cmd.Flags().Int64Var(&cacheMiB, "cache-mib", 256, "MiB of file data the gateway caches for READ (0 for none); other clients' writes show within a second, the gateway's own at once")
	cmd.Flags().Int64Var(&bufferMiB, "buffer-mib", 256, "MiB of memory for write-behind and read-ahead over all files (0 for none: every WRITE is durable when answered)")
	cmd.Flags().StringVar(&fabricListen, "fabric-listen", "", "also serve NFS and MOUNT with RPC over the fabric transport on this address (for Sluice's NFS client: nfs-get/nfs-put --transport fabric)")
	od.add(cmd)
	addReadyFlag(cmd, &readyPath)
	fo.add(cmd, "replies")
	cf.add(cmd, fabricrpc.DefaultMaxConns, fabricrpc.DefaultMaxConnsPerHost, 0) // oncrpc's defaults too
	daemonconf.Add(cmd)
	return cmd
}

// fabricRPCFlags tune RPC over the fabric on either side.
type fabricRPCFlags struct{ bufSize, bufCount, chunkMin int }

func (f *fabricRPCFlags) check() error {
	if f.chunkMin < 1 {
		return fmt.Errorf("--chunk-min %d: at least 1", f.chunkMin)
	}
	return nil
}

func (f *fabricRPCFlags) add(cmd *cobra.Command, what string) {
	cmd.Flags().IntVar(&f.bufSize, "rpc-buffer-size", fabricrpc.DefaultBufSize, "fabric transport: bytes in each receive buffer posted per connection (a larger message goes as a long message)")
	cmd.Flags().IntVar(&f.bufCount, "rpc-buffers", fabricrpc.DefaultBufCount, "fabric transport: receive buffers posted per connection (bounds the calls outstanding)")
	cmd.Flags().IntVar(&f.chunkMin, "chunk-min", fabricrpc.DefaultChunkMin, "fabric transport: opaque data in "+what+" of at least this many bytes goes as a chunk the peer pulls, smaller inline")
}

// nfsClientFlags are the Sluice NFS client's settings.
type nfsClientFlags struct {
	fabric              fabricRPCFlags
	server, transport   string
	rsize, wsize, ahead int
	statsFile           string
	resvport, mountPath string
}

func (f *nfsClientFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.server, "server", "127.0.0.1:2049", "the NFS server (NFS and MOUNT on this one port)")
	cmd.Flags().IntVar(&f.rsize, "rsize", nfs3.MaxData, "bytes per READ")
	cmd.Flags().IntVar(&f.wsize, "wsize", nfs3.MaxData, "bytes per WRITE")
	cmd.Flags().IntVar(&f.ahead, "readahead", 4, "READs in flight beyond the one being written out")
	f.fabric.add(cmd, "calls (WRITE data)")
	cmd.Flags().StringVar(&f.transport, "transport", "tcp", "RPC transport: tcp (any NFS server) or fabric (the Sluice gateway's --fabric-listen address)")
	cmd.Flags().StringVar(&f.resvport, "resvport", "auto", "bind a reserved source port (below 1024) as root NFS clients do, which secure exports require: auto (when permitted: root), yes (or fail), no")
	cmd.Flags().StringVar(&f.mountPath, "mount", "/", "the export (or a directory below one) to mount; REMOTE is a path below it")
	cmd.Flags().StringVar(&f.statsFile, "stats-json", "", "write the transfer's figures and the client's and server's transport counters (before and after) to this file as JSON (for sluice bench nfs)")
	cmd.Flags().MarkHidden("stats-json")
}

// transferStats is what --stats-json writes.
type transferStats struct {
	Transport    string          `json:"transport"`
	Bytes        int64           `json:"bytes"`
	Seconds      float64         `json:"seconds"`
	ClientTCP    oncrpc.Stats    `json:"client_tcp"`
	ClientFabric fabricrpc.Stats `json:"client_fabric"`
	ServerBefore nfs3.Stats      `json:"server_before"`
	ServerAfter  nfs3.Stats      `json:"server_after"`
}

// serverStats asks the gateway's stats program for its counters.
func serverStats(ctx context.Context, rpc nfsclient.Caller) (nfs3.Stats, error) {
	var st nfs3.Stats
	r, err := rpc.Call(ctx, nfs3.StatsProg, 1, 1, nil, &xdr.Writer{}, nil)
	if err != nil {
		return st, fmt.Errorf("gateway stats: %w", err)
	}
	b := r.Opaque(1 << 20)
	if r.Err() != nil {
		return st, fmt.Errorf("gateway stats: %w", r.Err())
	}
	return st, json.Unmarshal(b, &st)
}

// mount connects to the server and mounts --mount, as the calling user
// (AUTH_SYS).
func (f *nfsClientFlags) mount(ctx context.Context) (*nfsclient.Client, nfsclient.Caller, func(), error) {
	var rpc nfsclient.Caller
	var closer interface{ Close() error }
	resv, err := oncrpc.ParseResvPort(f.resvport)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("--resvport %w", err)
	}
	switch f.transport {
	case "tcp":
		rc, err := oncrpc.DialResv(ctx, f.server, resv)
		if err != nil {
			return nil, nil, nil, err
		}
		rpc, closer = nfsclient.TCP(rc), rc
	case "fabric":
		if err := f.fabric.check(); err != nil {
			return nil, nil, nil, err
		}
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			return oncrpc.DialTCP(ctx, network, addr, resv)
		}
		fc, err := fabricrpc.Dial(ctx, f.server, fabricrpc.ClientOptions{BufSize: f.fabric.bufSize, BufCount: f.fabric.bufCount, ChunkMin: f.fabric.chunkMin, Dial: dial})
		if err != nil {
			return nil, nil, nil, err
		}
		rpc, closer = fc, fc
	default:
		return nil, nil, nil, fmt.Errorf("--transport %q: tcp or fabric", f.transport)
	}
	host, _ := os.Hostname()
	cred := &oncrpc.AuthSysCred{Machine: host, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
	if gids, err := os.Getgroups(); err == nil {
		for _, g := range gids[:min(len(gids), 16)] {
			cred.GIDs = append(cred.GIDs, uint32(g))
		}
	}
	c, err := nfsclient.Mount(ctx, rpc, f.mountPath, nfsclient.Options{Cred: cred, ReadSize: f.rsize, WriteSize: f.wsize, ReadAhead: f.ahead})
	if err != nil {
		closer.Close()
		return nil, nil, nil, err
	}
	return c, rpc, func() { closer.Close() }, nil
}

// transfer runs move (a whole-file copy of so many bytes) and, with
// --stats-json, records its figures.
func (f *nfsClientFlags) transfer(ctx context.Context, rpc nfsclient.Caller, move func() (int64, error)) error {
	if f.statsFile == "" {
		_, err := move()
		return err
	}
	before, err := serverStats(ctx, rpc)
	if err != nil {
		return err
	}
	start := time.Now()
	n, err := move()
	secs := time.Since(start).Seconds()
	if err != nil {
		return err
	}
	after, err := serverStats(ctx, rpc)
	if err != nil {
		return err
	}
	st := transferStats{Transport: f.transport, Bytes: n, Seconds: secs, ServerBefore: before, ServerAfter: after}
	switch c := rpc.(type) {
	case *fabricrpc.Client:
		st.ClientFabric = c.Stats()
	case interface{ Stats() oncrpc.Stats }:
		st.ClientTCP = c.Stats()
	}
	b, _ := json.Marshal(st)
	return os.WriteFile(f.statsFile, b, 0o644)
}

func (a *app) nfsGetCmd() *cobra.Command {
	var f nfsClientFlags
	cmd := &cobra.Command{
		Use:   "nfs-get REMOTE LOCAL",
		Short: "Copy a file from an NFSv3 server (Sluice's NFS client) to LOCAL (- for stdout)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, rpc, done, err := f.mount(cmd.Context())
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
			return f.transfer(cmd.Context(), rpc, func() (int64, error) { return c.ReadTo(cmd.Context(), fh, w) })
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
			c, rpc, done, err := f.mount(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			fh, err := c.Create(cmd.Context(), args[1], 0o644)
			if err != nil {
				return err
			}
			return f.transfer(cmd.Context(), rpc, func() (int64, error) {
				return c.WriteFrom(cmd.Context(), fh, bufio.NewReaderSize(src, 1<<20))
			})
		},
	}
	f.add(cmd)
	return cmd
}
