package fabricrpc

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// Defaults of the server's receive buffers and timers.
const (
	DefaultBufSize     = 4 << 10 // receive buffer (fabric MTU): a READDIR page fits
	DefaultBufCount    = 32      // receive buffers per connection
	DefaultDoneTimeout = 10 * time.Second
	// Connections served at once, in all and from one IP address.
	DefaultMaxConns        = 1024
	DefaultMaxConnsPerHost = 64
	DefaultMaxPendingBytes = 512 << 20
	// MaxChunk bounds one chunk: an NFS READ or WRITE of 1 MiB, or a long
	// message of that order.
	MaxChunk = 1<<20 + 64<<10
)

// Stats count a transport's traffic; Copied is payload and message bytes
// the transport code copied in memory (not counting the socket's own
// copies in the kernel, which the fabric emulation over TCP makes once at
// each end for every byte; an RDMA NIC would not).
type Stats struct {
	Calls        int64 // calls answered (server) or made (client)
	InlineBytes  int64 // message bytes sent and received in SENDs
	PulledBytes  int64 // bytes placed by one-sided READs
	Copied       int64 // bytes copied in memory by the transport
	LongMessages int64 // messages sent or received as a chunk at offset 0
	DoneTimeouts int64 // replies whose regions were released without DONE (server)
	Retransmits  int64 // calls sent again on a new connection (client)
	PendingBytes int64 // memory pinned by replies awaiting DONE (server)
}

type counters struct {
	calls, inline, pulled, copied, long, timeouts, retransmits atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{Calls: c.calls.Load(), InlineBytes: c.inline.Load(), PulledBytes: c.pulled.Load(),
		Copied: c.copied.Load(), LongMessages: c.long.Load(), DoneTimeouts: c.timeouts.Load(),
		Retransmits: c.retransmits.Load()}
}

// Server serves an oncrpc.Server's programs over the fabric. Set its
// fields before Listen.
type Server struct {
	RPC *oncrpc.Server // the programs and the duplicate-request cache
	// BufSize and BufCount are the receive buffers posted per connection
	// (announced to clients, which size their messages and bound their
	// calls by them). Defaults DefaultBufSize, DefaultBufCount.
	BufSize, BufCount int
	// ChunkMin is the smallest reply datum sent as a chunk; default
	// DefaultChunkMin.
	ChunkMin int
	// DoneTimeout releases a reply's regions when no DONE came; default
	// DefaultDoneTimeout.
	DoneTimeout time.Duration
	// MaxConns and MaxConnsPerHost bound the connections served, in all
	// and from one IP address; defaults DefaultMaxConns and
	// DefaultMaxConnsPerHost. Each connection may hold its receive
	// buffers, their calls' pulled data and 2 × BufCount replies
	// awaiting DONE.
	MaxConns, MaxConnsPerHost int
	// MaxPendingBytes bounds the memory that replies awaiting DONE pin
	// across all connections (cache blocks, buffers); past it the oldest
	// are released early, and their clients' late pulls fail and are
	// retried. Default DefaultMaxPendingBytes.
	MaxPendingBytes int64
	Logger          *slog.Logger

	ep    *fabric.Endpoint
	log   *slog.Logger
	stats counters
	small sync.Pool // pulled chunk buffers of smallChunk bytes
	large sync.Pool // pulled chunk buffers of MaxChunk bytes

	// Replies awaiting DONE on every connection, oldest first, and the
	// bytes they pin: over MaxPendingBytes, the oldest go early.
	pmu      sync.Mutex
	plist    list.List
	pbytes   int64
	pendingN atomic.Int64 // bytes pinned, for Stats

	// revokeNext, in tests, revokes the next chunked reply's regions as
	// it is sent, as a DONE timeout would before a slow client's pull.
	revokeNext atomic.Bool
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	st := s.stats.snapshot()
	st.PendingBytes = s.pendingN.Load()
	return st
}

