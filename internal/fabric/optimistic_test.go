package fabric

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"
)

// TestReadOptimistic: an optimistic READ returns the range and, read
// after it, the word; a refusal (unknown key, out of bounds, a word out
// of bounds or not aligned, a write-only region) is a RemoteError of that
// operation alone — the connection stays up and serves the next READ.
func TestReadOptimistic(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		ctx := context.Background()
		srv, _, pc := pair(t, Options{transport: tr}, newCollector())
		mem := regBuf(t, tr, srv, 8192)
		for i := range mem {
			mem[i] = byte(i * 7)
		}
		binary.LittleEndian.PutUint64(mem[64:], 0x1122334455667788)
		r := srv.Register(mem, RemoteRead)
		got := make([]byte, 4096)
		w, err := pc.ReadOptimistic(ctx, r.Key(), 1000, got, 64)
		if err != nil {
			t.Fatal(err)
		}
		if w != 0x1122334455667788 || !bytes.Equal(got, mem[1000:5096]) {
			t.Fatalf("word %#x, bytes equal %v", w, bytes.Equal(got, mem[1000:5096]))
		}
		wo := regBuf(t, tr, srv, 64)
		wonly := srv.Register(wo, RemoteWrite)
		refusals := map[string]func() error{
			"unknown key":       func() error { _, err := pc.ReadOptimistic(ctx, r.Key()^0x55, 0, got, 64); return err },
			"range out":         func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 8000, got, 64); return err },
			"range overflow":    func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 1<<64-10, got, 64); return err },
			"word out":          func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 8192); return err },
			"word not aligned":  func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 65); return err },
			"write-only region": func() error { _, err := pc.ReadOptimistic(ctx, wonly.Key(), 0, got[:8], 0); return err },
		}
		for name, f := range refusals {
			err := f()
			var re *RemoteError
			if !errors.As(err, &re) {
				t.Fatalf("%s: %v, want a RemoteError", name, err)
			}
			if pc.Err() != nil {
				t.Fatalf("%s: the connection failed: %v", name, pc.Err())
			}
		}
		// Still up: a READ and an optimistic READ after all that.
		if err := pc.Read(ctx, r.Key(), 0, got[:100]); err != nil || !bytes.Equal(got[:100], mem[:100]) {
			t.Fatalf("read after refusals: %v", err)
		}
		if w, err := pc.ReadOptimistic(ctx, r.Key(), 0, got[:8], 64); err != nil || w != 0x1122334455667788 {
			t.Fatalf("optimistic read after refusals: %#x %v", w, err)
		}
	})
}

// TestOReadRequestMalformed: an optimistic READ request of the wrong
// length is a protocol violation (the connection ends), not a refusal.
func TestOReadRequestMalformed(t *testing.T) {
	h := header{kind: KindOReadReq, length: oreadPayload + 1}
	b := make([]byte, HeaderSize)
	putHeader(b, h)
	if _, err := parseHeader(b, 1024); err != nil {
		t.Fatalf("a 33-byte request is within the MTU: %v", err)
	}
	b[0] = byte(kindMax + 1)
	if _, err := parseHeader(b, 1024); !errors.Is(err, ErrProtocol) {
		t.Fatalf("kind past the last: %v", err)
	}
}
