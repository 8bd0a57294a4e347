package sdk

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/wire"
)

// File is an open regular file. Its size is the one seen at Open and
// updated by this handle's own writes (close-to-open consistency: open
// again to see other clients' writes). It is safe for concurrent use.
type File struct {
	c    *Client
	path string

	mu   sync.Mutex
	attr metaapi.Attr
}

// Open opens an existing regular file for reading and writing.
func (c *Client) Open(ctx context.Context, p string) (*File, error) {
	a, err := c.Stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return c.OpenAttr(a, p)
}

// Create creates p (or truncates it if it exists) and opens it.
func (c *Client) Create(ctx context.Context, p string, mode uint32) (*File, error) {
	return c.createFile(ctx, p, metaapi.CreateReq{Mode: mode})
}

// createFile creates regular file p as req asks (see create).
func (c *Client) createFile(ctx context.Context, p string, req metaapi.CreateReq) (*File, error) {
	req.Type = metaapi.TypeFile
	a, err := c.create(ctx, p, req)
	if err != nil {
		return nil, err
	}
	if a.Type != metaapi.TypeFile {
		return nil, pathErr("create", p, metaapi.Errorf(metaapi.EISDIR, "exists and is a %s", a.Type))
	}
	f := &File{c: c, path: p, attr: a}
	if a.Size > 0 {
		if err := f.Truncate(ctx, 0); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// Attr returns the file's attributes as this handle knows them.
func (f *File) Attr() metaapi.Attr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attr
}

// Size is the file's size as this handle knows it.
func (f *File) Size() int64 { return f.Attr().Size }

// Close releases the handle. Writes are durable when WriteAt returns, so
// there is nothing to flush.
func (f *File) Close() error { return nil }

// Truncate sets the file's size.
func (f *File) Truncate(ctx context.Context, size int64) error {
	var resp metaapi.AttrResp
	err := f.c.meta.Call(ctx, metaapi.OpSetAttr, metaapi.SetAttrReq{Ino: f.Attr().Ino, Size: &size, Who: f.c.whoOf(ctx)}, &resp)
	if err != nil {
		return pathErr("truncate", f.path, err)
	}
	f.c.layouts.drop(f.Attr().Ino)
	f.mu.Lock()
	f.attr = resp.Attr
	f.mu.Unlock()
	return nil
}

// WriteAt writes p at off. It returns once the data is durable on every
// replica and the new size is recorded.
func (f *File) WriteAt(p []byte, off int64) (int, error) {
	return f.WriteAtContext(context.Background(), p, off)
}

// WriteAtContext is WriteAt with a context.
func (f *File) WriteAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("write", f.path, metaapi.Errorf(metaapi.EINVAL, "negative offset"))
	}
	if int64(len(p)) > metaapi.MaxFileSize-off { // off+len(p) could wrap
		return 0, pathErr("write", f.path, metaapi.Errorf(metaapi.EFBIG, "write ends beyond the largest file size"))
	}
	versions, err := f.writeRange(ctx, p, off)
	if err != nil {
		return 0, pathErr("write", f.path, err)
	}
	if err := f.commit(ctx, off+int64(len(p)), versions); err != nil {
		return 0, err
	}
	return len(p), nil
}

// WriteData writes p at off durably on every replica but does not record
// the write with meta: the file's size and the chunks' versions change
// only with a later Commit of what it returns. Front ends that batch
// their commits (write-back caches) and benchmarks of the data path use
// it; until the commit, other clients do not see the new size.
func (f *File) WriteData(ctx context.Context, p []byte, off int64) ([]metaapi.ChunkVersion, error) {
	if off < 0 || int64(len(p)) > metaapi.MaxFileSize-off { // off+len(p) could wrap
		return nil, pathErr("write", f.path, metaapi.Errorf(metaapi.EINVAL, "write [%d,+%d) out of range", off, len(p)))
	}
	versions, err := f.writeRange(ctx, p, off)
	return versions, pathErr("write", f.path, err)
}

// Commit records writes made with WriteData: the file grows to at least
// size and the chunks' committed versions advance.
func (f *File) Commit(ctx context.Context, size int64, versions []metaapi.ChunkVersion) error {
	return f.commit(ctx, size, versions)
}

// writeRange writes p at off straight from p (no copy): the chunks it
// spans in parallel, the messages within one chunk in order.
func (f *File) writeRange(ctx context.Context, p []byte, off int64) ([]metaapi.ChunkVersion, error) {
	cs := f.Attr().ChunkSize
	type part struct {
		off int64
		p   []byte
	}
	var parts []part
	for done := int64(0); done < int64(len(p)); {
		pos := off + done
		n := min(int64(len(p))-done, cs-pos%cs)
		parts = append(parts, part{pos, p[done : done+n]})
		done += n
	}
	var (
		mu       sync.Mutex
		versions []metaapi.ChunkVersion
		firstErr error
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, f.c.opts.Parallel)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, pt := range parts {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			for done := 0; done < len(pt.p); {
				n, v, err := f.writeOne(ctx, pt.p[done:], pt.off+int64(done))
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					cancel()
					return
				}
				versions = append(versions, v)
				mu.Unlock()
				done += n
			}
		}()
	}
	wg.Wait()
	return versions, firstErr
}

