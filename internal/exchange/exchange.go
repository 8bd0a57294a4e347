// Package exchange is one request and its reply over a pooled fabric
// connection: the message goes out (whole, or streamed piece by piece
// while watching for the node to answer early), the reply is awaited with
// a timeout, and the connection goes back to the pool when the exchange
// ended cleanly and is closed otherwise. Clients and nodes alike send
// every request to a node this way.
package exchange

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
)

// Call is one request in flight on a connection checked out of a pool.
// It is a value so a request costs no allocation of its own: keep it in a
// variable (or a field) and use it through a pointer; do not copy it once
// begun.
type Call struct {
	pool    *fabric.Pool
	pc      *fabric.PeerConn
	mw      *fabric.MessageWriter // nil once the message is out (or for Post)
	replies <-chan *fabric.Packet

	// Pump's cursor in SetData's data: parts[part][pos:] on, left bytes.
	// The parts are not kept: a caller's slice of them then stays on its
	// stack.
	part, pos, left int
}

// NoReplyError is a node's silence for the timeout after the whole
// request was sent.
type NoReplyError struct{ After time.Duration }

func (e *NoReplyError) Error() string { return fmt.Sprintf("no reply within %s", e.After) }

// LostError is the connection ending before the reply came.
type LostError struct{ Err error }

func (e *LostError) Error() string { return "connection lost: " + e.Err.Error() }
func (e *LostError) Unwrap() error { return e.Err }

// errAnswered aborts a message the node answered before its end.
var errAnswered = errors.New("answered mid-message")

// Begin checks out a connection to addr and starts a streamed request
// with header hdr (the whole request if empty); see Start.
func Begin(ctx context.Context, pool *fabric.Pool, addr string, hdr []byte, empty bool) (Call, error) {
	pc, err := pool.Get(ctx, addr)
	if err != nil {
		return Call{}, err
	}
	return Start(pool, pc, hdr, empty)
}

// Start starts a streamed request with header hdr on pc, a connection
// checked out of pool (the whole request if empty). On failure pc is
// closed.
func Start(pool *fabric.Pool, pc *fabric.PeerConn, hdr []byte, empty bool) (Call, error) {
	c, id := expect(pool, pc)
	mw, err := pc.Begin(id, hdr, empty)
	if err != nil {
		pc.Close()
		return Call{}, err
	}
	c.mw = mw
	return c, nil
}

// expect starts a call on pc: a new message id, its reply awaited.
func expect(pool *fabric.Pool, pc *fabric.PeerConn) (Call, uint64) {
	id := pc.NewID()
	return Call{pool: pool, pc: pc, replies: pc.Replies.Expect(id)}, id
}

// Post sends a whole request, header hdr and data the concatenation of
// parts, on pc, a connection checked out of pool; Finish awaits the reply.
// On failure pc is closed.
func Post(pool *fabric.Pool, pc *fabric.PeerConn, hdr []byte, parts ...[]byte) (Call, error) {
	c, id := expect(pool, pc)
	if err := pc.Send(id, hdr, parts...); err != nil {
		pc.Close()
		return Call{}, err
	}
	return c, nil
}

// Conn is the call's connection.
func (c *Call) Conn() *fabric.PeerConn { return c.pc }

// Replies yields the reply (or is closed when the connection ends), for a
// caller that waits on it together with other things while streaming; it
// must then Abort the message.
func (c *Call) Replies() <-chan *fabric.Packet { return c.replies }

// Write appends data to the message (last: its final bytes), batched
// until Flush. On failure the message is aborted.
func (c *Call) Write(data []byte, last bool) error {
	if err := c.mw.Write(data, last); err != nil {
		c.Abort(err)
		return err
	}
	return nil
}

// Flush sends what Write batched. On failure the message is aborted.
func (c *Call) Flush() error {
	if err := c.mw.Flush(); err != nil {
		c.Abort(err)
		return err
	}
	return nil
}

// Abort abandons the message; the connection dies with it (the node
// drops the partial message at once).
func (c *Call) Abort(reason error) {
	if c.mw != nil {
		c.mw.Abort(reason)
		c.mw = nil
	}
}

