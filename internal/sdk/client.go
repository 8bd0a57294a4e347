// Package sdk is the Sluice SDK every front end uses (the CLI, the FUSE
// mount, the NFS gateway); package client is its public face for
// programs outside the module. It resolves paths and asks meta for
// layouts and capabilities (cached until they expire), then talks to
// storage nodes directly over the fabric: writes stream to the first
// replica of each chunk, which forwards every packet down the ring as it
// arrives; reads go to any replica, land by one-sided WRITE in a
// registered buffer, are verified block by block against the node's
// checksums, and fail over to another replica when one is down, stale or
// returns a bad checksum. Nothing unverified is ever returned.
//
// Besides the calls by path, it has the inode-level calls the FUSE mount
// and the NFS gateway name things by, and the administrative ones the
// sluice command uses (drain, check, join tokens).
package sdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/erasure"
	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/odafs"
	"github.com/sluicefs/sluice/internal/pki"
)

// Options configure a client.
type Options struct {
	// Conf says where meta is and who the client is (NewFromFile
	// reads it from client.conf).
	Conf Conf
	// Who is the identity for permission checks; default the process's.
	Who *Who
	// MTU of the client's fabric endpoint. Default fabric.DefaultMTU.
	MTU int
	// WriteMsg is the largest write request sent to a node. Default 16 MiB.
	WriteMsg int
	// ReadReq is the size of one read request. Default 4 MiB.
	ReadReq int
	// Parallel bounds requests in flight for one Put or Get. Default 4.
	Parallel int
	// BusyRetry bounds how long a write keeps retrying while a node
	// answers busy (request table full, chunk locked). Default 30s.
	BusyRetry time.Duration
	// OpTimeout bounds how long a call to meta is retried while meta
	// cannot be reached (a restart); default 15 s. Before meta has ever
	// answered, retries stop after 2 s (a wrong address fails fast)
	// unless WaitForMeta is set.
	OpTimeout   time.Duration
	WaitForMeta bool
	// FabricTLS reaches nodes over TLS, checking each is the node meant
	// (fabrictls.go); the nodes must run with it too.
	FabricTLS bool
	// Fabric is how the client reaches nodes (fabric.Options.Fabric:
	// tcp if empty, auto, shm).
	Fabric fabric.Fabric
	// ODAFS, if set, turns on optimistic reads of nodes' exported caches
	// (odafs.go): small reads of blocks the client holds references to
	// go as one-sided reads, with no request for the node to serve.
	ODAFS  *odafs.Options
	Logger *slog.Logger
}

// Client is a connection to a cluster. It is safe for concurrent use.
type Client struct {
	busyRetries atomic.Uint64
	failovers   atomic.Uint64
	fenced      atomic.Uint64
	odReads     atomic.Uint64
	odFallbacks atomic.Uint64
	od          *odafs.Client // nil: no optimistic reads
	slots       sync.Pool     // of *[]byte: an exported slot's copy (odafs.go)

	opts    Options
	bench   BenchOptions
	meta    *metaapi.Client
	ep      *fabric.Endpoint
	pool    *fabric.Pool
	who     metaapi.Who
	log     *slog.Logger
	layouts *layoutCache
	bufs    *bufferPool
	codes   erasure.Codes
	// reported are the corrupt copies reported to meta lately.
	reported reports
}

// New connects to the cluster described by opts.Conf. No network traffic
// happens until the first call.
func New(opts Options) (*Client, error) { return newClient(opts, BenchOptions{}, nil) }

