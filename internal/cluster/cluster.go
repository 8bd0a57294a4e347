// Package cluster runs a whole Sluice cluster in one process — one meta
// service and N storage nodes on loopback — for `sluice up`, tests and
// benchmarks. Every part is the real service, talking over real sockets;
// only the process boundary is missing. State lives under one directory
// and survives restarts.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/engine"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/meta"
	"github.com/sluicefs/sluice/internal/node"
	"github.com/sluicefs/sluice/internal/privfs"
)

// Options configure a local cluster.
type Options struct {
	Dir   string // data directory; default ./sluice-data
	Nodes int    // storage nodes; default 3
	// MetaListen is the meta service's address. Default 127.0.0.1:7700;
	// use port 0 for any free port.
	MetaListen string
	// NodeListen is where the nodes listen: a host, or HOST:PORT for
	// consecutive ports (NodeListenAddr). Default DefaultNodeListen.
	NodeListen string
	// DomainPerNode puts every node in its own failure domain.
	DomainPerNode bool
	// ChunkSize of new files (default metaapi.DefaultChunkSize); tests
	// use small chunks to cross chunk boundaries cheaply.
	ChunkSize int64
	// DefaultReplicas of the root policy on first start; default
	// min(3, Nodes).
	DefaultReplicas int
	// NodeTimeout and HeartbeatInterval tune failure detection (meta's
	// defaults if zero); tests of node loss shorten them.
	NodeTimeout, HeartbeatInterval time.Duration
	// RepairGrace is how long a node may be down before its data is
	// moved (meta's default if zero); RepairParallel how many chunks are
	// reconciled at once (default 4; negative: meta repairs nothing).
	RepairGrace    time.Duration
	RepairParallel int
	RepairRate     int64 // bytes a second; 0: unlimited
	// MinFreeBytes and MinFreePercent: the free space a node keeps
	// (meta.Options).
	MinFreeBytes   int64
	MinFreePercent float64
	// ScrubInterval and ScrubRate of each node (node.Options); 0: the
	// nodes do not scrub.
	ScrubInterval time.Duration
	ScrubRate     int64
	// InventoryInterval of each node and OrphanGrace of meta (node and
	// meta Options); 0 for the defaults.
	InventoryInterval time.Duration
	OrphanGrace       time.Duration
	// Accumulators and ReserveTimeout of each node (policy.Deps); 0 for
	// the defaults.
	Accumulators   int
	ReserveTimeout time.Duration
	// AllowRaw lets nodes accept unauthenticated writes (benchmarks only).
	AllowRaw bool
	// FabricTLS runs the fabric over TLS (nodes and the repair worker;
	// clients must set client.Options.FabricTLS too).
	FabricTLS bool
	Fabric    fabric.Options
	Engine    engine.Options
	// ExportCache and ExportBlock of each node (node.Options).
	ExportCache       int64
	ExportBlock       int
	ExportClientCache int64
	Logger            *slog.Logger
}

// DefaultMetaListen is where `sluice up` and `sluice meta` listen unless told otherwise.
const DefaultMetaListen = "127.0.0.1:7700"

// Cluster is a running local cluster.
type Cluster struct {
	Meta     *meta.Service
	MetaAddr string
	Nodes    []*node.Node
	ConfPath string
	srv      *meta.Server
}

