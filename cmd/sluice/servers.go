package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicefs/sluice/internal/cluster"
	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/connlimit"
	"github.com/sluicefs/sluice/internal/daemonconf"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/meta"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/pki"
	"github.com/sluicefs/sluice/internal/readyfile"
	"github.com/sluicefs/sluice/internal/sdk"
)

// engineFlags are the data-plane settings shared by `up` and `node`.
type engineFlags struct {
	mtu, quota, workers, table int
	accumulators               int
	idle                       time.Duration
	linkRate                   string
	linkDelay                  time.Duration
	conns                      connFlags
}

func (f *engineFlags) add(cmd *cobra.Command) {
	cmd.Flags().IntVar(&f.mtu, "mtu", fabric.DefaultMTU, "largest packet payload in bytes")
	cmd.Flags().IntVar(&f.quota, "recv-quota", 16, "receive buffers per connection")
	cmd.Flags().IntVar(&f.workers, "workers", 0, "handler workers (default: number of CPUs)")
	cmd.Flags().IntVar(&f.table, "request-table", 1024, "in-flight requests before new ones are refused busy")
	cmd.Flags().IntVar(&f.accumulators, "accumulators", 256, "64 KiB parity accumulator slots for erasure-coded writes (past them, host memory)")
	cmd.Flags().DurationVar(&f.idle, "idle-timeout", 10*time.Second, "clean up a request (or close a connection) whose sender is silent this long mid-message")
	cmd.Flags().StringVar(&f.linkRate, "link-rate", "", "emulate a network link of this bandwidth per node, e.g. 10Gbit (benchmarks)")
	cmd.Flags().DurationVar(&f.linkDelay, "link-delay", 0, "emulate this one-way link delay, e.g. 5us (benchmarks)")
	f.conns.add(cmd, fabric.DefaultMaxConns, fabric.DefaultMaxConnsPerHost, fabric.DefaultIdleTimeout)
}

// link returns a new emulated link for one node (nil if none is asked).
func (f *engineFlags) link() (*fabric.Link, error) {
	if f.linkRate == "" && f.linkDelay == 0 {
		return nil, nil
	}
	var rate float64
	if f.linkRate != "" {
		var err error
		if rate, err = fabric.ParseRate(f.linkRate); err != nil {
			return nil, err
		}
	}
	return fabric.NewLink(rate, f.linkDelay)
}

// options returns the fabric's and engine's options; the fabric logs to
// log (refused and closed connections).
func (f *engineFlags) options(log *slog.Logger, fabricMode string) (fabric.Options, engine.Options, error) {
	if err := f.conns.check(); err != nil {
		return fabric.Options{}, engine.Options{}, err
	}
	fm, err := fabric.ParseFabric(fabricMode)
	if err != nil {
		return fabric.Options{}, engine.Options{}, err
	}
	link, err := f.link()
	return fabric.Options{MTU: f.mtu, Quota: f.quota, StallTimeout: f.idle, Link: link, Fabric: fm,
			MaxConns: f.conns.max, MaxConnsPerHost: f.conns.perHost, IdleTimeout: f.conns.idle, Logger: log},
		engine.Options{Workers: f.workers, TableSize: f.table, IdleTimeout: f.idle}, err
}

