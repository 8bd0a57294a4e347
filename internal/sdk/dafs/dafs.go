// Package dafs is an asynchronous, batched client API after the DAFS API
// (seed 004, Magoutis §2.4.3, §5.5): the application registers its
// buffers once, describes reads and writes into them, submits many at a
// time and reaps their completions from a queue, by polling or waiting.
// The core caches nothing: every read goes to a node, and policy
// (read-ahead, write-behind, eviction) is the application's, on top.
//
// Cache is that optional layer, built on Session's public API only: a
// block cache of the application's block size in a memory bound, over a
// session of its own, whose arena is registered once so that fetched
// blocks are placed straight into it. The misses of one read go in one
// Submit. Policy is explicit: read-ahead on sequential reads and
// WillNeed hints, write-behind in batches with bounded dirty bytes
// (errors returned by Flush/Sync, never dropped), DontNeed hints and
// LRU eviction. It is the application's private cache: it does not see
// other clients' writes (see Cache for what it guarantees).
//
// The reads of one Submit travel as batches: all pieces bound for one
// node go as one request carrying a descriptor per piece, which the node
// serves by placing each piece with one-sided WRITEs — into the
// application's registered buffer itself when the piece is aligned to
// the node's checksum blocks, else into a staging buffer from which the
// verified bytes are copied — and answers once with a status per piece
// (sdk.Batcher). Writes go through the SDK's ordinary write path, one
// request per op; the write buffer need not be registered.
package dafs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/sdk"
)

// Errors of the API itself (an op's I/O errors are the SDK's).
var (
	ErrQueueFull    = errors.New("dafs: submitting these ops would exceed the queue depth")
	ErrDeregistered = errors.New("dafs: buffer is not registered")
	ErrClosed       = errors.New("dafs: session closed")
)

// Options configure a session.
type Options struct {
	// Depth bounds the ops submitted and not yet reaped (completed ones
	// waiting in the queue count). Default 1024.
	Depth int
}

// Session is one application's queue of asynchronous I/O on a client.
// It is safe for concurrent use.
type Session struct {
	c     *sdk.Client
	b     *sdk.Batcher
	depth int

	mu      sync.Mutex
	queue   []Completion
	pending int           // submitted and not yet reaped
	changed chan struct{} // closed (and replaced) when the queue grows
	closed  bool
	bufs    map[*Buffer]struct{}
	// waiting are ops submitted and not started: they go out together
	// when fewer than maxRuns groups of ops are in flight.
	waiting []pendingOp
	runs    int
	running sync.WaitGroup
}

// pendingOp is a submitted op and the context it was submitted under.
type pendingOp struct {
	ctx context.Context
	op  *Op
}

// maxRuns bounds the groups of ops a session has in flight. Ops
// submitted meanwhile wait and then go together, so that a caller keeping
// many ops outstanding by submitting each as another completes still
// gets large batches — and a node a bounded number of requests (and
// connections) from the session.
const maxRuns = 2

// New opens a session on c.
func New(c *sdk.Client, opts Options) *Session {
	if opts.Depth <= 0 {
		opts.Depth = 1024
	}
	return &Session{c: c, b: c.NewBatcher(), depth: opts.Depth, changed: make(chan struct{}), bufs: map[*Buffer]struct{}{}}
}

// Stats are the session's batching counters (see sdk.BatchStats).
func (s *Session) Stats() sdk.BatchStats { return s.b.Stats() }

// Buffer is application memory registered with the client's fabric
// endpoint: nodes may place read data in it, nothing else.
type Buffer struct {
	mem    []byte
	region *fabric.Region
	inUse  int  // ops in flight on it (under the session's lock)
	gone   bool // deregistering: no new op may use it
	idle   chan struct{}
}

// Bytes is the registered memory.
func (b *Buffer) Bytes() []byte { return b.mem }

