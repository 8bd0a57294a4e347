// Package nfsclient is a small NFSv3 client (RFC 1813) over ONC RPC: it
// mounts an export, walks paths, and reads and writes whole files with a
// configurable transfer size and read-ahead depth. The `sluice nfs-get`
// and `nfs-put` commands and the NFS benchmark use it; it speaks to any
// NFSv3 server, the Sluice gateway among them.
package nfsclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// Caller sends one RPC call and returns a reader of its results: TCP
// (an oncrpc.Client) or a fabricrpc.Client.
type Caller interface {
	// Call sends the arguments in args, whose opaque data of at least
	// ChunkMin bytes are in args.Chunks; dst, if the transport can place
	// data, receives the reply's large opaque (READ data) directly.
	Call(ctx context.Context, prog, vers, proc uint32, cred *oncrpc.AuthSysCred, args *xdr.Writer, dst []byte) (*xdr.Reader, error)
	// ChunkMin is the size from which argument data goes apart from the
	// message (0: everything inline).
	ChunkMin() int
}

// TCP is the Caller of an oncrpc client: everything inline, results
// aliasing the reply record.
func TCP(c *oncrpc.Client) Caller { return tcpCaller{c} }

type tcpCaller struct{ c *oncrpc.Client }

func (t tcpCaller) ChunkMin() int { return 0 }

func (t tcpCaller) Call(ctx context.Context, prog, vers, proc uint32, cred *oncrpc.AuthSysCred, args *xdr.Writer, _ []byte) (*xdr.Reader, error) {
	res, err := t.c.Call(ctx, prog, vers, proc, cred, args.B)
	if err != nil {
		return nil, err
	}
	return xdr.NewReader(res), nil
}

// Options configure a Client.
type Options struct {
	Cred *oncrpc.AuthSysCred // nil: AUTH_NONE
	// ReadSize and WriteSize are the bytes per READ and WRITE (default
	// 1 MiB, at most nfs3.MaxData).
	ReadSize, WriteSize int
	// ReadAhead is how many READs are in flight beyond the one the
	// reader waits for (0: one at a time).
	ReadAhead int
}

// Client is an NFSv3 client of one export.
type Client struct {
	rpc  Caller
	opts Options
	root []byte
}

// StatusError is an NFS status other than NFS3_OK.
type StatusError struct {
	Op     string
	Status nfs3.Status
}

func (e *StatusError) Error() string {
	if m, ok := statusMeaning[e.Status]; ok {
		return fmt.Sprintf("nfs %s: status %d (%s)", e.Op, e.Status, m)
	}
	return fmt.Sprintf("nfs %s: status %d", e.Op, e.Status)
}

// statusMeaning explains the statuses a gateway answers.
var statusMeaning = map[nfs3.Status]string{
	nfs3.ErrNoent:       "no such file or directory",
	nfs3.ErrIO:          "I/O error at the gateway (a storage node failed the data)",
	nfs3.ErrExist:       "file exists",
	nfs3.ErrXdev:        "cross-device link (two exports)",
	nfs3.ErrNotdir:      "not a directory",
	nfs3.ErrIsdir:       "is a directory",
	nfs3.ErrInval:       "invalid argument",
	nfs3.ErrFbig:        "file too large",
	nfs3.ErrNospc:       "no space left: no storage nodes can take the data",
	nfs3.ErrMlink:       "too many links",
	nfs3.ErrNametoolong: "name too long",
	nfs3.ErrNotempty:    "directory not empty",
	nfs3.ErrBadhandle:   "bad file handle",
	nfs3.ErrNotsupp:     "operation not supported",
	nfs3.ErrServerfault: "the gateway failed",
	nfs3.ErrJukebox:     "try again later: the cluster's meta service is unreachable from the gateway",
	nfs3.ErrPerm:        "not permitted: a secure export refuses calls from unprivileged ports",
	nfs3.ErrAcces:       "permission denied: by the file's mode for the identity the export maps the caller to, or the export is not exported to this address",
	nfs3.ErrRofs:        "the export is read-only",
	nfs3.ErrStale:       "stale file handle",
}

