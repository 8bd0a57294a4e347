package client_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/sluicefs/sluice/client"
)

// The public face of the file layer: sequential writes buffered, read
// back through it at once, recorded once Close returns; a file removed
// under buffered writes fails its Close.
func TestBufferedFileThroughPublicAPI(t *testing.T) {
	cl := connect(t, 3)
	ctx := context.Background()
	f, err := cl.Create(ctx, "/b", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	mem := client.NewMemory(8 << 20)
	b := f.Buffered(client.BufferOptions{WriteBuffer: 1 << 20, Memory: mem})
	data := bytes.Repeat([]byte("0123456789abcdef"), 200000) // 3.2 MB
	for off := 0; off < len(data); off += 100000 {
		if _, err := b.WriteAt(data[off:min(off+100000, len(data))], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if b.Size() != int64(len(data)) {
		t.Fatalf("size %d with writes buffered, want %d", b.Size(), len(data))
	}
	got := make([]byte, len(data))
	if n, err := b.ReadAt(got, 0); n != len(data) || (err != nil && err != io.EOF) || !bytes.Equal(got, data) {
		t.Fatalf("read back through the buffered file: %d bytes, %v", n, err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	g, err := cl.Open(ctx, "/b")
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := g.ReadAt(got, 0); n != len(data) || !bytes.Equal(got, data) {
		t.Fatalf("after Close another handle reads %d bytes", n)
	}

	// Removed under buffered writes: Close reports it.
	h, err := cl.Create(ctx, "/gone", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	hb := h.Buffered(client.BufferOptions{WriteBuffer: 1 << 20})
	if _, err := hb.WriteAt(data[:1000], 0); err != nil {
		t.Fatal(err)
	}
	if err := cl.Remove(ctx, "/gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := hb.WriteAt(data[1000:50000], 1000); err != nil {
		t.Logf("write reported it: %v", err)
		return
	}
	if err := hb.Close(); err == nil {
		t.Fatal("Close of writes buffered for a removed file: no error")
	}
}
