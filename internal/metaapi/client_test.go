package metaapi

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// dropAfterReading is a meta that reads each request and then drops the
// connection without answering: as a meta that did the call and died
// before replying looks to the client.
func dropAfterReading(t *testing.T, hits *atomic.Int32) *Client {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		hits.Add(1)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	c := NewClient(strings.TrimPrefix(srv.URL, "https://"), "", &tls.Config{InsecureSkipVerify: true})
	c.RetryFor, c.FirstContactRetry = 2*time.Second, 2*time.Second
	t.Cleanup(c.Close)
	return c
}

// Calls that fail when done twice must not be sent again once meta may
// have done them. Removing a node again answers ENOENT ("no storage node
// N", TestRemoveNode): `sluice node remove` would report a failure for a
// node it removed.
func TestCallDoesNotResendWhatCannotBeDoneTwice(t *testing.T) {
	for _, op := range []string{OpCreate, OpRemove, OpRename, OpLink, OpRemoveNode} {
		var hits atomic.Int32
		c := dropAfterReading(t, &hits)
		c.reached.Store(true)
		if err := c.Call(context.Background(), op, struct{}{}, nil); err == nil {
			t.Errorf("%s: no error from a meta that never answered", op)
		}
		if n := hits.Load(); n != 1 {
			t.Errorf("%s: sent %d times to a meta that may have done it", op, n)
		}
	}
}

// Calls that come out the same done twice are sent again.
func TestCallResendsWhatIsRepeatable(t *testing.T) {
	var hits atomic.Int32
	c := dropAfterReading(t, &hits)
	c.reached.Store(true)
	if err := c.Call(context.Background(), OpGetAttr, struct{}{}, nil); err == nil {
		t.Fatal("no error from a meta that never answered")
	}
	if n := hits.Load(); n < 2 {
		t.Errorf("GetAttr sent %d times, want it retried", n)
	}
}

// TestCallEndsWithinRetryFor: a meta that takes connections but never
// answers (a stopped process) fails a call within about RetryFor (the
// caller's --op-timeout), not after the HTTP client's 30 s, and the
// error names meta's address.
func TestCallEndsWithinRetryFor(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs first: the handlers return
	addr := strings.TrimPrefix(srv.URL, "https://")
	c := NewClient(addr, "", &tls.Config{InsecureSkipVerify: true})
	t.Cleanup(c.Close)
	c.RetryFor, c.FirstContactRetry = 2*time.Second, 2*time.Second
	for _, reached := range []bool{false, true} {
		c.reached.Store(reached)
		for _, op := range []string{OpGetAttr, OpCreate} {
			start := time.Now()
			err := c.Call(context.Background(), op, struct{}{}, nil)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), addr) {
				t.Errorf("%s (reached before: %v): error %v, want one naming %s", op, reached, err, addr)
			}
			// RetryFor, and the last attempt's second; generous for a loaded machine.
			if took > 10*time.Second {
				t.Errorf("%s (reached before: %v): took %s with RetryFor %s", op, reached, took, c.RetryFor)
			}
		}
	}
}

// TestAttemptTimeout: an attempt takes what is left of the op timeout,
// at least a second and at most the HTTP client's 30 s; a Reconcile,
// which meta holds up to MaxReconcileWait by design, is never cut below
// that hold; without an op timeout an attempt takes the usual 30 s.
func TestAttemptTimeout(t *testing.T) {
	for _, tc := range []struct {
		op             string
		retryFor, left time.Duration
		want           time.Duration
	}{
		{OpGetAttr, 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{OpGetAttr, 5 * time.Second, 2 * time.Second, 2 * time.Second},
		{OpGetAttr, 5 * time.Second, 0, time.Second},
		{OpGetAttr, 5 * time.Second, -time.Second, time.Second},
		{OpGetAttr, time.Minute, time.Minute, 30 * time.Second},
		{OpGetAttr, 0, 0, 30 * time.Second},
		{OpReconcile, 5 * time.Second, 5 * time.Second, MaxReconcileWait + 5*time.Second},
		{OpReconcile, time.Hour, time.Hour, 30 * time.Second},
	} {
		if got := attemptTimeout(tc.op, tc.retryFor, tc.left); got != tc.want {
			t.Errorf("attemptTimeout(%s, %s, %s) = %s, want %s", tc.op, tc.retryFor, tc.left, got, tc.want)
		}
	}
}