// Start starts meta, then the nodes, and writes Dir/client.conf.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Dir == "" {
		opts.Dir = "sluice-data"
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.MetaListen == "" {
		opts.MetaListen = DefaultMetaListen
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if _, err := NodeListenAddr(opts.NodeListen, opts.Nodes); err != nil {
		return nil, fmt.Errorf("cluster: %w", err) // before anything is made
	}
	if err := privfs.CheckDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if err := privfs.MkdirAll(opts.Dir); err != nil { // holds client.conf, a credential
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if opts.DefaultReplicas == 0 {
		opts.DefaultReplicas = min(3, opts.Nodes)
	}
	repairPar := cmp.Or(opts.RepairParallel, 4) // negative: none (Start)
	srv, err := meta.Start(meta.StartOptions{Options: meta.Options{Dir: filepath.Join(opts.Dir, "meta"), Logger: opts.Logger.With("svc", "meta"),
		DefaultReplicas: opts.DefaultReplicas, ChunkSize: opts.ChunkSize, NodeTimeout: opts.NodeTimeout, HeartbeatInterval: opts.HeartbeatInterval,
		RepairGrace: opts.RepairGrace, RepairRate: opts.RepairRate, OrphanGrace: opts.OrphanGrace,
		MinFreeBytes: opts.MinFreeBytes, MinFreePercent: opts.MinFreePercent},
		Listen: opts.MetaListen, ConfPath: filepath.Join(opts.Dir, config.FileName),
		RepairParallel: repairPar, NewRepairer: RepairClient(opts.FabricTLS, opts.Logger.With("svc", "repair"))})
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	c := &Cluster{Meta: srv.Service, MetaAddr: srv.Addr, ConfPath: srv.ConfPath, srv: srv}
	for i := 1; i <= opts.Nodes; i++ {
		domain := ""
		if opts.DomainPerNode {
			domain = "d" + strconv.Itoa(i)
		}
		fo := opts.Fabric
		if l := opts.Fabric.Link; l != nil {
			// Every node has its own emulated NIC.
			fo.Link, _ = fabric.NewLink(l.Rate(), l.Delay())
		}
		listen, _ := NodeListenAddr(opts.NodeListen, i) // checked above
		dataDir := filepath.Join(opts.Dir, "node"+strconv.Itoa(i))
		var token string
		if joined, id := node.Joined(dataDir); !joined {
			// The same join a node on another host makes, token and all
			// (again, keeping its id, for a node from before TLS).
			tok, err := c.Meta.NewJoinToken(time.Minute, id)
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("cluster: join token for node %d: %w", i, err)
			}
			token = tok.Token
		}
		n, err := node.Start(ctx, node.Options{
			DataDir:           dataDir,
			MetaAddr:          c.MetaAddr,
			Listen:            listen,
			Join:              token,
			FabricTLS:         opts.FabricTLS,
			Domain:            domain,
			Fabric:            fo,
			Engine:            opts.Engine,
			AllowRaw:          opts.AllowRaw,
			Accumulators:      opts.Accumulators,
			ReserveTimeout:    opts.ReserveTimeout,
			ScrubInterval:     opts.ScrubInterval,
			ScrubRate:         opts.ScrubRate,
			InventoryInterval: opts.InventoryInterval,
			ExportCache:       opts.ExportCache,
			ExportBlock:       opts.ExportBlock,
			ExportClientCache: opts.ExportClientCache,
			Logger:            opts.Logger.With("svc", "node"+strconv.Itoa(i)),
		})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("cluster: starting node %d: %w", i, err)
		}
		c.Nodes = append(c.Nodes, n)
	}
	c.waitMaps(5 * time.Second)
	return c, nil
}

// waitMaps waits (at most d) until every node's cluster map knows every
// node, so the first writes are not answered busy while maps converge.
func (c *Cluster) waitMaps(d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		all := true
		for _, n := range c.Nodes {
			for _, p := range c.Nodes {
				if _, ok := n.PeerAddr(p.ID()); !ok {
					all = false
				}
			}
		}
		if all {
			return
		}
	}
}

// Conf returns the client configuration.
func (c *Cluster) Conf() (config.ClientConf, error) { return config.Load(c.ConfPath) }

// MetaErr yields the meta server's exit error.
func (c *Cluster) MetaErr() <-chan error { return c.srv.Err() }

// Close stops the nodes, then meta.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Close())
	}
	errs = append(errs, c.Meta.Shutdown(context.Background()))
	errs = append(errs, c.srv.Close())
	return errors.Join(errs...)
}