func (a *app) upCmd() *cobra.Command {
	var (
		nodes  int
		dir    string
		listen string
		ef     engineFlags
		mount  string
		mf     mountFlags
		sf     spaceFlags
		xf     exportFlags
		ready  string
	)
	var nodeListen string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a whole local cluster in this process (meta + storage nodes on loopback)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fo, eo, err := ef.options(a.logger(), a.fabric)
			if err != nil {
				return err
			}
			minFree, minFreePct, err := sf.options()
			if err != nil {
				return err
			}
			if mf.od.on && mount == "" {
				return errors.New("--odafs goes with --mount")
			}
			if !cmd.Flags().Changed("odafs-block") {
				mf.od.block = xf.block // the mount reads the nodes started here
			}
			if err := mf.od.check(cmd.Flags()); err != nil {
				return err
			}
			c, err := cluster.Start(cmd.Context(), cluster.Options{Dir: dir, Nodes: nodes, MetaListen: listen, NodeListen: nodeListen, Fabric: fo, Engine: eo, Accumulators: ef.accumulators,
				MinFreeBytes: minFree, MinFreePercent: minFreePct, FabricTLS: a.fabricTLS, ExportCache: int64(xf.cache), ExportBlock: int(xf.block), ExportClientCache: int64(xf.client), Logger: a.logger()})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "sluice: meta listening on %s\n", c.MetaAddr)
			for _, n := range c.Nodes {
				fmt.Fprintf(a.stdout, "sluice: storage node %v listening on %s (data %s)\n", n.ID(), n.Addr(), filepath.Join(dir, "node*"))
			}
			abs, _ := filepath.Abs(c.ConfPath)
			fmt.Fprintf(a.stdout, "sluice: client config written to %s\n", abs)
			fmt.Fprintf(a.stdout, "sluice: try: SLUICE_CONF=%s sluice status\n", abs)
			info := readyfile.Info{Meta: c.MetaAddr, Conf: abs}
			for _, n := range c.Nodes {
				info.Nodes = append(info.Nodes, readyfile.Node{ID: n.ID().String(), Addr: n.Addr()})
			}
			if mount != "" {
				// Ready once mounted.
				return a.upMounted(cmd.Context(), c, mount, &mf, func() error {
					info.Mount = mount
					return writeReady(ready, info)
				})
			}
			if err := writeReady(ready, info); err != nil {
				c.Close()
				return err
			}
			select {
			case <-cmd.Context().Done():
			case err := <-c.MetaErr():
				if err != nil {
					c.Close()
					return fmt.Errorf("meta stopped: %w", err)
				}
			}
			fmt.Fprintln(a.stdout, "sluice: shutting down")
			return c.Close()
		},
	}
	cmd.Flags().IntVar(&nodes, "nodes", 3, "number of storage nodes")
	cmd.Flags().StringVar(&dir, "data", "sluice-data", "data directory (kept across restarts)")
	cmd.Flags().StringVar(&listen, "listen", cluster.DefaultMetaListen, "meta service address")
	cmd.Flags().StringVar(&nodeListen, "node-listen", cluster.DefaultNodeListen, "the storage nodes' address: HOST (ports the system picks) or HOST:PORT (node i on PORT+i-1)")
	cmd.Flags().StringVar(&mount, "mount", "", "also mount the cluster here (FUSE); the cluster stops when it is unmounted")
	addReadyFlag(cmd, &ready)
	ef.add(cmd)
	mf.add(cmd)
	sf.add(cmd)
	xf.add(cmd)
	daemonconf.Add(cmd)
	return cmd
}

// upMounted serves the mount of a cluster up started, then stops the
// cluster: on a signal, on `sluice umount`, or when meta fails.
func (a *app) upMounted(ctx context.Context, c *cluster.Cluster, dir string, mf *mountFlags, ready func() error) error {
	conf, err := config.Load(c.ConfPath)
	if err != nil {
		c.Close()
		return err
	}
	fm, err := fabric.ParseFabric(a.fabric)
	if err != nil {
		c.Close()
		return err
	}
	opts := sdk.Options{Conf: conf, Logger: a.logger(), FabricTLS: a.fabricTLS, Fabric: fm}
	mf.tune(&opts)
	cl, err := sdk.New(opts)
	if err != nil {
		c.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := <-c.MetaErr(); err != nil {
			a.logger().Error("meta stopped", "err", err)
			cancel()
		}
	}()
	err = a.serveMount(ctx, cl, dir, mf, ready)
	cl.Close()
	fmt.Fprintln(a.stdout, "sluice: shutting down")
	if cerr := c.Close(); err == nil {
		err = cerr
	}
	return err
}

