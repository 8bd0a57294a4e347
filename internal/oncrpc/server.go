package oncrpc

import (
	"bufio"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/connlimit"
	"github.com/sluicefs/sluice/internal/xdr"
)

// Handler runs procedure c.Proc of version c.Vers. res already holds the
// accepted-reply header for Success; the handler appends its results to
// res and returns Success, or returns another AcceptStat (ProcUnavail for
// an unknown procedure, GarbageArgs when args do not decode: check
// args.Err()), in which case the server discards res and sends that
// status instead.
//
// args aliases a buffer the server reuses once the handler returns: copy
// what must outlive the call. Handlers run concurrently; a panic is
// answered with SystemErr.
type Handler func(ctx context.Context, c *Call, args *xdr.Reader, res *xdr.Writer) AcceptStat

// Program is an RPC program served in versions Low..High.
type Program struct {
	Prog, Low, High uint32
	Handle          Handler
	// Idempotent reports whether procedure proc of version vers may
	// safely run twice. Replies of the others are kept in the
	// duplicate-request cache. nil: all idempotent.
	Idempotent func(vers, proc uint32) bool
}

const (
	defaultMaxRecord    = 1<<20 + 64<<10 // an NFS WRITE of 1 MiB and its header
	defaultMaxInFlight  = 64
	defaultDRCEntries   = 4096
	defaultMaxConns     = 1024
	defaultMaxPerHost   = 64
	defaultWriteTimeout = 30 * time.Second
	defaultIdleTimeout  = 5 * time.Minute
	drcMaxBytes         = 64 << 20

	// Record buffers are pooled in two sizes, chosen by the length of a
	// record's first fragment, so the many small calls (GETATTR,
	// LOOKUP) do not each hold a buffer a 1 MiB WRITE grew.
	smallRecord = 16 << 10
	// Replies larger than this are not pooled (a READ of 1 MiB is well
	// under it).
	maxPooledReply = 4 << 20
	// tcpChunkMin is the size from which a reply's opaque data (a READ's)
	// is not copied into the reply buffer but written from where it lies
	// (a read-cache block) by the same vectored write as the record mark
	// and header.
	tcpChunkMin = 8 << 10
)

// Server serves Programs over TCP. Set its fields before Serve and leave
// them: they are read without locks.
type Server struct {
	Programs    []Program
	MaxRecord   int          // largest call record accepted; default 1 MiB + 64 KiB
	MaxInFlight int          // calls run at once per connection; default 64
	DRCEntries  int          // duplicate-request cache entries; default 4096
	Logger      *slog.Logger // nil: discard
	// MaxConns bounds the connections served at once (more are closed
	// as they come, logged); default 1024, negative: none. Each may hold
	// up to MaxInFlight calls' records.
	MaxConns int
	// MaxConnsPerHost bounds the connections from one host (IPv4
	// address, IPv6 /64; see connlimit), so one client cannot take every
	// slot; default 64 (Linux's nconnect goes to 16 per mount),
	// negative: none.
	MaxConnsPerHost int
	// WriteTimeout bounds writing one reply: a client that stops reading
	// loses its connection instead of holding its calls; default 30 s.
	WriteTimeout time.Duration
	// IdleTimeout ends a connection on which no whole call arrived for
	// this long (the calls it has running still get their replies), so
	// idle or trickling connections do not hold MaxConns slots;
	// default 5 min.
	IdleTimeout time.Duration

	stats counters

	once   sync.Once
	ctx    context.Context // handlers'; cancelled by Close
	cancel context.CancelFunc
	log    *slog.Logger
	drc    *drc

	admit *connlimit.Limiter // MaxConns, MaxConnsPerHost

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup // connections; each waits for its handlers
}

