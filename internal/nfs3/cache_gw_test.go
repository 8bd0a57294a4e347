package nfs3_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/nfs3"
	"github.com/sluicefs/sluice/internal/sdk"
	"github.com/sluicefs/sluice/internal/xdr"
)

// writeAt writes p at off through the gateway, in WRITEs of MaxData.
func (e *env) writeAt(t *testing.T, fh []byte, off uint64, p []byte) {
	t.Helper()
	for len(p) > 0 {
		n := min(len(p), nfs3.MaxData)
		st, _ := e.call(t, nfs3.ProcWrite, func(w *xdr.Writer) {
			w.Opaque(fh)
			w.Uint64(off)
			w.Uint32(uint32(n))
			w.Uint32(nfs3.FileSync)
			w.Opaque(p[:n])
		})
		if st != nfs3.OK {
			t.Fatalf("WRITE at %d: %d", off, st)
		}
		off += uint64(n)
		p = p[n:]
	}
}

// readAt makes one READ through the gateway.
func (e *env) readAt(t *testing.T, fh []byte, off uint64, count uint32) ([]byte, bool) {
	t.Helper()
	st, r := e.call(t, nfs3.ProcRead, func(w *xdr.Writer) { w.Opaque(fh); w.Uint64(off); w.Uint32(count) })
	if st != nfs3.OK {
		t.Fatalf("READ %d at %d: %d", count, off, st)
	}
	nfs3.SkipPostOp(r)
	n, eof, got := r.Uint32(), r.Bool(), r.Opaque(nfs3.MaxData)
	if r.Err() != nil || int(n) != len(got) {
		t.Fatalf("READ %d at %d: count %d, %d bytes, %v", count, off, n, len(got), r.Err())
	}
	return bytes.Clone(got), eof
}

// checkRead reads [off, off+count) and compares it with file.
func (e *env) checkRead(t *testing.T, fh []byte, file []byte, off uint64, count uint32) {
	t.Helper()
	got, eof := e.readAt(t, fh, off, count)
	want := file[min(off, uint64(len(file))):min(off+uint64(count), uint64(len(file)))]
	wantEOF := off+uint64(len(want)) >= uint64(len(file))
	if !bytes.Equal(got, want) || eof != wantEOF {
		t.Fatalf("READ %d at %d: %d bytes, eof %v; want %d bytes, eof %v (same data: %v)", count, off, len(got), eof, len(want), wantEOF, bytes.Equal(got, want))
	}
}

func fileData(seed byte, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*13+i/1021)
	}
	return p
}

// TestReadCache: a file read again is served from the cache, whatever
// the READs' sizes and offsets (within a block, across two, at the end);
// a WRITE and a truncation through the gateway drop its blocks at once
// and show in the next READ. (Attributes are trusted for an hour: only
// the gateway's own invalidation can show its changes.)
func TestReadCache(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{AttrTTL: time.Hour})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "f", 0)
	const mib = 1 << 20
	file := fileData(1, 2*mib+mib/2+17)
	e.writeAt(t, fh, 0, file)
	for off := uint64(0); off < uint64(len(file)); off += mib {
		e.checkRead(t, fh, file, off, mib)
	}
	hits, misses, held := e.gw.CacheStats()
	if hits != 0 || misses != 3 || held != 3*mib {
		t.Fatalf("first read: hits %d misses %d, %d bytes held; want 0, 3, %d", hits, misses, held, 3*mib)
	}
	for off := uint64(0); off < uint64(len(file)); off += 64 << 10 {
		e.checkRead(t, fh, file, off, 64<<10)
	}
	e.checkRead(t, fh, file, mib/2, mib)   // across two blocks
	e.checkRead(t, fh, file, 7, mib)       // across two, unaligned
	e.checkRead(t, fh, file, 2*mib+5, mib) // to the end
	e.checkRead(t, fh, file, 2*mib+mib/2+17, 10)
	e.checkRead(t, fh, file, 5*mib, 10) // past the end
	e.checkRead(t, fh, file, 100, 0)
	hits2, misses2, _ := e.gw.CacheStats()
	if misses2 != 3 || hits2 < 40 {
		t.Fatalf("second read: hits %d misses %d; want every READ a hit", hits2, misses2)
	}

	// A WRITE drops the file's blocks at once; the next READ sees it.
	copy(file[100:], "written through the gateway")
	e.writeAt(t, fh, 100, file[100:127])
	if _, _, held := e.gw.CacheStats(); held != 0 {
		t.Fatalf("%d bytes still held after a WRITE", held)
	}
	e.checkRead(t, fh, file, 0, 4096)
	e.checkRead(t, fh, file, 0, mib)
	// A WRITE across two blocks.
	copy(file[mib-3:], "ACROSS")
	e.writeAt(t, fh, mib-3, file[mib-3:mib+3])
	e.checkRead(t, fh, file, mib-10, 20)
	e.checkRead(t, fh, file, mib-10, mib)
	e.checkRead(t, fh, file, mib, 10)

	// SETATTR truncates: blocks past the new end and the short last one
	// go.
	for off := uint64(0); off < uint64(len(file)); off += mib {
		e.checkRead(t, fh, file, off, mib)
	}
	st, _ := e.call(t, nfs3.ProcSetattr, func(w *xdr.Writer) {
		w.Opaque(fh)
		w.Bool(false)
		w.Bool(false)
		w.Bool(false)
		w.Bool(true)
		w.Uint64(mib + 10)
		w.Uint32(0)
		w.Uint32(0)
		w.Bool(false)
	})
	if st != nfs3.OK {
		t.Fatalf("SETATTR size: %d", st)
	}
	file = file[:mib+10]
	e.checkRead(t, fh, file, mib, mib)
	e.checkRead(t, fh, file, 0, mib)
	e.checkRead(t, fh, file, mib+10, mib)

	// REMOVE drops the blocks.
	if st, _ := e.call(t, nfs3.ProcRemove, func(w *xdr.Writer) { w.Opaque(root); w.String("f") }); st != nfs3.OK {
		t.Fatalf("REMOVE: %d", st)
	}
	if _, _, held := e.gw.CacheStats(); held != 0 {
		t.Fatalf("%d bytes still held after REMOVE", held)
	}
}

