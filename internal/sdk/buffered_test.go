package sdk_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/sdk"
)

// readAll reads the whole file afresh (a new handle: what meta recorded).
func readAll(t *testing.T, cl *sdk.Client, p string) []byte {
	t.Helper()
	f, err := cl.Open(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, f.Size())
	if _, err := f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return buf
}

// eventually polls cond for up to a minute.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Sequential writes in uneven pieces are buffered, read back through the
// layer before any flush (a read sees every earlier write), and are all
// recorded once Close returns; the budget is back to zero.
func TestBufferedWriteBehind(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	dirWithPolicy(t, cl, "/d", 2)
	f, err := cl.Create(ctx, "/d/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	bud := sdk.NewBudget(8 << 20)
	b := sdk.NewBuffered(f, sdk.BufferOptions{WriteBuffer: 1 << 20, Budget: bud})
	rng := rand.New(rand.NewPCG(1, 2))
	data := randBytes(rng, 5<<20+12345)
	for off := 0; off < len(data); {
		n := min(len(data)-off, 1+rng.IntN(300<<10))
		if _, err := b.WriteAtContext(ctx, data[off:off+n], int64(off)); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	if !b.Pending() {
		t.Fatal("nothing buffered after sequential writes")
	}
	if end, _ := b.Buffered(); end != int64(len(data)) {
		t.Fatalf("buffered end %d, want %d", end, len(data))
	}
	got := make([]byte, 100)
	if _, err := b.ReadAtContext(ctx, got, int64(len(data)-100)); err != nil || !bytes.Equal(got, data[len(data)-100:]) {
		t.Fatalf("read through the layer does not see the buffered writes: %v", err)
	}
	// An overwrite elsewhere, then more sequential writes.
	patch := randBytes(rng, 4000)
	if _, err := b.WriteAtContext(ctx, patch, 777); err != nil {
		t.Fatal(err)
	}
	copy(data[777:], patch)
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, cl, "/d/f"); !bytes.Equal(got, data) {
		t.Fatalf("after Close: %d bytes that differ from the %d written", len(got), len(data))
	}
	if u := bud.Used(); u != 0 {
		t.Fatalf("budget still charged %d bytes after Close", u)
	}
}

// A background send that fails is reported by Flush (and handed to
// OnLost), never dropped: here the file is removed under the writer.
func TestBufferedWriteBehindFailureSurfaces(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{OpTimeout: 5 * time.Second})
	ctx := context.Background()
	for _, at := range []string{"flush", "close", "write"} {
		t.Run(at, func(t *testing.T) {
			p := "/gone-" + at
			f, err := cl.Create(ctx, p, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			var lost atomic.Int32
			b := sdk.NewBuffered(f, sdk.BufferOptions{WriteBuffer: 256 << 10, OnLost: func(error) { lost.Add(1) }})
			chunk := bytes.Repeat([]byte("x"), 64<<10)
			if _, err := b.WriteAtContext(ctx, chunk, 0); err != nil {
				t.Fatal(err)
			}
			if err := cl.Remove(ctx, p); err != nil {
				t.Fatal(err)
			}
			// Enough for background sends, to a file that is gone.
			off := int64(len(chunk))
			var werr error
			for i := 0; i < 12 && werr == nil; i++ {
				_, werr = b.WriteAtContext(ctx, chunk, off)
				off += int64(len(chunk))
			}
			var err2 error
			switch at {
			case "flush":
				err2 = b.Flush(ctx)
			case "close":
				err2 = b.Close(ctx)
			case "write":
				// Wait for the failure, then the next write reports it.
				eventually(t, "the background send to fail", func() bool { return lost.Load() > 0 })
				_, err2 = b.WriteAtContext(ctx, chunk, off)
			}
			if werr == nil && err2 == nil {
				t.Fatalf("writes to a removed file: no error at %s", at)
			}
			if lost.Load() == 0 {
				t.Fatal("OnLost not called for a failed background send")
			}
		})
	}
}

// With Sequential 1 a lone write goes through at once; the next one
// continuing it is buffered.
func TestBufferedSequentialThreshold(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	f, err := cl.Create(ctx, "/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	b := sdk.NewBuffered(f, sdk.BufferOptions{Sequential: 1})
	if _, err := b.WriteAtContext(ctx, []byte("hello"), 0); err != nil {
		t.Fatal(err)
	}
	if b.Pending() || f.Size() != 5 {
		t.Fatalf("a lone write: pending %v, size %d", b.Pending(), f.Size())
	}
	if _, err := b.WriteAtContext(ctx, []byte(" world"), 5); err != nil {
		t.Fatal(err)
	}
	if !b.Pending() {
		t.Fatal("a sequential write was not buffered")
	}
	if err := b.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, cl, "/f"); string(got) != "hello world" {
		t.Fatalf("read %q", got)
	}
}

// A sequential reader is read ahead within the budget (never above it),
// and reads what the file holds; Close gives the memory back.
func TestBufferedReadAheadBounded(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	data := randBytes(rand.New(rand.NewPCG(3, 4)), 20<<20+999)
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	const bound = 3 << 20
	bud := sdk.NewBudget(bound)
	b := sdk.NewBuffered(f, sdk.BufferOptions{ReadAhead: 8 << 20, Budget: bud})
	got := make([]byte, len(data))
	var peak int64
	for off := 0; off < len(data); off += 256 << 10 {
		end := min(len(data), off+256<<10)
		if _, err := b.ReadAtContext(ctx, got[off:end], int64(off)); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		peak = max(peak, bud.Used())
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read ahead: data differs")
	}
	if peak == 0 || peak > bound {
		t.Fatalf("read-ahead memory peaked at %d bytes, budget %d", peak, bound)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the read-ahead memory to be given back", func() bool { return bud.Used() == 0 })
}

// What was read ahead is dropped by a write through the layer and by a
// change of the file's attributes (another client's write).
func TestBufferedReadAheadInvalidation(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	other := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	data := randBytes(rand.New(rand.NewPCG(5, 6)), 8<<20)
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	b := sdk.NewBuffered(f, sdk.BufferOptions{ReadAhead: 8 << 20})
	p := make([]byte, 64<<10)
	read := func(off int64) []byte {
		t.Helper()
		if _, err := b.ReadAtContext(ctx, p, off); err != nil {
			t.Fatal(err)
		}
		return p
	}
	read(0)
	read(64 << 10) // sequential: what follows is being read ahead
	// Through the layer.
	mine := bytes.Repeat([]byte{0xAA}, len(p))
	if _, err := b.WriteAtContext(ctx, mine, 4<<20); err != nil {
		t.Fatal(err)
	}
	for off := int64(128 << 10); off < 4<<20; off += int64(len(p)) {
		read(off)
	}
	if !bytes.Equal(read(4<<20), mine) {
		t.Fatal("read-ahead served data older than a write through the layer")
	}
	// By another client, seen through new attributes.
	theirs := bytes.Repeat([]byte{0x55}, len(p))
	of, err := other.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := of.WriteAt(theirs, 6<<20); err != nil {
		t.Fatal(err)
	}
	for off := int64(4<<20) + int64(len(p)); off < 6<<20; off += int64(len(p)) {
		read(off)
	}
	a, err := cl.GetAttr(ctx, f.Attr().Ino)
	if err != nil {
		t.Fatal(err)
	}
	cl.ForgetLayouts(a.Ino)
	f.SetAttr(a)
	if !bytes.Equal(read(6<<20), theirs) {
		t.Fatal("read-ahead served data older than the file's attributes")
	}
}

// Concurrent readers, sequential and random, of one layer all read what
// the file holds.
func TestBufferedConcurrentReaders(t *testing.T) {
	c := startCluster(t, 3)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	data := randBytes(rand.New(rand.NewPCG(7, 8)), 12<<20+77)
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	bud := sdk.NewBudget(6 << 20)
	b := sdk.NewBuffered(f, sdk.BufferOptions{ReadAhead: 4 << 20, Budget: bud})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for r := 0; r < 6; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 9))
			p := make([]byte, 100<<10)
			for i, off := 0, int64(0); i < 60; i++ {
				if r%2 == 1 { // random
					off = rng.Int64N(int64(len(data)))
				}
				n, err := b.ReadAtContext(ctx, p, off)
				if err != nil && !errors.Is(err, io.EOF) {
					errs <- err
					return
				}
				if !bytes.Equal(p[:n], data[off:off+int64(n)]) {
					errs <- errors.New("a concurrent reader read data that differs")
					return
				}
				if off += int64(n); off >= int64(len(data)) {
					off = 0
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if u := bud.Used(); u > 6<<20 {
		t.Fatalf("budget overrun: %d", u)
	}
}

// BenchmarkBufferedSequentialRead reads a file in 1 MiB requests, one at
// a time (as an NFS client's READs), straight and through the layer's
// read-ahead; and writes it so (write-behind against write-through).
func BenchmarkBufferedSequential(b *testing.B) {
	c := startCluster(b, 1)
	cl := newClient(b, c, sdk.Options{})
	ctx := context.Background()
	const size = 128 << 20
	data := randBytes(rand.New(rand.NewPCG(1, 1)), size)
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
		b.Fatal(err)
	}
	p := make([]byte, 1<<20)
	for _, mode := range []string{"read-straight", "read-ahead", "write-through", "write-behind"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				f, err := cl.Open(ctx, "/f")
				if err != nil {
					b.Fatal(err)
				}
				bf := sdk.NewBuffered(f, sdk.BufferOptions{})
				for off := int64(0); off < size; off += int64(len(p)) {
					var err error
					switch mode {
					case "read-straight":
						_, err = f.ReadAtContext(ctx, p, off)
					case "read-ahead":
						_, err = bf.ReadAtContext(ctx, p, off)
					case "write-through":
						_, err = f.WriteAtContext(ctx, p, off)
					case "write-behind":
						_, err = bf.WriteAtContext(ctx, p, off)
					}
					if err != nil && !errors.Is(err, io.EOF) {
						b.Fatal(err)
					}
				}
				if err := bf.Close(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// ReadBlock hands a block read ahead over without a copy once the reader
// is sequential, and reads what the file holds either way.
func TestBufferedReadBlockHandsOver(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	data := randBytes(rand.New(rand.NewPCG(9, 9)), 10<<20+3)
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(data), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	bud := sdk.NewBudget(8 << 20)
	b := sdk.NewBuffered(f, sdk.BufferOptions{ReadAhead: 4 << 20, ReadAheadBlock: 1 << 20, Budget: bud})
	handed := 0
	for off := 0; off < len(data); off += 1 << 20 {
		into := make([]byte, min(1<<20, len(data)-off))
		got, err := b.ReadBlock(ctx, int64(off), into)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data[off:off+len(into)]) {
			t.Fatalf("ReadBlock at %d: %d bytes that differ", off, len(got))
		}
		if len(got) > 0 && &got[0] != &into[0] {
			handed++
		}
	}
	if handed == 0 {
		t.Fatal("no block read ahead was handed over")
	}
	b.Close(ctx)
	eventually(t, "the read-ahead memory to be given back", func() bool { return bud.Used() == 0 })
}

// Writes that no Flush follows are sent once idle (IdleFlush), and their
// memory goes back to the budget without anyone touching the file again.
func TestBufferedIdleFlush(t *testing.T) {
	c := startCluster(t, 1)
	cl := newClient(t, c, sdk.Options{})
	ctx := context.Background()
	f, err := cl.Create(ctx, "/f", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	bud := sdk.NewBudget(64 << 20)
	b := sdk.NewBuffered(f, sdk.BufferOptions{IdleFlush: 20 * time.Millisecond, Budget: bud})
	data := bytes.Repeat([]byte("idle"), 50000)
	if _, err := b.WriteAtContext(ctx, data, 0); err != nil {
		t.Fatal(err)
	}
	if bud.Used() == 0 {
		t.Fatal("nothing buffered")
	}
	eventually(t, "the idle writes to be sent and their memory given back", func() bool { return bud.Used() == 0 && !b.Pending() })
	if got := readAll(t, cl, "/f"); !bytes.Equal(got, data) {
		t.Fatalf("after an idle flush another handle reads %d bytes", len(got))
	}
}