// Listen starts serving on addr and returns the address bound.
func (s *Server) Listen(addr string) (net.Addr, error) {
	s.log = s.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.ChunkMin <= 0 {
		s.ChunkMin = DefaultChunkMin
	}
	if s.DoneTimeout <= 0 {
		s.DoneTimeout = DefaultDoneTimeout
	}
	ep, err := fabric.NewEndpoint(fabric.Options{MTU: cmpOr(s.BufSize, DefaultBufSize), Quota: cmpOr(s.BufCount, DefaultBufCount),
		MaxConns: cmpOr(s.MaxConns, DefaultMaxConns), MaxConnsPerHost: cmpOr(s.MaxConnsPerHost, DefaultMaxConnsPerHost), Logger: s.log})
	if err != nil {
		return nil, fmt.Errorf("fabricrpc: %w", err)
	}
	s.ep = ep
	a, err := ep.Listen(addr, s)
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("fabricrpc: %w", err)
	}
	return a, nil
}

// smallChunk is the size class of pulled buffers below MaxChunk: a
// chunk costs about its own size, not a 1 MiB buffer.
const smallChunk = 64 << 10

// getBuf returns a buffer for a pulled chunk of n bytes.
func (s *Server) getBuf(n int) *[]byte {
	pool, size := &s.large, MaxChunk
	switch {
	case n <= 4<<10:
		b := make([]byte, n)
		return &b
	case n <= smallChunk:
		pool, size = &s.small, smallChunk
	}
	if b, ok := pool.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, size)
	return &b
}

// putBuf returns a buffer from getBuf.
func (s *Server) putBuf(b *[]byte) {
	switch cap(*b) {
	case smallChunk:
		s.small.Put(b)
	case MaxChunk:
		s.large.Put(b)
	}
}

// refers reports whether w's reply chunks point into b.
func refers(w *xdr.Writer, b []byte) bool {
	for _, c := range w.Chunks {
		if overlaps(c.Data, b) {
			return true
		}
	}
	return false
}