// Mount mounts export (MOUNT v3 on the same caller) and returns a client
// of it.
func Mount(ctx context.Context, rpc Caller, export string, opts Options) (*Client, error) {
	if opts.ReadSize <= 0 || opts.ReadSize > nfs3.MaxData {
		opts.ReadSize = nfs3.MaxData
	}
	if opts.WriteSize <= 0 || opts.WriteSize > nfs3.MaxData {
		opts.WriteSize = nfs3.MaxData
	}
	var w xdr.Writer
	w.String(export)
	r, err := rpc.Call(ctx, nfs3.ProgMount, nfs3.Version, nfs3.MountMnt, opts.Cred, &w, nil)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, oncrpc.ErrRecordTooLarge) {
			// What a server that is not an NFS gateway looks like: it
			// hangs up on an RPC record, or answers something else.
			return nil, fmt.Errorf("mounting %s: %w (is this the address of an NFS gateway, `sluice nfs --listen`? not meta's or a storage node's)", export, err)
		}
		return nil, fmt.Errorf("mounting %s: %w", export, err)
	}
	if st := r.Uint32(); st != 0 {
		msg := ""
		switch st {
		case 13:
			msg = " (access denied: not exported to this address, or a call from an unprivileged port to a secure export)"
		case 2:
			msg = " (no such directory under the export)"
		case 20:
			msg = " (not a directory)"
		}
		return nil, fmt.Errorf("mounting %s: mount status %d%s", export, st, msg)
	}
	fh := r.Opaque(64)
	if r.Err() != nil {
		return nil, fmt.Errorf("mounting %s: %w", export, r.Err())
	}
	c := &Client{rpc: rpc, opts: opts, root: append([]byte(nil), fh...)}
	// Transfer sizes no larger than the server takes (FSINFO).
	fw := c.args()
	fw.Opaque(c.root)
	fr, err := c.call(ctx, "fsinfo", nfs3.ProcFsinfo, fw, nil)
	if err != nil {
		return nil, err
	}
	nfs3.SkipPostOp(fr)
	rtmax, _, _, wtmax := fr.Uint32(), fr.Uint32(), fr.Uint32(), fr.Uint32()
	if fr.Err() != nil {
		return nil, fmt.Errorf("nfs fsinfo: %w", fr.Err())
	}
	if rtmax > 0 {
		c.opts.ReadSize = min(c.opts.ReadSize, int(rtmax))
	}
	if wtmax > 0 {
		c.opts.WriteSize = min(c.opts.WriteSize, int(wtmax))
	}
	return c, nil
}

// args returns a writer for a call's arguments, chunking as the
// transport does.
func (c *Client) args() *xdr.Writer { return &xdr.Writer{ChunkMin: c.rpc.ChunkMin()} }

// call makes NFS procedure proc and returns the reader after an OK
// status; dst is where READ data may be placed.
func (c *Client) call(ctx context.Context, op string, proc uint32, args *xdr.Writer, dst []byte) (*xdr.Reader, error) {
	r, err := c.rpc.Call(ctx, nfs3.ProgNFS, nfs3.Version, proc, c.opts.Cred, args, dst)
	if err != nil {
		return nil, fmt.Errorf("nfs %s: %w", op, err)
	}
	if st := nfs3.Status(r.Uint32()); st != nfs3.OK || r.Err() != nil {
		if r.Err() != nil {
			return nil, fmt.Errorf("nfs %s: %w", op, r.Err())
		}
		return nil, &StatusError{Op: op, Status: st}
	}
	return r, nil
}

// Lookup walks p (slash-separated, relative to the export) and returns
// its handle.
func (c *Client) Lookup(ctx context.Context, p string) ([]byte, error) {
	fh := c.root
	for _, name := range strings.Split(p, "/") {
		if name == "" || name == "." {
			continue
		}
		w := c.args()
		w.Opaque(fh)
		w.String(name)
		r, err := c.call(ctx, "lookup "+name, nfs3.ProcLookup, w, nil)
		if err != nil {
			return nil, err
		}
		fh = append([]byte(nil), r.Opaque(64)...)
		if r.Err() != nil {
			return nil, r.Err()
		}
	}
	return fh, nil
}

// Size returns the size of the file fh names.
func (c *Client) Size(ctx context.Context, fh []byte) (int64, error) {
	w := c.args()
	w.Opaque(fh)
	r, err := c.call(ctx, "getattr", nfs3.ProcGetattr, w, nil)
	if err != nil {
		return 0, err
	}
	r.Fixed(20) // type, mode, nlink, uid, gid
	size := r.Uint64()
	return int64(size), r.Err()
}

