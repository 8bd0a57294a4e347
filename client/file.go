package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

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
	return c.createFile(ctx, p, mode, false)
}

func (c *Client) createFile(ctx context.Context, p string, mode uint32, exclusive bool) (*File, error) {
	a, err := c.create(ctx, p, metaapi.TypeFile, mode, "", exclusive)
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
	err := f.c.meta.Call(ctx, metaapi.OpSetAttr, metaapi.SetAttrReq{Ino: f.attr.Ino, Size: &size, Who: f.c.whoOf(ctx)}, &resp)
	if err != nil {
		return pathErr("truncate", f.path, err)
	}
	f.c.layouts.drop(f.attr.Ino)
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
	if off+int64(len(p)) > metaapi.MaxFileSize {
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
	if off < 0 || off+int64(len(p)) > metaapi.MaxFileSize {
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
	req := metaapi.CommitReq{Ino: f.attr.Ino, Size: size, Chunks: versions, Mtime: time.Now().UnixNano(), Who: f.c.whoOf(ctx)}
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

// Put stores everything read from r at p, replacing any file there. The
// data goes to a hidden temporary file in the same directory which is
// renamed over p only once all of it is durable: readers see the old
// file or the whole new one, never a part.
func (c *Client) Put(ctx context.Context, p string, r io.Reader, mode uint32) (int64, error) {
	dir, name, err := split(p)
	if err != nil {
		return 0, err
	}
	// Refuse what the final rename would refuse before uploading anything.
	if len(name) > metaapi.MaxNameLen {
		return 0, pathErr("put", p, metaapi.Errorf(metaapi.ENAMETOOLONG, "name of %d bytes, at most %d", len(name), metaapi.MaxNameLen))
	}
	if strings.HasSuffix(p, "/") {
		return 0, pathErr("put", p, metaapi.Errorf(metaapi.EISDIR, "needs a file name, not a directory"))
	}
	if a, err := c.Lstat(ctx, p); err == nil && a.Type == metaapi.TypeDir {
		return 0, pathErr("put", p, metaapi.Errorf(metaapi.EISDIR, "is a directory"))
	} else if err != nil && !IsNotExist(err) {
		return 0, err
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmpName := "." + name + ".sluice-put-" + hex.EncodeToString(rnd[:])
	if len(tmpName) > metaapi.MaxNameLen {
		tmpName = ".sluice-put-" + hex.EncodeToString(rnd[:])
	}
	tmp := path.Join(dir, tmpName)
	f, err := c.createFile(ctx, tmp, mode, true)
	if err != nil {
		return 0, err
	}
	n, err := f.writeSource(ctx, r)
	if err == nil {
		err = c.Rename(ctx, tmp, p)
	}
	if err != nil {
		if rerr := c.Remove(context.WithoutCancel(ctx), tmp); rerr != nil && !IsNotExist(rerr) {
			c.log.Warn("put: removing temporary file", "path", tmp, "err", rerr)
		}
		return n, pathErr("put", p, err)
	}
	return n, nil
}

// writeSource writes everything r yields from offset 0 and records it.
// A regular file is mapped and sent straight from the page cache (no copy
// through a buffer); anything else is streamed through buffers.
func (f *File) writeSource(ctx context.Context, r io.Reader) (int64, error) {
	if src, ok := r.(*os.File); ok {
		if data, release, ok := mapFile(src); ok {
			defer release()
			versions, err := f.writeRange(ctx, data, 0)
			if err != nil {
				return 0, err
			}
			return int64(len(data)), f.commit(ctx, int64(len(data)), versions)
		}
	}
	return f.writeFrom(ctx, r)
}

// mapFile maps the rest of a regular file read-only, from its current
// offset, and moves the offset to the end as reading would.
func mapFile(src *os.File) (data []byte, release func(), ok bool) {
	fi, err := src.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil, nil, false
	}
	pos, err := src.Seek(0, io.SeekCurrent)
	if err != nil || fi.Size()-pos < 1<<20 {
		return nil, nil, false
	}
	base := pos &^ int64(os.Getpagesize()-1)
	mem, err := unix.Mmap(int(src.Fd()), base, int(fi.Size()-base), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, false
	}
	unix.Madvise(mem, unix.MADV_SEQUENTIAL)
	if _, err := src.Seek(0, io.SeekEnd); err != nil {
		unix.Munmap(mem)
		return nil, nil, false
	}
	return mem[pos-base:], func() { unix.Munmap(mem) }, true
}

// writeFrom writes r's content from offset 0, with buffers being filled
// while others are written. Writes to one chunk run one at a time and in
// file order (the node would refuse a concurrent one busy, and an
// out-of-order one would turn a plain append into an overwrite of a
// hole); different chunks proceed in parallel.
func (f *File) writeFrom(ctx context.Context, r io.Reader) (int64, error) {
	c := f.c
	cs := f.Attr().ChunkSize
	depth := max(2, c.opts.Parallel/2)
	type job struct {
		off   int64
		buf   []byte
		after <-chan struct{} // the previous write to the same chunk
		done  chan struct{}
	}
	msg := c.opts.WriteMsg
	if a := f.Attr(); a.Policy != nil && a.Policy.EC != nil {
		// Whole stripes per message, so only the last one is partial.
		if g, ok := ecGeomOf(&a); ok {
			msg = int(max(1, int64(msg)/g.width) * g.width)
		}
	}
	free := make(chan []byte, depth)
	for range depth {
		free <- make([]byte, msg)
	}
	jobs := make(chan job)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		versions []metaapi.ChunkVersion
		werr     error
		wg       sync.WaitGroup
	)
	for range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if j.after != nil {
					<-j.after
				}
				var v metaapi.ChunkVersion
				var err error
				for done := 0; done < len(j.buf) && err == nil; {
					var n int
					n, v, err = f.writeOne(ctx, j.buf[done:], j.off+int64(done))
					done += n
					if err == nil {
						mu.Lock()
						versions = append(versions, v)
						mu.Unlock()
					}
				}
				close(j.done)
				if err != nil {
					mu.Lock()
					if werr == nil {
						werr = err
					}
					mu.Unlock()
					cancel()
				}
				free <- j.buf[:cap(j.buf)]
			}
		}()
	}
	var total int64
	var rerr error
	var prev chan struct{} // done channel of the last job, if in the current chunk
	for ctx.Err() == nil {
		var buf []byte
		select {
		case buf = <-free:
		case <-ctx.Done():
		}
		if buf == nil {
			break
		}
		// A message never crosses a chunk boundary.
		want := min(int64(len(buf)), cs-total%cs)
		n, err := io.ReadFull(r, buf[:want])
		if n > 0 {
			j := job{off: total, buf: buf[:n], done: make(chan struct{})}
			if total%cs != 0 {
				j.after = prev
			}
			prev = j.done
			select {
			case jobs <- j:
			case <-ctx.Done():
			}
			total += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			rerr = fmt.Errorf("reading input: %w", err)
			cancel()
			break
		}
	}
	close(jobs)
	wg.Wait()
	switch {
	case werr != nil:
		return total, werr
	case rerr != nil:
		return total, rerr
	case ctx.Err() != nil:
		return total, ctx.Err()
	}
	return total, f.commit(ctx, total, versions)
}