// Close stops serving and closes every connection.
func (s *Server) Close() error {
	if s.ep == nil {
		return nil
	}
	return s.ep.Close()
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// sconn is a connection's state.
type sconn struct {
	srv    *Server
	c      *fabric.Conn
	ep     *fabric.Endpoint
	remote string
	client string

	mu      sync.Mutex
	pending map[uint32]*pendingReply // replies awaiting DONE, by xid
	closed  bool
	seq     uint64
}

// pendingReply is a reply whose chunks the client may still pull.
type pendingReply struct {
	seq     uint64
	regions []*fabric.Region
	w       *xdr.Writer // its holds pin the chunks' memory
	timer   *time.Timer

	// In the server's list of replies awaiting DONE, oldest first.
	sc    *sconn
	xid   uint32
	bytes int64
	elem  *list.Element
}

// maxPending bounds the replies awaiting DONE per connection: a client
// that never sends DONE pins at most this many replies' memory (then the
// oldest is released early, and a late pull of it fails).
func (sc *sconn) maxPending(s *Server) int { return 2 * cmpOr(s.BufCount, DefaultBufCount) }

func (s *Server) state(c *fabric.Conn) *sconn {
	if sc, ok := c.Local.(*sconn); ok {
		return sc
	}
	sc := &sconn{srv: s, c: c, ep: s.ep, remote: c.RemoteAddr().String(), pending: map[uint32]*pendingReply{}}
	sc.client = sc.remote
	if host, _, err := net.SplitHostPort(sc.remote); err == nil {
		sc.client = host
	}
	c.Local = sc
	return sc
}

// HandlePacket receives one message (fabric.Handler). Calls run on their
// own goroutines; there are at most as many as the connection's receive
// buffers, since each holds its packet until its reply is built.
func (s *Server) HandlePacket(p *fabric.Packet) {
	sc := s.state(p.Conn)
	if !p.First() || !p.Last() {
		// A message larger than a receive buffer must come as a long
		// message; on RDMA it would have overrun the buffer.
		p.Release()
		p.Conn.CloseWithError(fmt.Errorf("%w: a message larger than the %d-byte receive buffer", ErrProtocol, cmpOr(s.BufSize, DefaultBufSize)))
		return
	}
	s.stats.inline.Add(int64(len(p.Data)))
	var h header
	err := parseHeader(p.Data, &h, MaxChunk, 2*MaxChunk)
	if err == nil && h.proc == procDone {
		p.Release()
		sc.release(h.xid, false, &s.stats)
		return
	}
	go s.serve(sc, p, h, err)
}

// Closed releases what the connection's replies held (fabric.Handler).
func (s *Server) Closed(c *fabric.Conn, err error) {
	sc := s.state(c)
	sc.mu.Lock()
	sc.closed = true
	xids := make([]uint32, 0, len(sc.pending))
	for xid := range sc.pending {
		xids = append(xids, xid)
	}
	sc.mu.Unlock()
	for _, xid := range xids {
		sc.release(xid, false, &s.stats)
	}
	s.log.Debug("fabricrpc: connection closed", "remote", sc.remote, "err", err)
}

// serve pulls a call's chunks, runs it and sends the reply.
func (s *Server) serve(sc *sconn, p *fabric.Packet, h header, herr error) {
	// A client that registers chunks and then stops answering READs
	// must not hold this call (its goroutine, its buffers) forever: the
	// pulls have DoneTimeout, and a pull that times out fails the
	// connection.
	ctx, cancel := context.WithTimeout(context.Background(), s.DoneTimeout)
	defer cancel()
	var pulled []*[]byte
	pull := func(r chunkRef) ([]byte, error) {
		bp := s.getBuf(int(r.len))
		pulled = append(pulled, bp)
		dst := (*bp)[:r.len]
		if err := sc.c.Read(ctx, r.key, r.addr, dst); err != nil {
			return nil, err
		}
		s.stats.pulled.Add(int64(r.len))
		return dst, nil
	}

	w := &xdr.Writer{ChunkMin: s.ChunkMin}
	body, refs := h.body, h.refs
	var chunks []xdr.Chunk
	err := herr
	if err == nil && h.long {
		s.stats.long.Add(1)
		body, err = pull(refs[0])
		refs = refs[1:]
		if err == nil && len(refs) > 0 && int(refs[len(refs)-1].pos) > len(body) {
			err = fmt.Errorf("%w: chunk at offset %d past the %d-byte message", ErrProtocol, refs[len(refs)-1].pos, len(body))
		}
	}
	for _, r := range refs {
		if err != nil {
			break
		}
		var d []byte
		if d, err = pull(r); err == nil {
			chunks = append(chunks, xdr.Chunk{Pos: int(r.pos), Data: d})
		}
	}
	ok := false
	switch {
	case err == nil:
		ok = s.RPC.Dispatch(sc.remote, sc.client, body, chunks, w)
		// Likewise reply chunks in the call's receive buffer, which goes
		// back now: copied.
		for i := range w.Chunks {
			if d := w.Chunks[i].Data; overlaps(d, p.Data) {
				w.Chunks[i].Data = bytes.Clone(d)
				s.stats.copied.Add(int64(len(d)))
			}
		}
	case errors.Is(err, ErrProtocol) && len(p.Data) >= 4:
		// The call's xid is known: tell the caller its message was bad.
		s.log.Debug("fabricrpc: bad call", "remote", sc.remote, "xid", h.xid, "err", err)
		oncrpc.AppendAccepted(w, h.xid, oncrpc.GarbageArgs)
		ok = true
	default:
		// A failed pull breaks the connection (a remote access error is
		// fatal to it, as on an RDMA queue pair): nothing to answer on.
		s.log.Debug("fabricrpc: call dropped", "remote", sc.remote, "xid", h.xid, "err", err)
		if errors.Is(err, ErrProtocol) {
			sc.c.CloseWithError(err)
		}
	}
	// Pulled buffers go back now, except those the reply refers to (a
	// handler answering with its arguments' bytes): they go when the
	// reply is released, after DONE for a chunked one.
	var kept []*[]byte
	for _, b := range pulled {
		if refers(w, *b) {
			kept = append(kept, b)
		} else {
			s.putBuf(b)
		}
	}
	if len(kept) > 0 {
		w.Hold(func() {
			for _, b := range kept {
				s.putBuf(b)
			}
		})
	}
	// The call's buffer goes back before the reply leaves, so a client
	// whose credit the reply returns never finds it still taken.
	p.Release()
	if !ok {
		w.Release()
		return
	}
	s.stats.calls.Add(1)
	s.stats.copied.Add(w.Copied)
	if err := s.reply(sc, h.xid, w); err != nil {
		s.log.Debug("fabricrpc: reply not sent", "remote", sc.remote, "xid", h.xid, "err", err)
	}
}

// reply sends w: inline if it fits the client's receive buffer, its
// chunks registered for the client to pull, and the whole message as a
// long message if even the de-chunked message does not fit.
func (s *Server) reply(sc *sconn, xid uint32, w *xdr.Writer) error {
	c := sc.c
	long := headerSize(len(w.Chunks))+len(w.B) > c.MTU()
	if n := len(w.Chunks); n > maxChunks || long && n+1 > maxChunks {
		// More chunks than a message may list: the caller gets an error
		// rather than no reply at all.
		s.log.Error("fabricrpc: reply with too many chunks", "remote", sc.remote, "xid", xid, "chunks", n)
		w.Release()
		w = &xdr.Writer{}
		oncrpc.AppendAccepted(w, xid, oncrpc.SystemErr)
		long = false
	}
	pr := &pendingReply{w: w, sc: sc, xid: xid}
	refs := make([]chunkRef, 0, len(w.Chunks)+1)
	body := w.B
	if long {
		r := s.ep.RegisterFor(c, w.B, fabric.RemoteRead)
		pr.regions = append(pr.regions, r)
		refs = append(refs, chunkRef{pos: 0, len: uint32(len(w.B)), key: r.Key()})
		body = nil
		s.stats.long.Add(1)
	}
	for _, ch := range w.Chunks {
		r := s.ep.RegisterFor(c, ch.Data, fabric.RemoteRead)
		pr.regions = append(pr.regions, r)
		refs = append(refs, chunkRef{pos: uint32(ch.Pos), len: uint32(len(ch.Data)), key: r.Key()})
	}
	head := appendHeader(make([]byte, 0, headerSize(len(refs))), xid, refs)
	for _, r := range pr.regions {
		pr.bytes += int64(r.Len())
	}
	if len(refs) > 0 && !sc.hold(s, xid, pr) {
		pr.release(s.ep)
		return fabric.ErrClosed
	}
	if len(refs) > 0 && s.revokeNext.CompareAndSwap(true, false) {
		sc.release(xid, true, &s.stats)
	}
	s.stats.inline.Add(int64(len(head) + len(body)))
	err := c.SendPacket(uint64(xid), head, body)
	if len(refs) == 0 {
		pr.release(s.ep)
	} else if err != nil {
		sc.release(xid, false, &s.stats)
	}
	return err
}

// hold records pr until DONE or the timeout; false if the connection is
// gone.
func (sc *sconn) hold(s *Server, xid uint32, pr *pendingReply) bool {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return false
	}
	sc.seq++
	pr.seq = sc.seq
	// Set under the lock: whoever takes pr from pending (DONE, eviction,
	// the close) stops it.
	pr.timer = time.AfterFunc(s.DoneTimeout, func() { sc.releaseIf(xid, pr, &s.stats, s.ep) })
	old := sc.pending[xid] // a retransmission: its earlier reply's DONE is not coming
	sc.pending[xid] = pr
	var oldest uint32
	evict := false
	if len(sc.pending) > sc.maxPending(s) {
		first := true
		for x, q := range sc.pending {
			if first || q.seq < sc.pending[oldest].seq {
				oldest, first = x, false
			}
		}
		evict = true
	}
	// Listed while it is in pending, so whoever releases it unlists it.
	victims := s.listPending(pr)
	sc.mu.Unlock()
	if old != nil {
		old.timer.Stop()
		old.release(s.ep)
	}
	if evict {
		sc.release(oldest, true, &s.stats)
	}
	for _, q := range victims {
		q.sc.releaseIf(q.xid, q, &s.stats, s.ep)
	}
	return true
}

