package sdk

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

	"github.com/sluicefs/sluice/internal/metaapi"
	"golang.org/x/sys/unix"
)

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
	// Marked as a temporary of a session this put keeps alive, so that
	// meta removes it should the put die before renaming it into place.
	sess := c.startPutSession()
	defer c.endPutSession(sess)
	f, err := c.createFile(ctx, tmp, metaapi.CreateReq{Mode: mode, Exclusive: true, TempSession: sess.id})
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
		growPipe(src)
	}
	return f.writeFrom(ctx, r)
}

// pipeSize is what a pipe read from is grown to: the most an unprivileged
// process may ask by default (/proc/sys/fs/pipe-max-size).
const pipeSize = 1 << 20

// growPipe enlarges src's buffer if it is a pipe. With the default 64 KiB
// the writer and this reader take turns every 64 KiB: a context switch
// and a wake-up each, which cost a put from a pipe more CPU than copying
// the data (profiled: a fifth of its time switching). Failure (a pipe
// that is not, or the user's pipe allowance spent) changes nothing.
func growPipe(src *os.File) {
	fi, err := src.Stat()
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return
	}
	sc, err := src.SyscallConn()
	if err != nil {
		return
	}
	sc.Control(func(fd uintptr) {
		if n, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0); err == nil && n < pipeSize {
			unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize)
		}
	})
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

// A stream is written in messages of at most streamMsg bytes, streamDepth
// (or Options.Parallel) buffers of them being filled and written at once.
// Writes to one chunk go one after another, each acknowledged before the
// next is sent, so a stream has little parallelism: small messages start
// sending sooner and keep the source, the client and the node busy at
// once. Against 16 MiB messages two at a time (the file path's sizes),
// and with growPipe, `sluice put -` from a pipe went from 0.29 to 0.34
// of raw TCP (sluice bench users, issue 18), on half the memory.
const (
	streamMsg   = 4 << 20
	streamDepth = 4
)

// writeFrom writes r's content from offset 0, with buffers being filled
// while others are written. Writes to one chunk run one at a time and in
// file order (the node would refuse a concurrent one busy, and an
// out-of-order one would turn a plain append into an overwrite of a
// hole); different chunks proceed in parallel.
func (f *File) writeFrom(ctx context.Context, r io.Reader) (int64, error) {
	c := f.c
	cs := f.Attr().ChunkSize
	depth := max(streamDepth, c.opts.Parallel)
	type job struct {
		off   int64
		buf   []byte
		after <-chan struct{} // the previous write to the same chunk
		done  chan struct{}
	}
	msg := min(c.opts.WriteMsg, streamMsg)
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