// Register registers mem for the session's ops. Registration is meant to
// be done once and reused (the thesis' registration cache).
func (s *Session) Register(mem []byte) (*Buffer, error) {
	if len(mem) == 0 {
		return nil, errors.New("dafs: registering an empty buffer")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	b := &Buffer{mem: mem, region: s.c.RegisterBuffer(mem)}
	s.bufs[b] = struct{}{}
	return b, nil
}

// Deregister revokes b. Ops submitted on it after the call begins are
// refused with ErrDeregistered; ops already in flight are waited for
// (until ctx ends: then b stays registered but refuses new ops, and
// Deregister may be called again). Once it returns nil, no node can
// write into the memory.
func (s *Session) Deregister(ctx context.Context, b *Buffer) error {
	s.mu.Lock()
	if _, ok := s.bufs[b]; !ok {
		s.mu.Unlock()
		return ErrDeregistered
	}
	b.gone = true
	var idle chan struct{}
	if b.inUse > 0 {
		if b.idle == nil {
			b.idle = make(chan struct{})
		}
		idle = b.idle
	}
	s.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("dafs: deregistering a buffer with ops in flight: %w", ctx.Err())
		}
	}
	s.mu.Lock()
	_, ok := s.bufs[b]
	delete(s.bufs, b)
	s.mu.Unlock()
	if ok {
		s.c.DeregisterBuffer(b.region)
	}
	return nil
}

// Kind is what an op does.
type Kind uint8

const (
	Read Kind = iota + 1
	Write
)

// Op describes one asynchronous read or write: Len bytes at file offset
// Off of File, from or into Buf at BufOff. Tag is the application's.
type Op struct {
	Kind   Kind
	File   *sdk.File
	Off    int64
	Buf    *Buffer
	BufOff int
	Len    int
	Tag    any
}

// ReadAsync describes a read of n bytes at off of f into buf at bufOff.
func ReadAsync(f *sdk.File, off int64, buf *Buffer, bufOff, n int) *Op {
	return &Op{Kind: Read, File: f, Off: off, Buf: buf, BufOff: bufOff, Len: n}
}

// WriteAsync describes a write of n bytes from buf at bufOff to off of f.
func WriteAsync(f *sdk.File, off int64, buf *Buffer, bufOff, n int) *Op {
	return &Op{Kind: Write, File: f, Off: off, Buf: buf, BufOff: bufOff, Len: n}
}

// Completion is an op's outcome: N bytes transferred (a read short of
// Len only at the end of the file, with Err io.EOF), or Err.
type Completion struct {
	Op  *Op
	N   int
	Err error
}

// check says what is wrong with op, if anything (under s.mu).
func (s *Session) check(op *Op) error {
	switch {
	case op == nil:
		return errors.New("dafs: nil op")
	case op.Kind != Read && op.Kind != Write:
		return fmt.Errorf("dafs: op of kind %d", op.Kind)
	case op.File == nil:
		return errors.New("dafs: op on no file")
	case op.Buf == nil:
		return errors.New("dafs: op on no buffer")
	case op.Off < 0 || op.Len < 0 || op.BufOff < 0 || op.BufOff > len(op.Buf.mem)-op.Len:
		return fmt.Errorf("dafs: op [%d, +%d) of buffer of %d bytes at file offset %d", op.BufOff, op.Len, len(op.Buf.mem), op.Off)
	}
	if _, ok := s.bufs[op.Buf]; !ok || op.Buf.gone {
		return ErrDeregistered
	}
	return nil
}