// Get writes the content of file p to w, fetching pieces in parallel and
// writing them in order. It returns the bytes written.
func (c *Client) Get(ctx context.Context, p string, w io.Writer) (int64, error) {
	f, err := c.Open(ctx, p)
	if err != nil {
		return 0, err
	}
	a := f.Attr()
	if _, _, err := c.chunkLayouts(ctx, a.Ino, a.ChunkSize, 0, a.Size, false); err != nil {
		return 0, pathErr("get", p, err)
	}
	type result struct {
		data    []byte
		release func()
		err     error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pieces := c.split(a.ChunkSize, 0, a.Size)
	queue := make(chan chan result, c.opts.Parallel)
	go func() {
		defer close(queue)
		for i, s := range pieces {
			ch := make(chan result, 1)
			select {
			case queue <- ch:
			case <-ctx.Done():
				return
			}
			go func() {
				var res result
				res.err = f.readPieceKeep(ctx, s, i, &res.data, &res.release)
				ch <- res
			}()
		}
	}()
	var total int64
	var firstErr error
	for ch := range queue {
		res := <-ch
		if res.err == nil && firstErr == nil {
			if _, err := w.Write(res.data); err != nil {
				firstErr = fmt.Errorf("writing output: %w", err)
				cancel()
			}
			total += int64(len(res.data))
		} else if firstErr == nil {
			firstErr = res.err
			cancel()
		}
		if res.release != nil {
			res.release()
		}
	}
	if firstErr == nil && total < a.Size {
		// The pieces stopped coming: the context ended (never report a
		// short read as the whole file).
		if firstErr = ctx.Err(); firstErr == nil {
			firstErr = fmt.Errorf("read %d of %d bytes", total, a.Size)
		}
	}
	if firstErr != nil {
		return total, pathErr("get", p, firstErr)
	}
	return total, nil
}

// readPieceKeep is readPiece that keeps the buffer until release is called.
// readPieceInto reads one span straight into dst (len(dst) == s.n): no
// pooled buffer, no copy. Erasure-coded files assemble pieces from units
// and take the pooled path.
func (f *File) readPieceInto(ctx context.Context, s span, i int, dst []byte) error {
	a := f.Attr()
	if _, ok := ecGeomOf(&a); ok {
		return f.readPiece(ctx, s, i, func(b []byte) { copy(dst, b) })
	}
	_, hole, err := f.replicatedPiece(ctx, a, s, i, dst)
	if hole {
		clear(dst)
	}
	return err
}

func (f *File) readPieceKeep(ctx context.Context, s span, i int, data *[]byte, release *func()) error {
	c := f.c
	a := f.Attr()
	if g, ok := ecGeomOf(&a); ok {
		// The piece is assembled in a pooled buffer (pieces are at most a
		// read request, which the pool's buffers hold).
		region := c.bufs.get()
		buf := region.Bytes()[:s.n]
		if err := f.ecRead(ctx, g, buf, s.off); err != nil {
			c.bufs.put(region)
			return err
		}
		*data = buf
		*release = func() { c.bufs.put(region) }
		return nil
	}
	pc, hole, err := f.replicatedPiece(ctx, a, s, i, nil)
	switch {
	case err != nil:
		return err
	case hole:
		*data = make([]byte, s.n)
	default:
		*data = pc.data
		*release = func() { c.bufs.put(pc.region) }
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