func (a *app) metaCmd() *cobra.Command {
	var (
		dir, listen string
		advertise   string
		ready       string
		nodeTimeout time.Duration
		lockLease   time.Duration
		repairGrace time.Duration
		orphanGrace time.Duration
		tempGrace   time.Duration
		repairRate  int64
		repairPar   int
		replicas    int
		tlsNames    []string
		sf          spaceFlags
		cf          connFlags
		capTTL      time.Duration
		capRotate   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "Run the meta service (namespace, layouts, policies, membership)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return errors.New("--data is required")
			}
			if lockLease <= 0 {
				return fmt.Errorf("--lock-lease %s: must be positive", lockLease)
			}
			if repairGrace <= 0 {
				return fmt.Errorf("--repair-grace %s: must be positive", repairGrace)
			}
			if tempGrace <= 0 {
				return fmt.Errorf("--temp-grace %s: must be positive", tempGrace)
			}
			if orphanGrace <= 0 {
				return fmt.Errorf("--orphan-grace %s: must be positive", orphanGrace)
			}
			if capTTL <= 0 || capRotate < 0 {
				return fmt.Errorf("--cap-ttl %s, --cap-key-rotate %s: the lifetime must be positive, the period not negative", capTTL, capRotate)
			}
			if capRotate == 0 {
				capRotate = -1 // meta.Options: never
			}
			minFree, minFreePct, err := sf.options()
			if err != nil {
				return err
			}
			if err := cf.check(); err != nil {
				return err
			}
			srv, err := meta.Start(meta.StartOptions{Options: meta.Options{Dir: dir, Logger: a.logger(), NodeTimeout: nodeTimeout, LockLease: lockLease,
				RepairGrace: repairGrace, RepairRate: repairRate, DefaultReplicas: replicas, OrphanGrace: orphanGrace, TempGrace: tempGrace,
				MinFreeBytes: minFree, MinFreePercent: minFreePct, MaxConns: cf.max, MaxConnsPerHost: cf.perHost,
				CapabilityTTL: capTTL, CapKeyRotate: capRotate, TLSNames: tlsNames},
				Listen: listen, Advertise: advertise,
				RepairParallel: repairPar, NewRepairer: cluster.RepairClient(a.fabricTLS, a.logger().With("svc", "repair"))})
			if err != nil {
				return err
			}
			if advertise == "" && isUnspecified(srv.ListenAddr) {
				fmt.Fprintf(a.stderr, "sluice: warning: listening on every interface, but client.conf names %s: give --advertise an address other hosts reach meta at\n", srv.Addr)
			}
			fmt.Fprintf(a.stdout, "sluice: meta listening on %s\n", srv.Addr)
			fmt.Fprintf(a.stdout, "sluice: cluster secret %s, client config %s\n", filepath.Join(dir, "cluster.secret"), srv.ConfPath)
			fmt.Fprintf(a.stdout, "sluice: cluster CA %s; add storage nodes with: %s=\"$(SLUICE_CONF=%s sluice join-token)\" sluice node --meta %s --data DIR\n",
				filepath.Join(dir, pki.CACertFile), envJoin, srv.ConfPath, srv.Addr)
			if err := writeReady(ready, readyfile.Info{Meta: srv.Addr, MetaListen: srv.ListenAddr.String(), Conf: srv.ConfPath,
				Secret: filepath.Join(dir, "cluster.secret")}); err != nil {
				srv.Close()
				return err
			}
			select {
			case <-cmd.Context().Done():
				return srv.Close()
			case err := <-srv.Err():
				srv.Close()
				return err
			}
		},
	}
	cmd.Flags().StringVar(&dir, "data", "", "data directory")
	cmd.Flags().StringVar(&listen, "listen", cluster.DefaultMetaListen, "listen address")
	cmd.Flags().DurationVar(&nodeTimeout, "node-timeout", 10*time.Second, "mark a storage node down after this much silence")
	cmd.Flags().DurationVar(&repairGrace, "repair-grace", 30*time.Second, "move a down node's data elsewhere once it has been down this long")
	cmd.Flags().Int64Var(&repairRate, "repair-rate", 0, "repair at most this many bytes a second (0: as fast as it can), to keep clients' throughput")
	cmd.Flags().IntVar(&repairPar, "repair-parallel", 4, "chunks repaired at once (0: meta repairs nothing by itself)")
	cmd.Flags().DurationVar(&orphanGrace, "orphan-grace", time.Hour, "have nodes delete a copy no file needs once their inventories have found it so for this long")
	cmd.Flags().DurationVar(&tempGrace, "temp-grace", 10*time.Minute, "remove a put's temporary file once its writer has stopped renewing its session (--lock-lease) for this long (a put killed mid-way)")
	cmd.Flags().DurationVar(&lockLease, "lock-lease", 30*time.Second, "a mount that stops renewing its file locks loses them after this long")
	cmd.Flags().IntVar(&replicas, "default-replicas", 3, "replicas of the root directory's policy on first start")
	cmd.Flags().DurationVar(&capTTL, "cap-ttl", meta.DefaultCapabilityTTL, "capabilities (the tickets storage nodes check) expire this long after meta mints them")
	cmd.Flags().DurationVar(&capRotate, "cap-key-rotate", meta.DefaultCapKeyRotate, "rotate the key that signs capabilities this often (longer than --cap-ttl; 0: never)")
	cmd.Flags().StringVar(&advertise, "advertise", "", "HOST or HOST:PORT that clients and nodes reach meta at: written into client.conf and named by meta's certificate (default: the listen address; every interface becomes 127.0.0.1)")
	addReadyFlag(cmd, &ready)
	cmd.Flags().StringSliceVar(&tlsNames, "tls-san", nil, "more host names or addresses meta's TLS certificate names (besides loopback, this host's name and the listen address)")
	sf.add(cmd)
	cf.add(cmd, connlimit.DefaultMax, connlimit.DefaultPerHost, 0)
	daemonconf.Add(cmd)
	cmd.AddCommand(a.metaBackupCmd(), a.metaRestoreCmd())
	return cmd
}

