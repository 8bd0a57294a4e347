// Package client is Sluice's SDK for Go programs: connect with the
// client.conf `sluice` writes (NewFromFile), then store and read whole
// files (Put, Get), read and write in place (Open, Create, File.ReadAt,
// File.WriteAt), and manage the namespace and per-directory redundancy
// policies (Mkdir, Rename, Remove, ReadDir, Stat, SetPolicy). Every
// type it names is its own or the standard library's, so a module
// outside Sluice's can use all of it; examples/sdk is one.
//
// Under it is the same SDK the sluice command, the FUSE mount and the
// NFS gateway use (internal/sdk): data goes straight between this
// process and the storage nodes, a write is durable on every replica
// (or every unit of an erasure code) when it returns, and a read returns
// only bytes verified against the nodes' checksums.
package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"time"

	"github.com/sluicefs/sluice/internal/config"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Conf is the content of client.conf, the file `sluice` writes for a
// principal: the meta address (Meta, host:port), the principal's id and
// secret credential (ClientID, Credential, Principal) and the PEM of the
// cluster CA meta's certificate must chain to (CA). NewFromFile reads one.
type Conf = config.ClientConf

// Who is an identity for permission checks at meta: a uid, its primary
// gid and supplementary gids (UID, GID, GIDs).
type Who = metaapi.Who

// Options configure a client. The zero value of every field but Conf
// is a sensible default.
type Options struct {
	// Conf says where meta is and who the client is (NewFromFile reads
	// it from client.conf).
	Conf Conf
	// Who is the identity for permission checks; default the process's.
	Who *Who
	// MTU is the largest packet payload to the storage nodes (default
	// 64 KiB).
	MTU int
	// WriteMsg is the largest write request sent to a node (default
	// 16 MiB); ReadReq the size of one read request (default 4 MiB);
	// Parallel bounds requests in flight for one Put or Get (default 4).
	WriteMsg int
	ReadReq  int
	Parallel int
	// BusyRetry bounds how long a write keeps retrying while a node
	// answers busy (default 30 s).
	BusyRetry time.Duration
	// OpTimeout bounds how long a call to meta is retried while meta
	// cannot be reached (a restart; default 15 s). Before meta has ever
	// answered, retries stop after 2 s (a wrong address fails fast)
	// unless WaitForMeta is set.
	OpTimeout   time.Duration
	WaitForMeta bool
	// FabricTLS reaches the storage nodes over TLS 1.3; the nodes must
	// run with it too.
	FabricTLS bool
	// Logger receives the client's diagnostics (default: none).
	Logger *slog.Logger
}

func (o Options) sdk() sdk.Options {
	return sdk.Options{Conf: o.Conf, Who: o.Who, MTU: o.MTU, WriteMsg: o.WriteMsg, ReadReq: o.ReadReq,
		Parallel: o.Parallel, BusyRetry: o.BusyRetry, OpTimeout: o.OpTimeout, WaitForMeta: o.WaitForMeta,
		FabricTLS: o.FabricTLS, Logger: o.Logger}
}

// Client is a connection to one cluster, safe for concurrent use.
type Client struct{ c *sdk.Client }

// New connects to the cluster described by opts.Conf. No network traffic
// happens until the first call.
func New(opts Options) (*Client, error) {
	c, err := sdk.New(opts.sdk())
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// NewFromFile is New with opts.Conf read from the client.conf at path;
// whatever opts.Conf held is replaced.
func NewFromFile(path string, opts Options) (*Client, error) {
	conf, err := config.Load(path)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	opts.Conf = conf
	return New(opts)
}

// Close releases the client's connections.
func (c *Client) Close() error { return c.c.Close() }

// WithWho returns a context whose calls are made as who instead of the
// client's identity: a server acting for many users passes each
// request's caller.
func WithWho(ctx context.Context, who Who) context.Context { return sdk.WithWho(ctx, who) }

// Put stores r's content as file p with permission bits mode, atomically:
// readers see the old file or all of the new. It returns the bytes stored.
func (c *Client) Put(ctx context.Context, p string, r io.Reader, mode uint32) (int64, error) {
	return c.c.Put(ctx, p, r, mode)
}

// Get writes file p's content to w and returns the bytes written.
func (c *Client) Get(ctx context.Context, p string, w io.Writer) (int64, error) {
	return c.c.Get(ctx, p, w)
}

// Mkdir creates directory p; MkdirAll creates it and any missing parents.
func (c *Client) Mkdir(ctx context.Context, p string, mode uint32) error {
	return c.c.Mkdir(ctx, p, mode)
}

// MkdirAll creates directory p and any missing parents.
func (c *Client) MkdirAll(ctx context.Context, p string, mode uint32) error {
	return c.c.MkdirAll(ctx, p, mode)
}

// Symlink creates p as a symbolic link to target.
func (c *Client) Symlink(ctx context.Context, target, p string) error {
	return c.c.Symlink(ctx, target, p)
}

// Remove removes file, link or empty directory p; RemoveAll removes p
// and everything under it.
func (c *Client) Remove(ctx context.Context, p string) error { return c.c.Remove(ctx, p) }

// RemoveAll removes p and everything under it (nothing there is no error).
func (c *Client) RemoveAll(ctx context.Context, p string) error { return c.c.RemoveAll(ctx, p) }

// Rename moves oldp to newp, replacing a file there.
func (c *Client) Rename(ctx context.Context, oldp, newp string) error {
	return c.c.Rename(ctx, oldp, newp)
}

// Stat describes p, following a symbolic link at its end.
func (c *Client) Stat(ctx context.Context, p string) (fs.FileInfo, error) {
	a, err := c.c.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return newInfo(p, a), nil
}

// Lstat describes p without following a symbolic link at its end.
func (c *Client) Lstat(ctx context.Context, p string) (fs.FileInfo, error) {
	a, err := c.c.Lstat(ctx, p)
	if err != nil {
		return nil, err
	}
	return newInfo(p, a), nil
}

// ReadDir lists directory p, sorted by name.
func (c *Client) ReadDir(ctx context.Context, p string) ([]fs.DirEntry, error) {
	ents, err := c.c.ReadDir(ctx, p)
	if err != nil {
		return nil, err
	}
	out := make([]fs.DirEntry, len(ents))
	for i, e := range ents {
		out[i] = dirEntry{c: c.c, ctx: context.WithoutCancel(ctx), e: e}
	}
	return out, nil
}

// Open opens file p for reading and writing in place.
func (c *Client) Open(ctx context.Context, p string) (*File, error) {
	f, err := c.c.Open(ctx, p)
	if err != nil {
		return nil, err
	}
	return &File{f: f, name: p}, nil
}

// Create creates file p with permission bits mode, or truncates it if it
// exists (as os.Create), and opens it.
func (c *Client) Create(ctx context.Context, p string, mode uint32) (*File, error) {
	f, err := c.c.Create(ctx, p, mode)
	if err != nil {
		return nil, err
	}
	return &File{f: f, name: p}, nil
}

// Stats are the client's counters since it was made.
type Stats = sdk.Stats

// Stats returns the client's counters.
func (c *Client) Stats() Stats { return c.c.Stats() }

// PathError is an error of an operation on a path; NodeError one of a
// storage node, named by address.
type (
	PathError = sdk.PathError
	NodeError = sdk.NodeError
)

// IsNotExist reports whether err says a path does not exist; IsExist,
// that it exists when it must not.
func IsNotExist(err error) bool { return sdk.IsNotExist(err) }

// IsExist reports whether err says a path exists when it must not.
func IsExist(err error) bool { return sdk.IsExist(err) }