// writeOne writes the front of p that fits in one chunk and one message.
func (f *File) writeOne(ctx context.Context, p []byte, off int64) (int, metaapi.ChunkVersion, error) {
	c := f.c
	a := f.Attr()
	if g, ok := ecGeomOf(&a); ok {
		return f.ecWriteOne(ctx, g, p, off)
	}
	cs := a.ChunkSize
	wm, err := c.modeFor(a.Policy)
	if err != nil {
		return 0, metaapi.ChunkVersion{}, err
	}
	idx, cOff := off/cs, off%cs
	n := min(int64(len(p)), cs-cOff, int64(c.opts.WriteMsg))
	id, zeroID := newWriteID(), newWriteID() // kept across the retries below
	var fo failover
	for attempt := 0; ; attempt++ {
		ls, _, err := c.chunkLayouts(ctx, a.Ino, cs, off, n, true)
		if err != nil {
			if fo.waitRepair(ctx, err) {
				continue
			}
			return 0, metaapi.ChunkVersion{}, fo.explain(err)
		}
		l, ok := ls[idx]
		if !ok {
			return 0, metaapi.ChunkVersion{}, fmt.Errorf("meta returned no layout for chunk %d", idx)
		}
		if l.ZeroFrom > 0 && cOff > l.ZeroFrom {
			// Stale bytes lie between the old truncation point and this
			// write: overwrite them with zeros first.
			_, err = c.writeChunk(ctx, &l, l.ZeroFrom, make([]byte, cOff-l.ZeroFrom), wm, zeroID)
		}
		var ver uint64
		if err == nil {
			ver, err = c.writeChunk(ctx, &l, cOff, p[:n], wm, id)
		}
		if s, ok := statusOf(err); ok && s == wire.StatusAuth && attempt == 0 {
			// The capability may have expired or the layout changed:
			// ask meta again once.
			c.layouts.dropChunk(a.Ino, idx)
			continue
		}
		if err != nil && c.failover(ctx, &fo, a.Ino, &l, err) {
			continue
		}
		if err != nil {
			return 0, metaapi.ChunkVersion{}, err
		}
		c.layouts.written(a.Ino, &l, ver)
		return int(n), metaapi.ChunkVersion{Index: idx, Chunk: l.Chunk, Version: ver, End: cOff + n}, nil
	}
}

func (f *File) commit(ctx context.Context, size int64, versions []metaapi.ChunkVersion) error {
	var resp metaapi.AttrResp
	req := metaapi.CommitReq{Ino: f.Attr().Ino, Size: size, Chunks: versions, Mtime: time.Now().UnixNano(), Who: f.c.whoOf(ctx)}
	if err := f.c.meta.Call(ctx, metaapi.OpCommit, req, &resp); err != nil {
		return pathErr("write", f.path, fmt.Errorf("recording the write with meta: %w", err))
	}
	f.mu.Lock()
	if resp.Attr.Size >= f.attr.Size {
		f.attr = resp.Attr
	}
	f.mu.Unlock()
	return nil
}

// ReadAt reads len(p) bytes at off (io.ReaderAt).
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt with a context. Pieces are fetched in parallel.
func (f *File) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, pathErr("read", f.path, metaapi.Errorf(metaapi.EINVAL, "negative offset"))
	}
	size := f.Size()
	if off >= size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := min(int64(len(p)), size-off)
	cs := f.Attr().ChunkSize
	pieces := f.c.split(cs, off, n)
	sem := make(chan struct{}, f.c.opts.Parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, pc := range pieces {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			dst := p[pc.off-off:][:pc.n]
			var err error
			if directRead(pc.off%cs, pc.n) { // blocks are counted from the chunk's start
				err = f.readPieceInto(ctx, pc, i, dst)
			} else {
				err = f.readPiece(ctx, pc, i, func(b []byte) { copy(dst, b) })
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, pathErr("read", f.path, firstErr)
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// span is a range of a file within one chunk, at most one read request.
type span struct{ off, n int64 }

func (c *Client) split(cs, off, n int64) []span {
	var out []span
	max := int64(c.maxReadLen())
	for end := off + n; off < end; {
		k := min(end-off, cs-off%cs, max)
		out = append(out, span{off, k})
		off += k
	}
	return out
}

// readPiece fetches one span and hands the verified bytes to use (the
// slice is only valid during the call). Holes read as zeros.
func (f *File) readPiece(ctx context.Context, s span, i int, use func([]byte)) error {
	var data []byte
	var release func()
	if err := f.readPieceKeep(ctx, s, i, &data, &release); err != nil {
		return err
	}
	use(data)
	if release != nil {
		release()
	}
	return nil
}

// replicatedPiece reads span s of a replicated file, into dst if it is
// not nil (else a pooled buffer the piece holds). hole: the chunk was
// never written, nothing was read.
func (f *File) replicatedPiece(ctx context.Context, a metaapi.Attr, s span, i int, dst []byte) (pc piece, hole bool, err error) {
	c := f.c
	cs := a.ChunkSize
	idx := s.off / cs
	for attempt := 0; ; attempt++ {
		ls, _, err := c.chunkLayouts(ctx, a.Ino, cs, s.off, s.n, false)
		if err != nil {
			return piece{}, false, err
		}
		l, ok := ls[idx]
		if !ok {
			return piece{}, true, nil
		}
		pc, err := c.readChunk(ctx, &l, s.off%cs, s.n, i, dst)
		if err != nil {
			if attempt == 0 && ctx.Err() == nil {
				c.layouts.dropChunk(a.Ino, idx)
				continue
			}
			return piece{}, false, err
		}
		return pc, false, nil
	}
}