func newClient(opts Options, bench BenchOptions, link *fabric.Link) (*Client, error) {
	if opts.Conf.Meta == "" {
		return nil, errors.New("client: no meta address in the client config")
	}
	if opts.MTU == 0 {
		opts.MTU = fabric.DefaultMTU
	}
	if opts.WriteMsg <= 0 {
		opts.WriteMsg = 16 << 20
	}
	if opts.ReadReq <= 0 {
		opts.ReadReq = 4 << 20
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 4
	}
	if opts.BusyRetry <= 0 {
		opts.BusyRetry = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	tc, err := pki.ClientConfig([]byte(opts.Conf.CA))
	if err != nil {
		return nil, fmt.Errorf("client: client config: %w", err)
	}
	nodes := &nodeMap{}
	fo := fabric.Options{MTU: opts.MTU, Link: link, Logger: opts.Logger, Fabric: opts.Fabric}
	if opts.FabricTLS {
		fo.DialTLS = nodes.dialTLS(tc.RootCAs)
	}
	ep, err := fabric.NewEndpoint(fo)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c := &Client{
		opts:    opts,
		bench:   bench,
		meta:    metaapi.NewClient(opts.Conf.Meta, metaapi.ClientAuth(opts.Conf.ClientID, opts.Conf.Credential), tc),
		ep:      ep,
		pool:    fabric.NewPool(ep, 16),
		log:     opts.Logger,
		layouts: newLayoutCache(),
	}
	nodes.status = c.statusMap
	if opts.ODAFS != nil {
		c.od = odafs.New(*opts.ODAFS)
		c.slots.New = func() any { return new([]byte) }
	}
	if opts.OpTimeout > 0 {
		c.meta.RetryFor = opts.OpTimeout
		if opts.WaitForMeta {
			c.meta.FirstContactRetry = opts.OpTimeout
		}
	}
	c.bufs = newBufferPool(ep, opts.ReadReq+2*maxBlockSize)
	if opts.Who != nil {
		c.who = *opts.Who
	} else {
		c.who = metaapi.Who{UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
		if gs, err := os.Getgroups(); err == nil {
			for _, g := range gs {
				c.who.GIDs = append(c.who.GIDs, uint32(g))
			}
		}
	}
	return c, nil
}

// Close releases the client's connections. Reports of corrupt copies
// still on their way to meta get a moment to arrive: a short-lived
// client (a `sluice cat`) must not take what it found with it.
func (c *Client) Close() error {
	c.reported.flush(reportFlush)
	c.pool.Close()
	c.ep.Close()
	c.meta.Close()
	return nil
}

// Stats are counters of a client.
type Stats struct {
	// BusyRetries counts requests a node refused busy (request table
	// full, chunk locked) that the client retried.
	BusyRetries uint64
	// Failovers counts writes a node failed that the client had meta
	// reconcile and retried; Fenced, writes a node refused because the
	// chunk's replica set changed after their layout (retried on a
	// fresh one).
	Failovers uint64
	Fenced    uint64
	// Optimistic counts reads served from the client's cache and
	// one-sided reads of nodes' exported caches (Options.ODAFS);
	// OptimisticFallbacks, those that fell back to a request.
	Optimistic          uint64
	OptimisticFallbacks uint64
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats {
	return Stats{BusyRetries: c.busyRetries.Load(), Failovers: c.failovers.Load(), Fenced: c.fenced.Load(),
		Optimistic: c.odReads.Load(), OptimisticFallbacks: c.odFallbacks.Load()}
}

// Meta gives access to the raw control-plane client (for tools).
func (c *Client) Meta() *metaapi.Client { return c.meta }

// WaitRepaired polls meta until a scan after since finds everything at
// full redundancy and nothing left to repair (StatusResp.Repaired), or
// ctx ends; it returns the last status.
func (c *Client) WaitRepaired(ctx context.Context, since time.Time) (metaapi.StatusResp, error) {
	for {
		st, err := c.Status(ctx)
		if err == nil && st.Repaired(since) {
			return st, nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("redundancy %+v, repair %+v", st.Redundancy, st.Repair)
			}
			return st, fmt.Errorf("waiting for full redundancy: %w (%v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RevokeNode has meta refuse every certificate of node from now on
// (admins only).
func (c *Client) RevokeNode(ctx context.Context, node ids.NodeID) error {
	return c.meta.Call(ctx, metaapi.OpRevokeNode, metaapi.RevokeNodeReq{Node: node}, nil)
}

// RemoveNode has meta take node out of the cluster for good (admins
// only): one drained, or down with its data repaired elsewhere.
func (c *Client) RemoveNode(ctx context.Context, node ids.NodeID) error {
	return c.meta.Call(ctx, metaapi.OpRemoveNode, metaapi.RemoveNodeReq{Node: node}, nil)
}

// Drain has meta move every chunk off node (cancel: stop doing so).
func (c *Client) Drain(ctx context.Context, node ids.NodeID, cancel bool) error {
	return c.meta.Call(ctx, metaapi.OpDrain, metaapi.DrainReq{Node: node, Cancel: cancel, Who: c.whoOf(ctx)}, nil)
}

// ---- paths ----

// clean validates and normalises an absolute path.
func clean(p string) (string, error) {
	if p == "" {
		return "", metaapi.Errorf(metaapi.EINVAL, "empty path")
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return path.Clean(p), nil
}

// split returns the parent directory and the final name of p.
func split(p string) (dir, name string, err error) {
	if p, err = clean(p); err != nil {
		return "", "", err
	}
	if p == "/" {
		return "", "", metaapi.Errorf(metaapi.EINVAL, "the root has no parent")
	}
	dir, name = path.Split(p)
	return path.Clean(dir), name, nil
}

// Stat returns the attributes of p, following a final symlink.
func (c *Client) Stat(ctx context.Context, p string) (metaapi.Attr, error) {
	return c.resolve(ctx, p, true)
}

// Lstat returns the attributes of p itself.
func (c *Client) Lstat(ctx context.Context, p string) (metaapi.Attr, error) {
	return c.resolve(ctx, p, false)
}

func (c *Client) resolve(ctx context.Context, p string, follow bool) (metaapi.Attr, error) {
	// As in POSIX, a trailing slash means the path must be a directory
	// (following a symlink to one).
	mustDir := len(p) > 1 && strings.HasSuffix(p, "/")
	orig := p
	p, err := clean(p)
	if err != nil {
		return metaapi.Attr{}, err
	}
	var resp metaapi.AttrResp
	err = c.meta.Call(ctx, metaapi.OpResolve, metaapi.ResolveReq{Path: metaapi.ByteString(p), Follow: follow || mustDir}, &resp)
	if err == nil && mustDir && resp.Attr.Type != metaapi.TypeDir {
		err = metaapi.Errorf(metaapi.ENOTDIR, "not a directory")
	}
	return resp.Attr, pathErr("stat", orig, err)
}

// GetAttr returns the attributes of an inode.
func (c *Client) GetAttr(ctx context.Context, ino ids.Ino) (metaapi.Attr, error) {
	var resp metaapi.AttrResp
	err := c.meta.Call(ctx, metaapi.OpGetAttr, metaapi.GetAttrReq{Ino: ino}, &resp)
	return resp.Attr, err
}

// PathError records the operation and path of a failure.
type PathError struct {
	Op   string
	Path string
	Err  error
}

func (e *PathError) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }
func (e *PathError) Unwrap() error { return e.Err }

func pathErr(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return &PathError{Op: op, Path: p, Err: err}
}

// IsNotExist reports whether err says a path does not exist.
func IsNotExist(err error) bool { return metaapi.IsCode(err, metaapi.ENOENT) }

// IsExist reports whether err says a path already exists.
func IsExist(err error) bool { return metaapi.IsCode(err, metaapi.EEXIST) }

// create creates p as req asks (its Parent, Name and Who are filled in).
func (c *Client) create(ctx context.Context, p string, req metaapi.CreateReq) (metaapi.Attr, error) {
	dir, name, err := split(p)
	if err != nil {
		return metaapi.Attr{}, err
	}
	parent, err := c.resolve(ctx, dir, true)
	if err != nil {
		return metaapi.Attr{}, err
	}
	var resp metaapi.AttrResp
	req.Parent, req.Name, req.Who = parent.Ino, metaapi.ByteString(name), c.whoOf(ctx)
	err = c.meta.Call(ctx, metaapi.OpCreate, req, &resp)
	return resp.Attr, pathErr("create", p, err)
}

// Mkdir creates directory p.
func (c *Client) Mkdir(ctx context.Context, p string, mode uint32) error {
	_, err := c.create(ctx, p, metaapi.CreateReq{Type: metaapi.TypeDir, Mode: mode, Exclusive: true})
	return err
}

// MkdirAll creates p and any missing parents.
func (c *Client) MkdirAll(ctx context.Context, p string, mode uint32) error {
	p, err := clean(p)
	if err != nil {
		return err
	}
	if a, err := c.Stat(ctx, p); err == nil {
		if a.Type != metaapi.TypeDir {
			return pathErr("mkdir", p, metaapi.Errorf(metaapi.ENOTDIR, "exists and is not a directory"))
		}
		return nil
	} else if !IsNotExist(err) {
		return err
	}
	if dir := path.Dir(p); dir != p {
		if err := c.MkdirAll(ctx, dir, mode); err != nil {
			return err
		}
	}
	if err := c.Mkdir(ctx, p, mode); err != nil && !IsExist(err) {
		return err
	}
	return nil
}

// Symlink creates a symbolic link at p pointing to target.
func (c *Client) Symlink(ctx context.Context, target, p string) error {
	_, err := c.create(ctx, p, metaapi.CreateReq{Type: metaapi.TypeSymlink, Mode: 0o777, Target: metaapi.ByteString(target), Exclusive: true})
	return err
}

// Remove removes a file, symlink or empty directory.
func (c *Client) Remove(ctx context.Context, p string) error {
	if cp, err := clean(p); err == nil && cp == "/" {
		return pathErr("remove", p, metaapi.Errorf(metaapi.EINVAL, "refusing to remove the root directory"))
	}
	a, err := c.Lstat(ctx, p)
	if err != nil {
		return err
	}
	dir, name, err := split(p)
	if err != nil {
		return err
	}
	parent, err := c.resolve(ctx, dir, true)
	if err != nil {
		return err
	}
	err = c.meta.Call(ctx, metaapi.OpRemove, metaapi.RemoveReq{Parent: parent.Ino, Name: metaapi.ByteString(name), Dir: a.Type == metaapi.TypeDir, Who: c.whoOf(ctx)}, nil)
	if err == nil {
		c.layouts.drop(a.Ino)
	}
	return pathErr("remove", p, err)
}

// RemoveAll removes p and everything below it. It refuses the root
// before touching anything.
func (c *Client) RemoveAll(ctx context.Context, p string) error {
	if cp, err := clean(p); err == nil && cp == "/" {
		return pathErr("remove", p, metaapi.Errorf(metaapi.EINVAL, "refusing to remove the root directory"))
	}
	a, err := c.Lstat(ctx, p)
	if err != nil {
		return err
	}
	if a.Type == metaapi.TypeDir {
		ents, err := c.ReadDir(ctx, p)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := c.RemoveAll(ctx, path.Join(p, string(e.Name))); err != nil && !IsNotExist(err) {
				return err
			}
		}
	}
	return c.Remove(ctx, p)
}

// Rename moves oldp to newp atomically, replacing newp if POSIX allows.
func (c *Client) Rename(ctx context.Context, oldp, newp string) error {
	odir, oname, err := split(oldp)
	if err != nil {
		return err
	}
	ndir, nname, err := split(newp)
	if err != nil {
		return err
	}
	op, err := c.resolve(ctx, odir, true)
	if err != nil {
		return err
	}
	np, err := c.resolve(ctx, ndir, true)
	if err != nil {
		return err
	}
	err = c.meta.Call(ctx, metaapi.OpRename, metaapi.RenameReq{OldParent: op.Ino, OldName: metaapi.ByteString(oname), NewParent: np.Ino, NewName: metaapi.ByteString(nname), Who: c.whoOf(ctx)}, nil)
	return pathErr("rename", oldp, err)
}

// ReadDir lists directory p, sorted by name.
func (c *Client) ReadDir(ctx context.Context, p string) ([]metaapi.Dirent, error) {
	a, err := c.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	var out []metaapi.Dirent
	var after metaapi.ByteString
	for {
		var resp metaapi.ReaddirResp
		if err := c.meta.Call(ctx, metaapi.OpReaddir, metaapi.ReaddirReq{Ino: a.Ino, After: after, Who: c.whoOf(ctx)}, &resp); err != nil {
			return nil, pathErr("readdir", p, err)
		}
		out = append(out, resp.Entries...)
		if !resp.More || len(resp.Entries) == 0 {
			return out, nil
		}
		after = resp.Entries[len(resp.Entries)-1].Name
	}
}

// SetPolicy sets the redundancy policy new files under directory p get.
func (c *Client) SetPolicy(ctx context.Context, p string, pol metaapi.Policy) error {
	a, err := c.Stat(ctx, p)
	if err != nil {
		return err
	}
	err = c.meta.Call(ctx, metaapi.OpSetPolicy, metaapi.SetPolicyReq{Ino: a.Ino, Policy: pol, Who: c.whoOf(ctx)}, nil)
	return pathErr("policy set", p, err)
}

// GetPolicy returns the effective policy of p and the directory it is
// set on.
func (c *Client) GetPolicy(ctx context.Context, p string) (metaapi.PolicyResp, error) {
	a, err := c.Stat(ctx, p)
	if err != nil {
		return metaapi.PolicyResp{}, err
	}
	var resp metaapi.PolicyResp
	err = c.meta.Call(ctx, metaapi.OpGetPolicy, metaapi.GetPolicyReq{Ino: a.Ino}, &resp)
	return resp, pathErr("policy get", p, err)
}

// Status returns the cluster's state.
func (c *Client) Status(ctx context.Context) (metaapi.StatusResp, error) {
	var resp metaapi.StatusResp
	err := c.meta.Call(ctx, metaapi.OpStatus, struct{}{}, &resp)
	return resp, err
}

// Check runs `sluice check`: it starts one (meta walks its records and
// has every node list, with verify read, what it holds; with repair it
// fixes what is safe) and waits for it, calling progress now and then;
// a check already running is waited for instead.
func (c *Client) Check(ctx context.Context, verify, repair bool, progress func(metaapi.CheckResp)) (metaapi.CheckResp, error) {
	var resp metaapi.CheckResp
	req := metaapi.CheckReq{Start: true, Verify: verify, Repair: repair, Who: c.whoOf(ctx)}
	if err := c.meta.Call(ctx, metaapi.OpCheck, req, &resp); err != nil {
		return resp, err
	}
	started := resp.Started
	req = metaapi.CheckReq{Who: req.Who}
	for resp.Done == 0 {
		if progress != nil {
			progress(resp)
		}
		select {
		case <-ctx.Done():
			return resp, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
		if err := c.meta.Call(ctx, metaapi.OpCheck, req, &resp); err != nil {
			return resp, err
		}
		if resp.Started != started {
			return resp, fmt.Errorf("check: another check replaced this one (meta restarted?)")
		}
	}
	return resp, nil
}