func (s *Server) init() {
	s.once.Do(func() {
		s.ctx, s.cancel = context.WithCancel(context.Background())
		s.log = s.Logger
		if s.log == nil {
			s.log = slog.New(slog.DiscardHandler)
		}
		entries := s.DRCEntries
		if entries <= 0 {
			entries = defaultDRCEntries
		}
		s.drc = newDRC(entries, drcMaxBytes)
		s.listeners = make(map[net.Listener]struct{})
		s.conns = make(map[net.Conn]struct{})
		s.admit = connlimit.New(cmp.Or(s.MaxConns, defaultMaxConns), cmp.Or(s.MaxConnsPerHost, defaultMaxPerHost))
	})
}

func (s *Server) maxRecord() int {
	if s.MaxRecord > 0 {
		return s.MaxRecord
	}
	return defaultMaxRecord
}

func (s *Server) maxInFlight() int {
	if s.MaxInFlight > 0 {
		return s.MaxInFlight
	}
	return defaultMaxInFlight
}

// Serve accepts connections on ln until ln or the server is closed; it
// returns nil after Close, and the listener's error otherwise.
func (s *Server) Serve(ln net.Listener) error {
	s.init()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return nil
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
	}()

	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			// Out of file descriptors and the like pass; retry slowly
			// rather than spin or give up (as net/http does).
			if te, ok := err.(interface{ Temporary() bool }); ok && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("oncrpc: accept", "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		release, err := s.admit.Admit(nc.RemoteAddr())
		if err != nil {
			s.mu.Unlock()
			connlimit.Log(s.log, "oncrpc", nc.RemoteAddr(), err)
			nc.Close()
			continue
		}
		s.conns[nc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serveConn(nc, release)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops the listeners, closes the connections, cancels the
// handlers' context and waits for the handlers to return.
func (s *Server) Close() error {
	s.init()
	s.mu.Lock()
	s.closed = true
	s.cancel()
	for ln := range s.listeners {
		ln.Close()
	}
	for nc := range s.conns {
		nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// conn is one client connection.
type conn struct {
	s      *Server
	nc     net.Conn
	remote string // address, for Call.Remote and logs
	client string // IP without the port, for the duplicate-request cache
	wmu    sync.Mutex
	slots  chan struct{} // one per call running: bounds goroutines and buffers
	wg     sync.WaitGroup
}

func (s *Server) serveConn(nc net.Conn, release func()) {
	defer s.wg.Done()
	c := &conn{s: s, nc: nc, remote: nc.RemoteAddr().String(), slots: make(chan struct{}, s.maxInFlight())}
	c.client = hostOf(c.remote)
	br := bufio.NewReaderSize(nc, 32<<10)
	var err error
	for {
		// Take a slot before reading, so a connection holds at most
		// MaxInFlight records; the reader waits while they all run.
		c.slots <- struct{}{}
		nc.SetReadDeadline(time.Now().Add(cmp.Or(s.IdleTimeout, defaultIdleTimeout)))
		var bufp *[]byte
		if bufp, err = readCall(br, countingReader{br, &s.stats}, s.maxRecord()); err != nil {
			break
		}
		c.wg.Add(1)
		go c.serve(bufp)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		err = io.EOF // idle: end it as a client's close would
	}
	if !errors.Is(err, io.EOF) {
		// An oversized or broken record leaves the rest of the stream
		// meaningless: stop reading it now, whatever still runs.
		nc.Close()
	}
	// After a clean end of stream (a client half-closing), replies to the
	// calls already read are still sent.
	c.wg.Wait()
	nc.Close()
	s.mu.Lock()
	delete(s.conns, nc)
	s.mu.Unlock()
	release()

	switch {
	case errors.Is(err, ErrRecordTooLarge):
		s.log.Warn("oncrpc: connection closed", "remote", c.remote, "err", err)
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		s.log.Debug("oncrpc: connection closed", "remote", c.remote)
	default:
		s.log.Debug("oncrpc: connection closed", "remote", c.remote, "err", err)
	}
}

var (
	smallRecords = sync.Pool{New: func() any { b := make([]byte, 0, smallRecord); return &b }}
	largeRecords sync.Pool
	replies      = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}
)

// readCall reads one record into a pooled buffer sized by a peek at its
// first fragment's length.
func readCall(br *bufio.Reader, cr countingReader, max int) (*[]byte, error) {
	hdr, err := br.Peek(4)
	if err != nil {
		return nil, err
	}
	var bufp *[]byte
	if int(binary.BigEndian.Uint32(hdr)&^lastFragment) <= smallRecord {
		bufp = smallRecords.Get().(*[]byte)
	} else if p, ok := largeRecords.Get().(*[]byte); ok {
		bufp = p
	} else {
		bufp = new([]byte)
	}
	*bufp, err = ReadRecord(cr, *bufp, max)
	if err != nil {
		putRecord(bufp)
		return nil, err
	}
	return bufp, nil
}

func putRecord(p *[]byte) {
	*p = (*p)[:0]
	if cap(*p) <= smallRecord {
		smallRecords.Put(p)
	} else {
		largeRecords.Put(p)
	}
}

// serve answers one call record and frees its slot.
func (c *conn) serve(bufp *[]byte) {
	defer c.wg.Done()
	replyp := replies.Get().(*[]byte)
	w := xdr.Writer{B: (*replyp)[:0], ChunkMin: tcpChunkMin}
	if reply := c.respond(*bufp, &w); reply != nil {
		c.s.stats.copied.Add(w.Copied)
		c.s.stats.calls.Add(1)
		c.send(reply, w.Chunks)
	}
	w.Release() // the reply holds nothing once written
	putRecord(bufp)
	if cap(w.B) <= maxPooledReply {
		*replyp = w.B[:0]
		replies.Put(replyp)
	}
	<-c.slots
}

// respond decodes and runs the call in rec and returns the reply to send
// (in w), or nil to send none.
func (c *conn) respond(rec []byte, w *xdr.Writer) []byte {
	if !c.s.dispatch(c.remote, c.client, rec, nil, w) {
		return nil
	}
	return w.B
}

// hostOf is the IP of addr (host:port), or addr itself.
func hostOf(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// Stats returns the server's counters (TCP connections only).
func (s *Server) Stats() Stats { return s.stats.snapshot() }

// Dispatch runs one call for a transport other than TCP (RPC over the
// fabric): rec is the whole call message, chunks the opaque data carried
// apart from it (already pulled), remote the caller's address and client
// its host, which keys the duplicate-request cache. The reply is left in
// w (with chunks, if w.ChunkMin is set, except for calls whose replies
// are cached: those are inline); false means nothing is to be sent.
func (s *Server) Dispatch(remote, client string, rec []byte, chunks []xdr.Chunk, w *xdr.Writer) bool {
	s.init()
	return s.dispatch(remote, client, rec, chunks, w)
}

func (s *Server) dispatch(remote, client string, rec []byte, chunks []xdr.Chunk, w *xdr.Writer) bool {
	args := xdr.NewReader(rec)
	args.SetChunks(chunks)
	call := &Call{Remote: remote}
	err := ParseCall(args, call)
	switch {
	case err == nil:
	case errors.Is(err, ErrRPCVersion):
		AppendRPCMismatch(w, call.XID)
		return true
	case errors.Is(err, ErrBadCred):
		s.log.Debug("oncrpc: bad credential", "remote", remote, "xid", call.XID, "err", err)
		AppendAuthError(w, call.XID, authBadCred)
		return true
	default:
		// A reply, or too short to say what it calls: nothing to answer.
		s.log.Debug("oncrpc: message dropped", "remote", remote, "err", err)
		return false
	}

	p, served, low, high := s.program(call.Prog, call.Vers)
	switch {
	case p != nil:
	case served:
		AppendProgMismatch(w, call.XID, low, high)
		return true
	default:
		AppendAccepted(w, call.XID, ProgUnavail)
		return true
	}
	if p.Idempotent == nil || p.Idempotent(call.Vers, call.Proc) {
		s.invoke(p, call, args, w)
		return true
	}

	// The cache keeps inline replies only.
	w.ChunkMin = 0
	// The key covers the arguments, chunks included: the same xid with
	// other data is another call.
	a := rec[args.Pos():]
	sum, size := crc32.ChecksumIEEE(a), len(a)
	for _, c := range chunks {
		sum = crc32.Update(sum, crc32.IEEETable, c.Data)
		size += len(c.Data)
	}
	key := drcKey{client: drcClient(client, remote), xid: call.XID, prog: call.Prog, vers: call.Vers, proc: call.Proc, sum: sum, size: size}
	switch state, reply := s.drc.begin(key); state {
	case drcInProgress:
		s.log.Debug("oncrpc: duplicate of a running call dropped", "remote", remote, "xid", call.XID)
		return false
	case drcDone:
		s.log.Debug("oncrpc: duplicate answered from the cache", "remote", remote, "xid", call.XID)
		w.B = append(w.B[:0], reply...)
		return true
	}
	s.invoke(p, call, args, w)
	s.drc.finish(key, w.B)
	return true
}

// drcClient keys the duplicate-request cache by the caller's host and
// whether its port is reserved: a retransmission from another port of
// the same host finds its reply (clients reconnect), but a process on an
// unprivileged port never gets the reply to a call made from a reserved
// one (root's), which an NFS export that is secure refuses it.
func drcClient(client, remote string) string {
	if _, p, err := net.SplitHostPort(remote); err == nil {
		if n, err := strconv.Atoi(p); err == nil && n < 1024 {
			return client + " reserved"
		}
	}
	return client
}

// program finds the program serving prog in version vers. Without one,
// served reports whether prog is served in other versions, low..high.
func (s *Server) program(prog, vers uint32) (p *Program, served bool, low, high uint32) {
	for i := range s.Programs {
		q := &s.Programs[i]
		if q.Prog != prog {
			continue
		}
		if q.Low <= vers && vers <= q.High {
			return q, true, 0, 0
		}
		if !served {
			low, high = q.Low, q.High
		}
		low, high, served = min(low, q.Low), max(high, q.High), true
	}
	return nil, served, low, high
}

// invoke runs the handler and leaves its reply in w.
func (s *Server) invoke(p *Program, call *Call, args *xdr.Reader, w *xdr.Writer) {
	AppendAccepted(w, call.XID, Success)
	stat := s.handle(p, call, args, w)
	if stat == Success {
		return
	}
	w.Reset()
	switch {
	case stat == ProgMismatch:
		AppendProgMismatch(w, call.XID, p.Low, p.High)
	case stat > SystemErr:
		s.log.Error("oncrpc: handler returned an unknown status", "prog", call.Prog, "proc", call.Proc, "stat", uint32(stat))
		AppendAccepted(w, call.XID, SystemErr)
	default:
		AppendAccepted(w, call.XID, stat)
	}
}

// handle runs the handler, turning a panic into SystemErr: one bad call
// must not take down the gateway and every client's mounts with it.
func (s *Server) handle(p *Program, call *Call, args *xdr.Reader, w *xdr.Writer) (stat AcceptStat) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("oncrpc: handler panicked", "prog", call.Prog, "vers", call.Vers, "proc", call.Proc,
				"panic", v, "stack", string(debug.Stack()))
			stat = SystemErr
		}
	}()
	return p.Handle(s.ctx, call, args, w)
}

// send writes one reply record, the chunks' data in their places;
// replies of concurrent calls do not interleave.
func (c *conn) send(reply []byte, chunks []xdr.Chunk) {
	c.wmu.Lock()
	c.nc.SetWriteDeadline(time.Now().Add(cmp.Or(c.s.WriteTimeout, defaultWriteTimeout)))
	n, err := writeChunked(c.nc, reply, chunks)
	c.wmu.Unlock()
	c.s.stats.out.Add(int64(n + 4))
	if err != nil {
		// A partly written record breaks the stream: end the connection
		// (the client retransmits on a new one).
		c.s.log.Debug("oncrpc: reply not sent", "remote", c.remote, "err", err)
		c.nc.Close()
	}
}
