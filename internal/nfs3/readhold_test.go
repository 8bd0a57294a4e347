package nfs3

import (
	"bytes"
	"context"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// testGateway is a gateway over an in-process cluster, called directly
// (no transport), with a file of n bytes at /f.
func testGateway(tb testing.TB, opts Options, n int) (*Gateway, ids.Ino, []byte) {
	tb.Helper()
	cl, _ := StartTestCluster(tb, 1)
	opts.Client = cl
	g, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	f, err := cl.Create(ctx, "/f", 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*31 + i/997)
	}
	if _, err := f.WriteAtContext(ctx, data, 0); err != nil {
		tb.Fatal(err)
	}
	return g, f.Attr().Ino, data
}

// readCall runs READ on g into w and returns the data: inline, or the
// chunk w lists.
func readCall(tb testing.TB, g *Gateway, w *xdr.Writer, ino ids.Ino, off uint64, count uint32) []byte {
	tb.Helper()
	var args xdr.Writer
	args.Opaque(g.Handle("/", ino))
	args.Uint64(off)
	args.Uint32(count)
	c := &oncrpc.Call{Prog: ProgNFS, Vers: Version, Proc: ProcRead, CredFlavor: oncrpc.AuthSys, Remote: "127.0.0.1:700"}
	if st := g.nfs(context.Background(), c, xdr.NewReader(args.B), w); st != oncrpc.Success {
		tb.Fatalf("READ: %v", st)
	}
	r := xdr.NewReader(w.B)
	r.SetChunks(w.Chunks)
	if st := Status(r.Uint32()); st != OK {
		tb.Fatalf("READ: status %d", st)
	}
	SkipPostOp(r)
	n := r.Uint32()
	r.Bool()
	p := r.Opaque(MaxData)
	if r.Err() != nil || int(n) != len(p) {
		tb.Fatalf("READ reply: count %d, %d bytes, %v", n, len(p), r.Err())
	}
	return p
}

// TestReadHold: a READ within one block replies with the block's memory
// as a chunk (over the fabric) and holds it pinned until the reply is
// released, through invalidation and eviction; over TCP (no chunks) the
// data is copied and nothing stays pinned. A READ across two blocks
// holds its pooled buffer until the release.
func TestReadHold(t *testing.T) {
	g, ino, data := testGateway(t, Options{CacheBytes: 2 << 20}, 3<<20)

	// TCP: copied, unpinned at once.
	var tcp xdr.Writer
	got := readCall(t, g, &tcp, ino, 4096, 64<<10)
	if !bytes.Equal(got, data[4096:4096+64<<10]) || len(tcp.Chunks) != 0 {
		t.Fatalf("TCP READ: wrong data or %d chunks", len(tcp.Chunks))
	}
	b := g.cache.index[ino][0]
	if b == nil || b.refs != 0 {
		t.Fatal("TCP READ: block not cached, or still pinned")
	}
	tcp.Release()

	// Fabric: the chunk is the block's memory, pinned.
	w := xdr.Writer{ChunkMin: 1024}
	got = readCall(t, g, &w, ino, 8192, 512<<10)
	if len(w.Chunks) != 1 || &got[0] != &b.data[8192] || !bytes.Equal(got, data[8192:8192+512<<10]) {
		t.Fatalf("fabric READ: %d chunks, not the block's memory or wrong data", len(w.Chunks))
	}
	if b.refs != 1 {
		t.Fatalf("fabric READ: block pins %d, want 1", b.refs)
	}
	// Pressure: its file's blocks dropped, the cache (two blocks) filled
	// over and over.
	g.cache.invalidate(ino)
	for range 3 {
		for off := uint64(0); off < 3<<20; off += 1 << 20 {
			var w2 xdr.Writer
			if p := readCall(t, g, &w2, ino, off, 1<<20); !bytes.Equal(p, data[off:off+1<<20]) {
				t.Fatalf("READ at %d: wrong data", off)
			}
			w2.Release()
		}
	}
	g.cache.check(t)
	if !bytes.Equal(got, data[8192:8192+512<<10]) {
		t.Fatal("a held block changed before the reply was released")
	}
	w.Release()
	if b.refs != 0 || b.buf != nil {
		t.Fatalf("released: pins %d, memory kept %v", b.refs, b.buf != nil)
	}

	// Across two blocks, over the fabric: a pooled buffer, held.
	w.Reset()
	got = readCall(t, g, &w, ino, 1<<20-100, 1<<20)
	if len(w.Chunks) != 1 || !bytes.Equal(got, data[1<<20-100:2<<20-100]) {
		t.Fatal("READ across two blocks: wrong data")
	}
	// Another such READ while the first is held must not get its buffer.
	var w2 xdr.Writer
	w2.ChunkMin = 1024
	if p := readCall(t, g, &w2, ino, 2<<20-50, 1<<20); !bytes.Equal(p, data[2<<20-50:3<<20-50]) {
		t.Fatal("second READ across two blocks: wrong data")
	}
	if !bytes.Equal(got, data[1<<20-100:2<<20-100]) {
		t.Fatal("READ across two blocks: its buffer was reused before the release")
	}
	w2.Release()
	w.Release()
	g.cache.check(t)
}

// BenchmarkReadHit is a 64 KiB READ served from the cache, the whole
// procedure (decoding, attributes, encoding): copied into the reply as
// over TCP, or as a chunk as over the fabric.
func BenchmarkReadHit(b *testing.B) {
	for _, tc := range []struct {
		name     string
		chunkMin int
		cache    int64
	}{{"tcp", 0, 0}, {"fabric", 1024, 0}, {"tcp-nocache", 0, -1}} {
		b.Run(tc.name, func(b *testing.B) {
			g, ino, _ := testGateway(b, Options{CacheBytes: tc.cache}, 1<<20)
			var args xdr.Writer
			args.Opaque(g.Handle("/", ino))
			args.Uint64(4096)
			args.Uint32(64 << 10)
			c := &oncrpc.Call{Prog: ProgNFS, Vers: Version, Proc: ProcRead, CredFlavor: oncrpc.AuthSys, Remote: "127.0.0.1:700"}
			w := xdr.Writer{ChunkMin: tc.chunkMin, B: make([]byte, 0, 128<<10)}
			r := xdr.NewReader(args.B)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(args.B)
				if g.nfs(ctx, c, r, &w) != oncrpc.Success {
					b.Fatal("READ failed")
				}
				w.Release()
				w.Reset()
			}
		})
	}
}