// listPending adds pr to the server's list and returns the oldest
// replies (on any connection) to release early while over
// MaxPendingBytes. The caller holds pr's connection's lock.
func (s *Server) listPending(pr *pendingReply) []*pendingReply {
	limit := s.MaxPendingBytes
	if limit <= 0 {
		limit = DefaultMaxPendingBytes
	}
	var victims []*pendingReply
	s.pmu.Lock()
	defer s.pmu.Unlock()
	pr.elem = s.plist.PushBack(pr)
	s.pbytes += pr.bytes
	over := s.pbytes - limit
	for e := s.plist.Front(); over > 0 && e != nil && e.Value != pr; e = e.Next() {
		q := e.Value.(*pendingReply)
		victims = append(victims, q)
		over -= q.bytes
	}
	s.pendingN.Store(s.pbytes)
	return victims
}

// unlistPending takes pr off the server's list (once it is released).
func (s *Server) unlistPending(pr *pendingReply) {
	s.pmu.Lock()
	if pr.elem != nil {
		s.plist.Remove(pr.elem)
		s.pbytes -= pr.bytes
		pr.elem = nil
	}
	s.pendingN.Store(s.pbytes)
	s.pmu.Unlock()
}

// release frees the reply awaiting DONE under xid, if any.
func (sc *sconn) release(xid uint32, early bool, st *counters) {
	sc.mu.Lock()
	pr := sc.pending[xid]
	delete(sc.pending, xid)
	sc.mu.Unlock()
	if pr == nil {
		return
	}
	if early {
		st.timeouts.Add(1)
	}
	if pr.timer != nil {
		pr.timer.Stop()
	}
	pr.release(sc.ep)
}

