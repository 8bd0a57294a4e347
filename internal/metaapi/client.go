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
// except EAGAIN.
type Client struct {
	noTLS    bool
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
	deadline := time.Now().Add(retryFor)
	backoff := 20 * time.Millisecond
	for {
		err = c.once(ctx, op, body, resp)
		var me *Error
		retry := false
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
			retry = true // transport error: meta down or restarting
		}
		if !retry || time.Now().Add(backoff).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("meta %s: %w (last error: %v)", op, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (c *Client) once(ctx context.Context, op string, body []byte, resp any) error {
	if c.noTLS {
		return fmt.Errorf("meta %s: %w", op, &TLSError{Reason: "no TLS configuration (no cluster CA)"})
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+op, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("meta %s: %w", op, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", c.auth)
	hresp, err := c.hc.Do(hreq)
	if err != nil {
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
