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
