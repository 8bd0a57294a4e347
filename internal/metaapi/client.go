package metaapi

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// Operation names: the last path element of /v1/<Op>.
const (
	OpResolve    = "Resolve"
	OpLookup     = "Lookup"
	OpGetAttr    = "GetAttr"
	OpCreate     = "Create"
	OpLink       = "Link"
	OpRemove     = "Remove"
	OpRename     = "Rename"
	OpRelease    = "Release"
	OpLock       = "Lock"
	OpLockSess   = "LockSession"
	OpReconcile  = "Reconcile"
	OpDrain      = "Drain"
	OpRevokeNode = "RevokeNode"
	OpRemoveNode = "RemoveNode"
	OpSetXattr   = "SetXattr"
	OpGetXattr   = "GetXattr"
	OpListXattr  = "ListXattr"
	OpRmXattr    = "RemoveXattr"
	OpReaddir    = "Readdir"
	OpSetAttr    = "SetAttr"
	OpSetPolicy  = "SetPolicy"
	OpGetPolicy  = "GetPolicy"
	OpLayout     = "Layout"
	OpCommit     = "Commit"
	OpDegraded   = "MarkDegraded"
	OpListDeg    = "ListDegraded"
	OpStatus     = "Status"
	OpRegister   = "Register"
	OpHeartbeat  = "Heartbeat"
	OpReportBad  = "ReportCorrupt"
	OpInventory  = "Inventory"
	OpStrays     = "Strays"
	OpCheck      = "Check"
	OpJoinToken  = "JoinToken"
	OpJoin       = "Join"
	OpBackup     = "Backup"
)

// MaxBodyBytes bounds every request and response body.
const MaxBodyBytes = 8 << 20

// ClientAuth formats the Authorization header value for a client.
func ClientAuth(id uint64, credential string) string {
	return fmt.Sprintf("Bearer %d:%s", id, credential)
}

// Client calls the meta service. It is safe for concurrent use. Calls that
// fail because meta cannot be reached (restarting, say) are retried with
// backoff until RetryFor has passed; errors meta returns are not retried
// except EAGAIN. A call that changes something in a way that cannot be
// done twice (see repeatable) is retried only when it never left this
// host: meta may have done it and died before answering, and doing it
// again would fail (EEXIST, ENOENT) or do it twice.
type Client struct {
	noTLS    bool
	addr     string
	base     string
	auth     string
	hc       *http.Client
	RetryFor time.Duration
	// FirstContactRetry bounds retries before meta has ever answered this
	// client: a wrong address or a cluster that is not running should
	// fail in seconds, while a meta restart later is ridden out.
	FirstContactRetry time.Duration
	reached           atomic.Bool
}