// spaceFlags are the free space a node keeps, for `meta` and `up`.
type spaceFlags struct {
	bytes   int64
	percent float64
}

func (f *spaceFlags) add(cmd *cobra.Command) {
	cmd.Flags().Int64Var(&f.bytes, "min-free", meta.DefaultMinFreeBytes, "give new chunks only to nodes with more than this many bytes free...")
	cmd.Flags().Float64Var(&f.percent, "min-free-percent", meta.DefaultMinFreePercent, "...and more than this percentage of their file system free")
}

// options returns the flags as meta.Options reads them (where 0 is "the
// default" and a negative value "none").
func (f *spaceFlags) options() (bytes int64, percent float64, err error) {
	if f.bytes < 0 || f.percent < 0 || f.percent >= 100 {
		return 0, 0, fmt.Errorf("--min-free %d, --min-free-percent %g: bytes must not be negative, the percentage must be in [0, 100)", f.bytes, f.percent)
	}
	bytes, percent = f.bytes, f.percent
	if bytes == 0 {
		bytes = -1
	}
	if percent == 0 {
		percent = -1
	}
	return bytes, percent, nil
}

func (a *app) nodeCmd() *cobra.Command {
	var (
		dir, metaAddr, joinToken, listen, advertise, domain string
		ef                                                  engineFlags
		allowRaw                                            bool
		scrubEvery                                          time.Duration
		scrubRate                                           int64
		inventoryEvery                                      time.Duration
		nodeID                                              uint32
		ready                                               string
		xf                                                  exportFlags
	)
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a storage node",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case dir == "":
				return errors.New("--data is required")
			case metaAddr == "":
				return errors.New("--meta is required")
			case scrubEvery < 0 || scrubRate < 0:
				return fmt.Errorf("--scrub-interval %s and --scrub-rate %d must not be negative", scrubEvery, scrubRate)
			case daemonconf.Given(cmd.Flags(), "id") && (nodeID == 0 || nodeID > metaapi.MaxNodeID):
				return fmt.Errorf("--id %d: node ids go from 1 to %d", nodeID, metaapi.MaxNodeID)
			case inventoryEvery == 0:
				return errors.New("--inventory-interval must not be 0 (negative: only when meta asks)")
			}
			fo, eo, err := ef.options(a.logger(), a.fabric)
			if err != nil {
				return err
			}
			onCmdLine := cmd.Flags().Changed("join") // not from --config
			if joinToken == "" {
				joinToken = os.Getenv(envJoin)
			}
			n, err := node.Start(cmd.Context(), node.Options{
				DataDir: dir, MetaAddr: metaAddr, Join: joinToken, ID: ids.NodeID(nodeID), FabricTLS: a.fabricTLS, Listen: listen, Advertise: advertise,
				Domain: domain, Fabric: fo, Engine: eo, Accumulators: ef.accumulators, AllowRaw: allowRaw, Logger: a.logger(),
				ScrubInterval: scrubEvery, ScrubRate: scrubRate, InventoryInterval: inventoryEvery,
				ExportCache: int64(xf.cache), ExportBlock: int(xf.block), ExportClientCache: int64(xf.client),
			})
			if err != nil {
				return err
			}
			if onCmdLine {
				// Said once it runs: a refusal to start has its own line.
				fmt.Fprintf(a.stderr, "sluice: warning: the join token given with --join is visible to other users of this host (ps) while the node runs; pass it in $%s instead\n", envJoin)
			}
			fmt.Fprintf(a.stdout, "sluice: storage node %v listening on %s\n", n.ID(), n.Addr())
			if err := writeReady(ready, readyfile.Info{Nodes: []readyfile.Node{{ID: n.ID().String(), Addr: n.Addr()}}}); err != nil {
				n.Close()
				return err
			}
			select {
			case <-cmd.Context().Done():
				return n.Close()
			case err := <-n.Fatal():
				n.Close()
				return err
			}
		},
	}
	cmd.Flags().StringVar(&dir, "data", "", "data directory")
	cmd.Flags().StringVar(&metaAddr, "meta", "", "meta service address")
	cmd.Flags().StringVar(&joinToken, "join", "", "join token for a new node, from `sluice join-token` (default $"+envJoin+", which other users of the host cannot read, unlike the command line; a node that has joined needs none)")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "fabric listen address")
	cmd.Flags().StringVar(&advertise, "advertise", "", "HOST:PORT registered with meta, that meta, clients and other nodes reach this node at (default: the listen address; listening on every interface, the address meta sees this node's calls come from)")
	cmd.Flags().Uint32Var(&nodeID, "id", 0, "the node id a new node asks for when it joins (1 to 16777215; default: meta picks the next free one); a node that has one must be given it")
	cmd.Flags().StringVar(&domain, "domain", "", "failure domain (rack, host)")
	addReadyFlag(cmd, &ready)
	cmd.Flags().DurationVar(&scrubEvery, "scrub-interval", 24*time.Hour, "re-read every chunk against its checksums this often (0: never)")
	cmd.Flags().Int64Var(&scrubRate, "scrub-rate", 32<<20, "scrub at most this many bytes a second (0: unlimited)")
	cmd.Flags().DurationVar(&inventoryEvery, "inventory-interval", node.DefaultInventoryInterval, "list this node's chunks to meta this often, to collect copies no file needs (negative: only when meta asks)")
	xf.add(cmd)
	cmd.Flags().BoolVar(&allowRaw, "bench-allow-raw", false, "accept unauthenticated writes (only for `sluice bench`'s raw protocol)")
	cmd.Flags().MarkHidden("bench-allow-raw")
	ef.add(cmd)
	cmd.Flags().SetAnnotation("join", daemonconf.SecretAnnotation, []string{"true"})
	daemonconf.Add(cmd)
	cmd.AddCommand(a.drainCmd(), a.revokeNodeCmd(), a.removeNodeCmd())
	return cmd
}

// isUnspecified reports whether a listener listens on every interface.
func isUnspecified(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsUnspecified()
}
