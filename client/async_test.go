package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"

	"github.com/sluicefs/sluice/client"
)

// TestAsyncSessionThroughPublicAPI: a program outside the module
// registers a buffer, submits reads (one past the end of the file) and a
// write as one Submit, and reaps each op's outcome by its own handle.
func TestAsyncSessionThroughPublicAPI(t *testing.T) {
	cl := connect(t, 3)
	ctx := context.Background()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if _, err := cl.Put(ctx, "/f", bytes.NewReader(payload), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := cl.Open(ctx, "/f")
	if err != nil {
		t.Fatal(err)
	}
	s := cl.NewSession(0)
	defer s.Close()
	b, err := s.Register(make([]byte, 3*4096))
	if err != nil {
		t.Fatal(err)
	}
	copy(b.Bytes()[8192:], "written")
	ops := []*client.AsyncOp{
		client.ReadAsync(f, 100, b, 0, 4096),
		client.ReadAsync(f, int64(len(payload))+1, b, 4096, 4096),
		client.WriteAsync(f, 5000, b, 8192, 7),
	}
	for i, op := range ops {
		op.Tag = i
	}
	if err := s.Submit(ctx, ops...); err != nil {
		t.Fatal(err)
	}
	got := map[int]client.Completion{}
	for len(got) < len(ops) {
		cs, err := s.Wait(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			got[c.Op.Tag.(int)] = c
		}
	}
	if c := got[0]; c.Err != nil || c.N != 4096 || !bytes.Equal(b.Bytes()[:4096], payload[100:4196]) {
		t.Fatalf("read: %d, %v", c.N, c.Err)
	}
	if c := got[1]; c.N != 0 || !errors.Is(c.Err, io.EOF) {
		t.Fatalf("read past the end: %d, %v", c.N, c.Err)
	}
	if c := got[2]; c.Err != nil || c.N != 7 {
		t.Fatalf("write: %d, %v", c.N, c.Err)
	}
	if n := s.Poll(make([]client.Completion, 4)); n != 0 {
		t.Fatalf("%d completions left", n)
	}
	if err := s.Deregister(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := s.Submit(ctx, client.ReadAsync(f, 0, b, 0, 10)); !errors.Is(err, client.ErrDeregistered) {
		t.Fatalf("op on a deregistered buffer: %v", err)
	}
}