// NewClient returns a client for the meta service at addr (host:port),
// reached over TLS with tc (pki's ClientConfig, NodeConfig or
// JoinConfig); with a nil tc every call fails.
func NewClient(addr, auth string, tc *tls.Config) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{
		noTLS:             tc == nil,
		addr:              addr,
		base:              "https://" + addr + "/v1/",
		auth:              auth,
		hc:                &http.Client{Transport: tr, Timeout: 30 * time.Second},
		RetryFor:          15 * time.Second,
		FirstContactRetry: 2 * time.Second,
	}
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Call performs op with req and decodes the reply into resp (which may be
// nil). Errors from meta are *Error.
func (c *Client) Call(ctx context.Context, op string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("meta %s: encoding request: %w", op, err)
	}
	retryFor := c.RetryFor
	if !c.reached.Load() {
		retryFor = min(retryFor, c.FirstContactRetry)
	}
	start := time.Now()
	deadline := start.Add(retryFor)
	backoff := 20 * time.Millisecond
	for {
		err = c.once(ctx, op, body, resp, attemptTimeout(op, c.RetryFor, time.Until(start.Add(c.RetryFor))))
		var me *Error
		retry, unreachable := false, false
		switch {
		case err == nil:
			return nil
		case errors.As(err, &me):
			retry = me.Code == EAGAIN
		case errors.As(err, new(*TLSError)):
			// A certificate will not become valid by asking again.
		case ctx.Err() != nil:
			return err
		default:
			// Transport error: meta down or restarting.
			unreachable = true
			retry = repeatable(op) || notSent(err)
		}
		left := time.Until(deadline)
		if !retry || left <= 0 {
			if unreachable && retry {
				return fmt.Errorf("meta at %s did not answer for %s: %w", c.addr, time.Since(start).Round(100*time.Millisecond), err)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("meta %s: %w (last error: %v)", op, ctx.Err(), err)
		case <-time.After(min(backoff, left)): // the last try at the deadline
		}
		backoff = min(backoff*2, time.Second)
	}
}

// How long one attempt may take. Retries end when RetryFor (the caller's
// op timeout) has passed, and so does each attempt: without a bound of
// its own an attempt waited the HTTP client's 30 s for a meta that takes
// connections but never answers (stopped, say), whatever the op timeout.
const (
	attemptMax = 30 * time.Second // the HTTP client's timeout
	attemptMin = time.Second      // even the last attempt, at the deadline
	// heldSlack is what a call meta holds by design may take beyond
	// the hold: the round trip and meta's work.
	heldSlack = 5 * time.Second
)

// attemptTimeout is how long an attempt of op may take when left of the
// op timeout retryFor remains (0: none, an attempt takes the usual
// time): what is left, never below what meta may hold op before
// answering by design (heldAtMeta), and within attemptMax.
func attemptTimeout(op string, retryFor, left time.Duration) time.Duration {
	if retryFor <= 0 {
		return attemptMax
	}
	return min(attemptMax, max(left, attemptMin, heldAtMeta(op)))
}

// heldAtMeta is how long meta may hold op before it answers, by design:
// a waiting Reconcile is held until the repair is done or
// MaxReconcileWait has passed. Other calls are answered at once (a
// check, a lock and a backup are polled or streamed, not held).
func heldAtMeta(op string) time.Duration {
	if op == OpReconcile {
		return MaxReconcileWait + heldSlack
	}
	return 0
}

// Addr is the meta address the client calls.
func (c *Client) Addr() string { return c.addr }

// once-only operations: done twice, the second fails (Create of a name
// that now exists, Remove or Rename of one now gone, RemoveNode of a node
// now gone) or does it again (a second join token, a second principal).
var onceOnly = map[string]bool{
	OpCreate: true, OpLink: true, OpRemove: true, OpRename: true, OpSetXattr: true, OpRmXattr: true, OpRemoveNode: true,
	OpJoin: true, OpJoinToken: true, OpAuthAdd: true, OpAuthRotate: true, OpAuthRemove: true,
}

// repeatable says whether op may be sent again after meta may have done
// it: reads, and changes that come out the same done twice (set a size,
// commit versions, renew a session).
func repeatable(op string) bool { return !onceOnly[op] }

// notSent says whether a transport error shows the request never reached
// meta: the connection could not even be made.
func notSent(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// once makes one attempt, of at most timeout.
func (c *Client) once(ctx context.Context, op string, body []byte, resp any, timeout time.Duration) error {
	if c.noTLS {
		return fmt.Errorf("meta %s: %w", op, &TLSError{Reason: "no TLS configuration (no cluster CA)"})
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(actx, http.MethodPost, c.base+op, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("meta %s: %w", op, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", c.auth)
	hresp, err := c.hc.Do(hreq)
	if err != nil {
		if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("meta %s: no answer within %s: %w", op, timeout.Round(time.Millisecond), err)
		}
		return fmt.Errorf("meta %s: %w", op, explainTLS(err))
	}
	c.reached.Store(true)
	defer hresp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(hresp.Body, MaxBodyBytes+1))
	if err != nil {
		return fmt.Errorf("meta %s: reading reply: %w", op, err)
	}
	if len(raw) > MaxBodyBytes {
		return fmt.Errorf("meta %s: reply larger than %d bytes", op, MaxBodyBytes)
	}
	if hresp.StatusCode != http.StatusOK {
		var me Error
		if json.Unmarshal(raw, &me) == nil && me.Code != "" {
			return &me
		}
		return fmt.Errorf("meta %s: HTTP %d: %s", op, hresp.StatusCode, strings.TrimSpace(string(raw)))
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(raw, resp); err != nil {
		return fmt.Errorf("meta %s: decoding reply: %w", op, err)
	}
	return nil
}

// IsCode reports whether err is a meta *Error with the given code.
func IsCode(err error, code Code) bool {
	var me *Error
	return errors.As(err, &me) && me.Code == code
}

// Stream performs op, whose reply is a byte stream of any length (a
// backup), and returns it to read; the caller closes it. It is not
// retried: a stream cut short is for the caller to detect.
func (c *Client) Stream(ctx context.Context, op string, req any) (io.ReadCloser, error) {
	if c.noTLS {
		return nil, fmt.Errorf("meta %s: %w", op, &TLSError{Reason: "no TLS configuration (no cluster CA)"})
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("meta %s: encoding request: %w", op, err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+op, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("meta %s: %w", op, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", c.auth)
	// No overall timeout (c.hc has one): the stream takes as long as
	// it is long; ctx ends it.
	hc := &http.Client{Transport: c.hc.Transport}
	hresp, err := hc.Do(hreq)
	if err != nil {
		return nil, fmt.Errorf("meta %s: %w", op, explainTLS(err))
	}
	if hresp.StatusCode != http.StatusOK {
		defer hresp.Body.Close()
		raw, _ := io.ReadAll(io.LimitReader(hresp.Body, MaxBodyBytes))
		var me Error
		if json.Unmarshal(raw, &me) == nil && me.Code != "" {
			return nil, &me
		}
		return nil, fmt.Errorf("meta %s: HTTP %d: %s", op, hresp.StatusCode, strings.TrimSpace(string(raw)))
	}
	return hresp.Body, nil
}