// ReadTo reads the file fh names from the start to its end into w, with
// ReadAhead READs in flight beyond the one being written, and returns
// the bytes read.
func (c *Client) ReadTo(ctx context.Context, fh []byte, w io.Writer) (int64, error) {
	type result struct {
		data []byte
		buf  []byte // the placement buffer to give back, if any
		eof  bool
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	depth := c.opts.ReadAhead + 1
	queue := make(chan chan result, depth)
	// A transport that places READ data directly gets a buffer per READ
	// in flight, reused: the data lands where w reads it from.
	var free chan []byte
	if c.rpc.ChunkMin() > 0 {
		free = make(chan []byte, depth+1)
		for range depth + 1 {
			free <- make([]byte, c.opts.ReadSize)
		}
	}
	var wg sync.WaitGroup
	go func() { // issue READs in order, at most depth ahead
		defer close(queue)
		for off := int64(0); ctx.Err() == nil; off += int64(c.opts.ReadSize) {
			ch := make(chan result, 1)
			select {
			case queue <- ch:
			case <-ctx.Done():
				return
			}
			var buf []byte
			if free != nil {
				select {
				case buf = <-free:
				case <-ctx.Done():
					ch <- result{err: ctx.Err()}
					return
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				data, eof, err := c.read(ctx, fh, off, c.opts.ReadSize, buf)
				ch <- result{data, buf, eof, err}
			}()
		}
	}()
	// stop ends the issuing and waits for every READ issued (no Add can
	// race the Wait once the queue is closed and drained).
	stop := func() {
		cancel()
		for range queue {
		}
		wg.Wait()
	}
	var n int64
	for ch := range queue {
		res := <-ch
		if res.err == nil {
			if _, err := w.Write(res.data); err != nil {
				res.err = err
			}
		}
		if res.buf != nil {
			free <- res.buf
		}
		if res.err != nil {
			stop()
			return n, res.err
		}
		n += int64(len(res.data))
		if res.eof || len(res.data) == 0 {
			break
		}
		if len(res.data) < c.opts.ReadSize {
			// The next READs were issued at whole steps: a short one
			// not at the end would leave a gap.
			stop()
			return n, fmt.Errorf("nfs read: the server returned %d of %d bytes before the end of the file", len(res.data), c.opts.ReadSize)
		}
	}
	stop()
	return n, nil
}

// read is one READ; dst, if the transport places data, receives it.
func (c *Client) read(ctx context.Context, fh []byte, off int64, n int, dst []byte) ([]byte, bool, error) {
	w := c.args()
	w.Opaque(fh)
	w.Uint64(uint64(off))
	w.Uint32(uint32(n))
	r, err := c.call(ctx, "read", nfs3.ProcRead, w, dst)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, false, err
	}
	nfs3.SkipPostOp(r)
	count, eof := r.Uint32(), r.Bool()
	data := r.Opaque(nfs3.MaxData)
	if r.Err() != nil || int(count) != len(data) {
		return nil, false, errors.Join(errors.New("nfs read: malformed reply"), r.Err())
	}
	return data, eof, nil
}

// Create creates (or truncates) the file at p, whose directory exists,
// and returns its handle.
func (c *Client) Create(ctx context.Context, p string, mode uint32) ([]byte, error) {
	p = strings.Trim(p, "/")
	dirPath, name := "", p
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		dirPath, name = p[:i], p[i+1:]
	}
	dir, err := c.Lookup(ctx, dirPath)
	if err != nil {
		return nil, err
	}
	w := c.args()
	w.Opaque(dir)
	w.String(name)
	w.Uint32(0) // UNCHECKED
	w.Bool(true)
	w.Uint32(mode)
	w.Bool(false) // uid
	w.Bool(false) // gid
	w.Bool(true)  // size 0
	w.Uint64(0)
	w.Uint32(0) // atime, mtime: don't change
	w.Uint32(0)
	r, err := c.call(ctx, "create "+name, nfs3.ProcCreate, w, nil)
	if err != nil {
		return nil, err
	}
	if !r.Bool() {
		return c.Lookup(ctx, p)
	}
	fh := append([]byte(nil), r.Opaque(64)...)
	return fh, r.Err()
}

// WriteFrom writes everything src yields to the file fh names from
// offset 0, WriteSize bytes per WRITE (UNSTABLE), then COMMITs, and
// checks that the server's write verifier did not change meanwhile (a
// restart would have lost unstable data).
func (c *Client) WriteFrom(ctx context.Context, fh []byte, src io.Reader) (int64, error) {
	buf := make([]byte, c.opts.WriteSize)
	var off int64
	var verf []byte
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			w := c.args()
			w.Opaque(fh)
			w.Uint64(uint64(off))
			w.Uint32(uint32(n))
			w.Uint32(nfs3.Unstable)
			w.Opaque(buf[:n])
			r, err := c.call(ctx, "write", nfs3.ProcWrite, w, nil)
			if err != nil {
				return off, err
			}
			nfs3.SkipWcc(r)
			count, _ := r.Uint32(), r.Uint32()
			v := r.Fixed(8)
			if r.Err() != nil || int(count) != n {
				return off, fmt.Errorf("nfs write: short write (%d of %d) or malformed reply: %v", count, n, r.Err())
			}
			if verf == nil {
				verf = append([]byte(nil), v...)
			} else if string(v) != string(verf) {
				return off, errors.New("nfs write: the server restarted during the write (verifier changed)")
			}
			off += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return off, rerr
		}
	}
	w := c.args()
	w.Opaque(fh)
	w.Uint64(0)
	w.Uint32(0)
	r, err := c.call(ctx, "commit", nfs3.ProcCommit, w, nil)
	if err != nil {
		return off, err
	}
	nfs3.SkipWcc(r)
	v := r.Fixed(8)
	if r.Err() != nil {
		return off, r.Err()
	}
	if verf != nil && string(v) != string(verf) {
		return off, errors.New("nfs commit: the server restarted during the write (verifier changed)")
	}
	return off, nil
}

// Stats returns the TCP client's counters.
func (t tcpCaller) Stats() oncrpc.Stats { return t.c.Stats() }