// TestReadCacheOtherClient: another client's write and truncation show
// in the gateway's READs once its attributes are AttrTTL old.
func TestReadCacheOtherClient(t *testing.T) {
	const ttl = 300 * time.Millisecond
	e := newEnvOpts(t, nfs3.Options{AttrTTL: ttl})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "g", 0)
	file := fileData(2, 1<<20+4096)
	e.writeAt(t, fh, 0, file)
	e.checkRead(t, fh, file, 0, 1<<20)
	e.checkRead(t, fh, file, 0, 1<<20)
	if hits, _, _ := e.gw.CacheStats(); hits == 0 {
		t.Fatal("no hit on a second READ")
	}

	other, err := sdk.New(sdk.Options{Conf: e.conf})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	f, err := other.Open(ctx, "/g")
	if err != nil {
		t.Fatal(err)
	}
	neu := bytes.Clone(file)
	copy(neu[1000:], "changed by another client")
	if _, err := f.WriteAtContext(ctx, neu[1000:1025], 1000); err != nil {
		t.Fatal(err)
	}
	// Within AttrTTL: the old or the new data, whole.
	if got, _ := e.readAt(t, fh, 0, 4096); !bytes.Equal(got, file[:4096]) && !bytes.Equal(got, neu[:4096]) {
		t.Fatal("READ within AttrTTL of another client's write: neither the old nor the new data")
	}
	time.Sleep(ttl + 50*time.Millisecond)
	e.checkRead(t, fh, neu, 0, 4096)
	e.checkRead(t, fh, neu, 0, 1<<20)

	if err := f.Truncate(ctx, 2000); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 50*time.Millisecond)
	e.checkRead(t, fh, neu[:2000], 0, 1<<20)
	e.checkRead(t, fh, neu[:2000], 1<<20, 10)
}

// TestReadCacheOff: with CacheBytes negative, READ reads through.
func TestReadCacheOff(t *testing.T) {
	e := newEnvOpts(t, nfs3.Options{CacheBytes: -1})
	root := e.rootFH(t)
	_, fh := e.create(t, root, "h", 0)
	file := fileData(3, 1<<20+300)
	e.writeAt(t, fh, 0, file)
	for range 2 {
		e.checkRead(t, fh, file, 0, 1<<20)
		e.checkRead(t, fh, file, 1<<19, 1<<20)
		e.checkRead(t, fh, file, 1<<20, 1<<20)
	}
	if hits, misses, held := e.gw.CacheStats(); hits != 0 || misses != 0 || held != 0 {
		t.Fatalf("cache off: hits %d misses %d held %d", hits, misses, held)
	}
}