// releaseIf frees pr at its timeout unless DONE came first.
func (sc *sconn) releaseIf(xid uint32, pr *pendingReply, st *counters, ep *fabric.Endpoint) {
	sc.mu.Lock()
	if sc.pending[xid] != pr {
		sc.mu.Unlock()
		return
	}
	delete(sc.pending, xid)
	sc.mu.Unlock()
	pr.timer.Stop()
	st.timeouts.Add(1)
	pr.release(ep)
}

// release revokes the reply's keys at once and releases what it holds
// (unpins cache blocks, returns buffers) once no READ of the client's is
// still being answered from that memory: a client that sends DONE while
// its own pull streams must not see the memory reused under it. It does
// not wait (it runs on the connection's reader for DONE).
func (pr *pendingReply) release(ep *fabric.Endpoint) {
	if pr.sc != nil {
		pr.sc.srv.unlistPending(pr)
	}
	regions, w := pr.regions, pr.w
	pr.regions = nil
	if len(regions) == 0 {
		w.Release()
		return
	}
	var left atomic.Int32
	left.Store(int32(len(regions)))
	for _, r := range regions {
		ep.Release(r, func() {
			if left.Add(-1) == 0 {
				w.Release()
			}
		})
	}
}

// overlaps reports whether a and b share memory (b up to its capacity).
func overlaps(a, b []byte) bool {
	if len(a) == 0 || cap(b) == 0 {
		return false
	}
	pa := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	pb := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(cap(b)) && pb < pa+uintptr(len(a))
}
