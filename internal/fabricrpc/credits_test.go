package fabricrpc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/xdr"
)

// TestCredits: with a server of 4 receive buffers, 100 concurrent calls
// (half of them with chunks the server pulls and replies the client
// pulls and answers with DONE) never have more than Credits() running at
// the server, and all complete: no SEND finds the server's buffers all
// taken while its pulls need the connection's reader.
func TestCredits(t *testing.T) {
	s, svc, addr := startServer(t, func(s *Server) { s.BufCount = 4 })
	c := dialClient(t, addr, ClientOptions{})
	if got := c.Credits(); got != 3 {
		t.Fatalf("Credits() = %d with a 4-buffer server, want 3", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const calls = 100
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var data []byte
			if i%2 == 1 {
				data = pattern(i, 16<<10+i)
			}
			w := &xdr.Writer{ChunkMin: c.ChunkMin()}
			w.Opaque(data)
			r, err := c.Call(ctx, testProg, testVers, procBlock, nil, w, make([]byte, len(data)))
			if err == nil {
				if got := r.Opaque(maxEcho); r.Err() != nil || !bytes.Equal(got, data) {
					err = fmt.Errorf("call %d: reply data differs (%v)", i, r.Err())
				}
			}
			if err != nil {
				errs <- fmt.Errorf("call %d: %w", i, err)
			}
		}()
	}
	// Let the first calls fill every credit before any returns.
	for n := range c.Credits() {
		select {
		case <-svc.started:
		case <-ctx.Done():
			t.Fatalf("only %d calls started", n)
		}
	}
	// A call beyond the credits would start now; give it a moment.
	select {
	case <-svc.started:
		t.Errorf("a call started with Credits() = %d running", c.Credits())
	case <-time.After(100 * time.Millisecond):
	}
	svc.openGate()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("calls did not complete (deadlock?): %d running at the server", svc.running.Load())
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if m := svc.maxRunning.Load(); m > int32(c.Credits()) || m < int32(c.Credits()) {
		t.Errorf("%d calls ran at once, want exactly Credits() = %d", m, c.Credits())
	}
	if st := s.Stats(); st.Calls != calls {
		t.Errorf("server answered %d calls, want %d", st.Calls, calls)
	}
	if n := len(c.cur.credits); n != 0 {
		t.Errorf("%d credits still taken", n)
	}
}

// TestCreditsOwnBuffers: a client with fewer receive buffers than the
// server is bounded by its own.
func TestCreditsOwnBuffers(t *testing.T) {
	_, _, addr := startServer(t, nil)
	for _, tc := range []struct{ own, want int }{{2, 1}, {5, 4}, {DefaultBufCount + 10, DefaultBufCount - 1}} {
		c := dialClient(t, addr, ClientOptions{BufCount: tc.own})
		if got := c.Credits(); got != tc.want {
			t.Errorf("client of %d buffers: Credits() = %d, want %d", tc.own, got, tc.want)
		}
		if _, err := echo(testCtx(t), c, pattern(1, 5000), nil); err != nil {
			t.Errorf("client of %d buffers: %v", tc.own, err)
		}
	}
}

// TestAbandonedCallsKeepCredits: a call given up on (its context ended)
// still holds a receive buffer at the server until its reply, so its
// credit stays taken until then; calls made meanwhile wait rather than
// overrun the server's buffers.
func TestAbandonedCallsKeepCredits(t *testing.T) {
	_, svc, addr := startServer(t, func(s *Server) { s.BufCount = 4 })
	c := dialClient(t, addr, ClientOptions{})
	n := c.Credits()
	block := func(ctx context.Context) error {
		w := &xdr.Writer{ChunkMin: c.ChunkMin()}
		w.Opaque([]byte("x"))
		_, err := c.Call(ctx, testProg, testVers, procBlock, nil, w, nil)
		return err
	}
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		go func() { defer cancel(); block(ctx) }()
	}
	waitFor(5*time.Second, func() bool { return svc.running.Load() == int32(n) })
	time.Sleep(200 * time.Millisecond) // the first calls have given up
	done := make(chan error, n)
	for range n {
		go func() { done <- block(testCtx(t)) }()
	}
	time.Sleep(300 * time.Millisecond)
	if r := svc.running.Load(); r > int32(n) {
		t.Fatalf("%d calls running at the server with %d credits", r, n)
	}
	svc.openGate()
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if m := svc.maxRunning.Load(); m > int32(n) {
		t.Fatalf("%d calls ran at once with %d credits", m, n)
	}
}
