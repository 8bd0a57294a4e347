package fabric

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
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
		w, err := pc.ReadOptimistic(ctx, r.Key(), 1000, got, 64, nil)
		if err != nil {
			t.Fatal(err)
		}
		if w != 0x1122334455667788 || !bytes.Equal(got, mem[1000:5096]) {
			t.Fatalf("word %#x, bytes equal %v", w, bytes.Equal(got, mem[1000:5096]))
		}
		wo := regBuf(t, tr, srv, 64)
		wonly := srv.Register(wo, RemoteWrite)
		refusals := map[string]func() error{
			"unknown key":       func() error { _, err := pc.ReadOptimistic(ctx, r.Key()^0x55, 0, got, 64, nil); return err },
			"range out":         func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 8000, got, 64, nil); return err },
			"range overflow":    func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 1<<64-10, got, 64, nil); return err },
			"word out":          func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 8192, nil); return err },
			"word not aligned":  func() error { _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 65, nil); return err },
			"write-only region": func() error { _, err := pc.ReadOptimistic(ctx, wonly.Key(), 0, got[:8], 0, nil); return err },
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
		if w, err := pc.ReadOptimistic(ctx, r.Key(), 0, got[:8], 64, nil); err != nil || w != 0x1122334455667788 {
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

// TestReadOptimisticGuarded: a guarded region is read only by optimistic
// READs its guard serves — the authenticator reaches the guard, which
// copies the range; a refusal is soft and sends no byte, even of a copy
// begun; the target serves every read itself (a shared-memory peer never
// maps it). A plain READ of it is an access error.
func TestReadOptimisticGuarded(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		ctx := context.Background()
		srv, _, pc := pair(t, Options{transport: tr}, newCollector())
		mem := regBuf(t, tr, srv, 8192)
		for i := range mem {
			mem[i] = byte(i * 7)
		}
		binary.LittleEndian.PutUint64(mem[64:], 42)
		var calls atomic.Int32 // the guard runs on the target's goroutine
		var lie atomic.Bool
		r := srv.RegisterGuarded(mem, 4096, func(key, off, wordOff uint64, auth, dst []byte) (uint64, error) {
			calls.Add(1)
			if string(auth) != "let me in" {
				return 0, errors.New("bad authenticator")
			}
			if lie.Load() {
				dst[0] = 1 // partly copied, then found changed
				return 0, errors.New("stale")
			}
			copy(dst, mem[off:])
			return binary.LittleEndian.Uint64(mem[wordOff:]), nil
		})
		got := make([]byte, 4096)
		w, err := pc.ReadOptimistic(ctx, r.Key(), 1000, got, 64, []byte("let me in"))
		if err != nil || w != 42 || !bytes.Equal(got, mem[1000:5096]) {
			t.Fatalf("admitted read: word %d, %v, bytes equal %v", w, err, bytes.Equal(got, mem[1000:5096]))
		}
		var re *RemoteError
		if _, err := pc.ReadOptimistic(ctx, r.Key(), 1000, got, 64, []byte("let me out")); !errors.As(err, &re) {
			t.Fatalf("wrong authenticator: %v, want a RemoteError", err)
		}
		lie.Store(true)
		clear(got)
		if _, err := pc.ReadOptimistic(ctx, r.Key(), 1000, got, 64, []byte("let me in")); !errors.As(err, &re) || !bytes.Equal(got, make([]byte, len(got))) {
			t.Fatalf("changed under the copy: %v, want a RemoteError and no bytes", err)
		}
		if _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 64, make([]byte, MaxAuth+1)); !errors.As(err, &re) {
			t.Fatalf("oversized authenticator: %v", err)
		}
		if _, err := pc.ReadOptimistic(ctx, r.Key(), 0, make([]byte, 4097), 4096, []byte("let me in")); !errors.As(err, &re) {
			t.Fatalf("a read past the region's largest: %v, want a refusal", err)
		}
		if calls.Load() != 3 { // the one past the largest never reached the guard
			t.Fatalf("the guard saw %d reads, want 3: the target serves each itself", calls.Load())
		}
		if pc.Err() != nil {
			t.Fatalf("connection failed: %v", pc.Err())
		}
		if err := pc.Read(ctx, r.Key(), 0, got[:8]); err == nil {
			t.Fatalf("a plain READ of a guarded region succeeded")
		}
	})
}

// TestRegisterAllowed: a region registered for allowed connections is
// refused to every other connection even with its key — by packets and,
// over shared memory, for a mapping — and served to a connection once
// allowed (over shared memory by the initiator's own copy).
func TestRegisterAllowed(t *testing.T) {
	backends(t, func(t *testing.T, tr transport) {
		ctx := context.Background()
		conns := make(connOf, 2)
		srv, cli, pc := pair(t, Options{transport: tr}, conns)
		mem := regBuf(t, tr, srv, 4096)
		for i := range mem {
			mem[i] = byte(i)
		}
		r := srv.RegisterAllowed(mem, RemoteRead)
		// A message makes the server see the connection.
		if err := pc.Send(1, []byte("hello")); err != nil {
			t.Fatal(err)
		}
		sc := <-conns
		got := make([]byte, 100)
		var re *RemoteError
		if _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 0, nil); !errors.As(err, &re) {
			t.Fatalf("before Allow: %v, want a refusal", err)
		}
		r.Allow(sc)
		if _, err := pc.ReadOptimistic(ctx, r.Key(), 0, got, 0, nil); err != nil || !bytes.Equal(got, mem[:100]) {
			t.Fatalf("after Allow: %v", err)
		}
		if sc.Shared() != (tr != nil) {
			t.Fatalf("Shared() = %v over %T", sc.Shared(), tr)
		}
		// Another connection of the same peer endpoint is not allowed.
		other, err := NewPool(cli, 4).Get(ctx, pc.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.ReadOptimistic(ctx, r.Key(), 0, got, 0, nil); !errors.As(err, &re) {
			t.Fatalf("a connection not allowed: %v, want a refusal", err)
		}
	})
}