// Early reports whether the node answered before the message's end (a
// refusal, or "already applied" for a retry it committed). If so the
// message is aborted and the reply returned, or a *LostError if the
// connection ended; the caller releases the packet.
func (c *Call) Early() (bool, *fabric.Packet, error) {
	select {
	case p, ok := <-c.replies:
		p, err := c.Answered(p, ok)
		return true, p, err
	default:
		return false, nil, nil
	}
}

// Answered is Early for a caller that received p (ok: not closed) from
// Replies while streaming: it aborts the message and returns the reply,
// or a *LostError.
func (c *Call) Answered(p *fabric.Packet, ok bool) (*fabric.Packet, error) {
	c.Abort(errAnswered)
	if !ok {
		return nil, c.lost()
	}
	return p, nil
}

// SetData starts Pump on the message's data, the concatenation of parts;
// every Pump must be given the same parts (which it does not modify).
func (c *Call) SetData(parts [][]byte) {
	c.part, c.pos, c.left = 0, 0, 0
	for _, p := range parts {
		c.left += len(p)
	}
}

// Left is how many bytes of SetData's data Pump has yet to send.
func (c *Call) Left() int { return c.left }

// Pump sends up to budget more bytes of parts (as given to SetData) and
// flushes them, after checking for an early reply (then answered is set,
// with the reply or error as Early returns them).
func (c *Call) Pump(parts [][]byte, budget int) (answered bool, p *fabric.Packet, err error) {
	if answered, p, err = c.Early(); answered {
		return answered, p, err
	}
	for budget > 0 && c.left > 0 {
		d := parts[c.part][c.pos:]
		k := min(budget, len(d))
		c.left -= k
		budget -= k
		if err := c.mw.Write(d[:k], c.left == 0); err != nil {
			c.Abort(err)
			return false, nil, err
		}
		if c.pos += k; c.pos == len(parts[c.part]) {
			c.part, c.pos = c.part+1, 0
		}
	}
	return false, nil, c.Flush()
}

// Finish ends the message and awaits the reply for up to timeout from
// now (the transfer's end: a slow transfer must not make a node that has
// everything look dead) or until ctx ends. With the reply in, the
// connection goes back to the pool and the reply is returned for the
// caller to parse and release; otherwise the connection is closed and
// the error is a *NoReplyError, a *LostError or ctx's.
func (c *Call) Finish(ctx context.Context, timeout time.Duration) (*fabric.Packet, error) {
	p, err := c.await(ctx.Done(), timeout)
	if err == errStopped {
		err = ctx.Err()
	}
	return p, err
}

// ErrStopped is FinishUnless's error when stop closed first.
var ErrStopped = errors.New("exchange: stopped awaiting the reply")

// FinishUnless is Finish for a caller that stops on a channel closing
// rather than a context ending (then the error is ErrStopped).
func (c *Call) FinishUnless(stop <-chan struct{}, timeout time.Duration) (*fabric.Packet, error) {
	p, err := c.await(stop, timeout)
	if err == errStopped {
		err = ErrStopped
	}
	return p, err
}

var errStopped = errors.New("stopped")

func (c *Call) await(stop <-chan struct{}, timeout time.Duration) (*fabric.Packet, error) {
	if c.mw != nil {
		err := c.mw.Close()
		c.mw = nil
		if err != nil {
			c.close()
			return nil, err
		}
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case p, ok := <-c.replies:
		if !ok {
			return nil, c.lost()
		}
		c.pool.Put(c.pc)
		return p, nil
	case <-stop:
		c.close()
		return nil, errStopped
	case <-t.C:
		c.close()
		return nil, &NoReplyError{After: timeout}
	}
}

// close closes the connection and waits for its reader, so no late
// reply lands in memory the caller registered for this request.
func (c *Call) close() {
	c.pc.Close()
	c.pc.Wait()
}

func (c *Call) lost() error {
	err := c.pc.Err()
	if err == nil {
		err = fabric.ErrClosed
	}
	return &LostError{Err: err}
}

// Do sends a whole request to addr over a connection from pool and
// returns its reply (see Finish), waiting up to timeout after sending.
func Do(ctx context.Context, pool *fabric.Pool, addr string, timeout time.Duration, hdr []byte, parts ...[]byte) (*fabric.Packet, error) {
	pc, err := pool.Get(ctx, addr)
	if err != nil {
		return nil, err
	}
	c, err := Post(pool, pc, hdr, parts...)
	if err != nil {
		return nil, err
	}
	return c.Finish(ctx, timeout)
}
