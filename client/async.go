package client

import (
	"context"

	"github.com/sluicefs/sluice/internal/sdk/dafs"
)

// Session is a queue of asynchronous, batched reads and writes after the
// DAFS API: register buffers once, describe ops into them (ReadAsync,
// WriteAsync), start many at once (Submit) and reap their completions
// (Poll never blocks; Wait does). The reads of one Submit bound for one
// storage node travel as one request, and the node places the data in
// the registered memory itself where it can. Nothing is cached. It is
// safe for concurrent use. See internal/sdk/dafs for the semantics.
type Session struct{ s *dafs.Session }

// Errors of the session itself.
var (
	// ErrQueueFull: a Submit would exceed the session's depth.
	ErrQueueFull = dafs.ErrQueueFull
	// ErrDeregistered: an op names a buffer that is not registered.
	ErrDeregistered = dafs.ErrDeregistered
	// ErrSessionClosed: the session is closed.
	ErrSessionClosed = dafs.ErrClosed
)

// NewSession opens a session on c that holds at most depth ops submitted
// and not yet reaped (0: 1024).
func (c *Client) NewSession(depth int) *Session {
	return &Session{s: dafs.New(c.c, dafs.Options{Depth: depth})}
}

// Buffer is memory registered for a session's ops.
type Buffer struct{ b *dafs.Buffer }

// Bytes is the registered memory.
func (b *Buffer) Bytes() []byte { return b.b.Bytes() }

// Register registers mem so storage nodes may place read data in it.
func (s *Session) Register(mem []byte) (*Buffer, error) {
	b, err := s.s.Register(mem)
	if err != nil {
		return nil, err
	}
	return &Buffer{b: b}, nil
}

// Deregister refuses new ops on b at once and returns when no op in
// flight uses it (or ctx ends first, leaving it registered).
func (s *Session) Deregister(ctx context.Context, b *Buffer) error { return s.s.Deregister(ctx, b.b) }

// AsyncOp is one described read or write; Tag is the application's.
type AsyncOp struct {
	op  *dafs.Op
	Tag any
}

func newOp(op *dafs.Op) *AsyncOp {
	a := &AsyncOp{op: op}
	op.Tag = a
	return a
}

// ReadAsync describes a read of n bytes at off of f into b at bufOff.
func ReadAsync(f *File, off int64, b *Buffer, bufOff, n int) *AsyncOp {
	return newOp(dafs.ReadAsync(f.f, off, b.b, bufOff, n))
}

// WriteAsync describes a write of n bytes from b at bufOff to off of f.
func WriteAsync(f *File, off int64, b *Buffer, bufOff, n int) *AsyncOp {
	return newOp(dafs.WriteAsync(f.f, off, b.b, bufOff, n))
}

// Completion is an op's outcome: N bytes (a read short only at the end
// of the file, with io.EOF), or Err.
type Completion struct {
	Op  *AsyncOp
	N   int
	Err error
}

// Submit starts ops, or none of them if one is malformed, names a buffer
// not registered, or they would exceed the depth. Ending ctx cancels
// those still in flight.
func (s *Session) Submit(ctx context.Context, ops ...*AsyncOp) error {
	in := make([]*dafs.Op, len(ops))
	for i, op := range ops {
		in[i] = op.op
	}
	return s.s.Submit(ctx, in...)
}

func completions(cs []dafs.Completion) []Completion {
	out := make([]Completion, len(cs))
	for i, c := range cs {
		out[i] = Completion{Op: c.Op.Tag.(*AsyncOp), N: c.N, Err: c.Err}
	}
	return out
}

// Poll moves up to len(dst) completions into dst, oldest first, without
// blocking, and returns how many.
func (s *Session) Poll(dst []Completion) int {
	cs := make([]dafs.Completion, len(dst))
	n := s.s.Poll(cs)
	return copy(dst, completions(cs[:n]))
}

// Wait returns at least n completions (all queued once n are), oldest
// first; if ctx ends first, those queued by then and ctx's error.
func (s *Session) Wait(ctx context.Context, n int) ([]Completion, error) {
	cs, err := s.s.Wait(ctx, n)
	return completions(cs), err
}

// Close waits for the ops in flight and deregisters every buffer.
func (s *Session) Close() error { return s.s.Close() }