// Submit starts ops. It checks them all first: if any is malformed or
// names a buffer not registered, or they would exceed the queue depth,
// none is started and the error says why. Then it returns at once; each
// op's completion arrives in the queue (Poll, Wait) as soon as the op is
// complete. The reads among ops go in batches (one request per node);
// while earlier ops are in flight, ops of several Submits wait and go
// together. The reads one request carries complete together, in the
// order they were submitted. Completions are reaped oldest first. Ending
// ctx cancels the ops not yet started; ops in flight are cancelled once
// every op in flight with them has its context ended too. Cancelled ops
// complete with the context's error.
func (s *Session) Submit(ctx context.Context, ops ...*Op) error {
	if len(ops) == 0 {
		return nil
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.pending+len(ops) > s.depth {
		s.mu.Unlock()
		return ErrQueueFull
	}
	for i, op := range ops {
		if err := s.check(op); err != nil {
			s.mu.Unlock()
			return fmt.Errorf("op %d: %w", i, err)
		}
	}
	for _, op := range ops {
		op.Buf.inUse++
		s.waiting = append(s.waiting, pendingOp{ctx, op})
	}
	s.pending += len(ops)
	s.startLocked()
	s.mu.Unlock()
	return nil
}

// startLocked starts the waiting ops as one group if a run is free
// (under s.mu).
func (s *Session) startLocked() {
	if len(s.waiting) == 0 || s.runs >= maxRuns {
		return
	}
	group := s.waiting
	s.waiting = nil
	s.runs++
	s.running.Add(1)
	go s.run(group)
}

// run performs a group of ops (of one or several Submits) and queues each
// one's completion as soon as it is complete. The group's I/O is
// cancelled once every op's context has ended; an op whose context ended
// before it started does no I/O.
func (s *Session) run(group []pendingOp) {
	defer func() {
		s.mu.Lock()
		s.runs--
		s.startLocked()
		s.mu.Unlock()
		s.running.Done()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var live atomic.Int32
	live.Store(int32(len(group)))
	for _, p := range group {
		stop := context.AfterFunc(p.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	var reads []sdk.BatchRead
	var at []int
	var wg sync.WaitGroup
	for i, p := range group {
		op := p.op
		if err := p.ctx.Err(); err != nil {
			s.complete(Completion{Op: op, Err: fmt.Errorf("dafs: op cancelled: %w", err)})
			continue
		}
		mem := op.Buf.mem[op.BufOff : op.BufOff+op.Len]
		if op.Kind == Write {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n, err := op.File.WriteAtContext(ctx, mem, op.Off)
				s.complete(s.cancelled(p.ctx, Completion{Op: op, N: n, Err: err}))
			}()
			continue
		}
		reads = append(reads, sdk.BatchRead{File: op.File, Off: op.Off, Dst: mem, Region: op.Buf.region, RegionOff: uint64(op.BufOff)})
		at = append(at, i)
	}
	if len(reads) > 0 {
		s.b.Read(ctx, reads, func(j int) {
			p := group[at[j]]
			s.complete(s.cancelled(p.ctx, Completion{Op: p.op, N: reads[j].N, Err: reads[j].Err}))
		})
	}
	wg.Wait()
}

// cancelled says so in a failed op's error if ctx has ended.
func (s *Session) cancelled(ctx context.Context, c Completion) Completion {
	if err := ctx.Err(); err != nil && c.Err != nil && !errors.Is(c.Err, err) {
		c.Err = fmt.Errorf("dafs: op cancelled: %w (%v)", err, c.Err)
	}
	return c
}

// complete queues c and releases its op's hold on its buffer.
func (s *Session) complete(c Completion) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := c.Op.Buf
	if b.inUse--; b.inUse == 0 && b.idle != nil {
		close(b.idle)
		b.idle = nil
	}
	s.queue = append(s.queue, c)
	close(s.changed)
	s.changed = make(chan struct{})
}

// Poll moves up to len(dst) completions from the queue into dst, oldest
// first, and returns how many. It never blocks.
func (s *Session) Poll(dst []Completion) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.take(dst)
}

// take reaps into dst (under s.mu).
func (s *Session) take(dst []Completion) int {
	n := copy(dst, s.queue)
	clear(s.queue[:n])
	s.queue = s.queue[n:]
	s.pending -= n
	return n
}

// Wait returns at least n completions (all that are queued once n are),
// oldest first. If ctx ends first it returns those queued by then and
// ctx's error; n larger than the ops outstanding fails at once.
func (s *Session) Wait(ctx context.Context, n int) ([]Completion, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > s.pending {
		return nil, fmt.Errorf("dafs: waiting for %d completions with %d ops outstanding", n, s.pending)
	}
	for len(s.queue) < n {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
			s.mu.Lock()
		case <-ctx.Done():
			s.mu.Lock()
			out := make([]Completion, len(s.queue))
			return out[:s.take(out)], ctx.Err()
		}
	}
	out := make([]Completion, len(s.queue))
	return out[:s.take(out)], nil
}

// Close waits for the ops in flight (their completions are dropped
// unless reaped before) and deregisters every buffer.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.running.Wait()
	s.mu.Lock()
	bufs := s.bufs
	s.bufs = map[*Buffer]struct{}{}
	s.mu.Unlock()
	for b := range bufs {
		s.c.DeregisterBuffer(b.region)
	}
	return nil
}
