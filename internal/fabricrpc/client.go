package fabricrpc

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// BufSize and BufCount are the client's receive buffers (for replies);
	// defaults DefaultBufSize and DefaultBufCount.
	BufSize, BufCount int
	// ChunkMin is the smallest call datum sent as a chunk; default
	// DefaultChunkMin.
	ChunkMin int
	// Dial, if set, opens the connection's TCP stream (from a reserved
	// source port, say: oncrpc.DialTCP); default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Client makes RPC calls over a fabric connection, as many in flight as
// the server posted receive buffers for (less one, kept for DONE). When
// the connection breaks under a call whose reply had come (its chunks
// could not be pulled: a DONE timeout at the server, say), it connects
// again and retransmits the call once, with the same xid, as seed 001's
// client does; the server's duplicate-request cache answers a
// non-idempotent call that already ran.
type Client struct {
	ep       *fabric.Endpoint
	addr     string
	opts     ClientOptions
	chunkMin int
	stats    counters

	dialMu sync.Mutex // one redial at a time
	mu     sync.Mutex
	cur    *cconn
	// pending are the calls awaiting replies, by xid (xids are unique
	// across the client's connections).
	pending map[uint32]chan creply
	next    uint32
	closed  bool
}

// cconn is one connection and its credits.
type cconn struct {
	c       *fabric.Conn
	credits chan struct{}
}

// creply is a reply's transport header and a copy of its inline part.
type creply struct {
	h   header
	buf []byte
}

// Dial connects to a fabricrpc server.
func Dial(ctx context.Context, addr string, opts ClientOptions) (*Client, error) {
	ep, err := fabric.NewEndpoint(fabric.Options{MTU: cmpOr(opts.BufSize, DefaultBufSize), Quota: cmpOr(opts.BufCount, DefaultBufCount), Dial: opts.Dial})
	if err != nil {
		return nil, fmt.Errorf("fabricrpc: %w", err)
	}
	c := &Client{ep: ep, addr: addr, opts: opts, chunkMin: cmpOr(opts.ChunkMin, DefaultChunkMin), pending: map[uint32]chan creply{}, next: rand.Uint32()}
	if _, err := c.conn(ctx, nil); err != nil {
		ep.Close()
		return nil, err
	}
	return c, nil
}

// conn returns the current connection, connecting again if it is broken
// (or is the broken one the caller names).
func (c *Client) conn(ctx context.Context, broken *cconn) (*cconn, error) {
	c.mu.Lock()
	cc, closed := c.cur, c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("fabricrpc: %w", fabric.ErrClosed)
	}
	if cc != nil && cc != broken && cc.c.Err() == nil && !cc.c.Stale() {
		return cc, nil
	}
	c.dialMu.Lock()
	defer c.dialMu.Unlock()
	c.mu.Lock()
	cc = c.cur
	c.mu.Unlock()
	if cc != nil && cc != broken && cc.c.Err() == nil && !cc.c.Stale() {
		return cc, nil // another caller reconnected
	}
	conn, err := c.ep.Dial(ctx, c.addr, c)
	if err != nil {
		return nil, fmt.Errorf("fabricrpc: %w", err)
	}
	// Credits: the server's buffers less one for DONE, and no more than
	// our own buffers less one, so neither side's SENDs ever wait.
	n := max(1, min(conn.PeerQuota(), cmpOr(c.opts.BufCount, DefaultBufCount))-1)
	cc = &cconn{c: conn, credits: make(chan struct{}, n)}
	c.mu.Lock()
	c.cur = cc
	c.mu.Unlock()
	return cc, nil
}

// Credits is how many calls may be outstanding at once.
func (c *Client) Credits() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return cap(c.cur.credits)
}

// ChunkMin is the size from which call data goes as a chunk: callers
// building arguments set it on their xdr.Writer.
func (c *Client) ChunkMin() int { return c.chunkMin }

// Stats returns the client's counters.
func (c *Client) Stats() Stats { return c.stats.snapshot() }

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return c.ep.Close()
}

// HandlePacket takes a reply to whoever waits for it (fabric.Handler). Its
// inline part is copied out (it is at most a receive buffer) so the buffer
// is reposted at once.
func (c *Client) HandlePacket(p *fabric.Packet) {
	defer p.Release()
	if !p.First() || !p.Last() {
		p.Conn.CloseWithError(fmt.Errorf("%w: a reply larger than a receive buffer", ErrProtocol))
		return
	}
	c.stats.inline.Add(int64(len(p.Data)))
	var r creply
	if err := parseHeader(p.Data, &r.h, MaxChunk, 2*MaxChunk); err != nil || r.h.proc != procMsg {
		if err == nil {
			err = fmt.Errorf("%w: DONE from the server", ErrProtocol)
		}
		p.Conn.CloseWithError(fmt.Errorf("fabricrpc: bad reply: %w", err))
		return
	}
	c.mu.Lock()
	ch := c.pending[r.h.xid]
	delete(c.pending, r.h.xid)
	c.mu.Unlock()
	if ch == nil {
		return // a call that gave up
	}
	r.buf = append([]byte(nil), r.h.body...)
	r.h.refs = append([]chunkRef(nil), r.h.refs...)
	c.stats.copied.Add(int64(len(r.buf)))
	ch <- r
}

// Closed fails nothing by itself: waiting calls see the connection's
// Done (fabric.Handler).
func (c *Client) Closed(*fabric.Conn, error) {}

// Call sends a call to prog/vers/proc with arguments args, whose opaque
// data of at least ChunkMin bytes the writer left in args.Chunks (they go
// as chunks the server pulls; they must stay untouched until Call
// returns). The reply's results are returned as a reader; a chunk in the
// reply (READ data) is pulled straight into dst when it fits there, else
// into a new buffer. Errors are as oncrpc.Client's.
func (c *Client) Call(ctx context.Context, prog, vers, proc uint32, cred *oncrpc.AuthSysCred, args *xdr.Writer, dst []byte) (*xdr.Reader, error) {
	c.mu.Lock()
	xid := c.next
	for c.pending[xid] != nil {
		xid++
	}
	c.next = xid + 1
	c.mu.Unlock()
	var broken *cconn
	for attempt := 0; ; attempt++ {
		cc, err := c.conn(ctx, broken)
		if err != nil {
			return nil, err
		}
		r, err, again := c.callOn(ctx, cc, xid, prog, vers, proc, cred, args, dst)
		if !again || attempt > 0 || ctx.Err() != nil {
			return r, err
		}
		c.stats.retransmits.Add(1)
		broken = cc
	}
}

// callOn makes one attempt of a call on cc; again reports a broken
// connection after which the call may be sent again (it was not sent, or
// its reply came but could not be pulled).
func (c *Client) callOn(ctx context.Context, cc *cconn, xid, prog, vers, proc uint32, cred *oncrpc.AuthSysCred, args *xdr.Writer, dst []byte) (_ *xdr.Reader, _ error, again bool) {
	select {
	case cc.credits <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err(), false
	case <-cc.c.Done():
		return nil, fmt.Errorf("fabricrpc: %w", cc.c.Err()), true
	}
	rc := make(chan creply, 1)
	c.mu.Lock()
	c.pending[xid] = rc
	c.mu.Unlock()
	abandoned := false
	defer func() {
		if !abandoned {
			c.settle(cc, xid, rc)
		}
	}()

	hw := xdr.Writer{B: make([]byte, 0, 128)}
	oncrpc.AppendCall(&hw, xid, prog, vers, proc, cred)
	shift := len(hw.B)
	var regions []*fabric.Region
	defer func() {
		// The reply says the server pulled what it needed; a call given
		// up on revokes its chunks, and a late pull fails the connection
		// rather than read memory the caller reuses.
		for _, r := range regions {
			c.ep.Deregister(r)
		}
	}()
	refs := make([]chunkRef, 0, len(args.Chunks)+1)
	body := [][]byte{hw.B, args.B}
	if headerSize(len(args.Chunks))+len(hw.B)+len(args.B) > cc.c.MTU() {
		whole := append(hw.B, args.B...)
		c.stats.copied.Add(int64(len(args.B)))
		r := c.ep.RegisterFor(cc.c, whole, fabric.RemoteRead)
		regions = append(regions, r)
		refs = append(refs, chunkRef{len: uint32(len(whole)), key: r.Key()})
		body = nil
		c.stats.long.Add(1)
	}
	for _, ch := range args.Chunks {
		r := c.ep.RegisterFor(cc.c, ch.Data, fabric.RemoteRead)
		regions = append(regions, r)
		refs = append(refs, chunkRef{pos: uint32(shift + ch.Pos), len: uint32(len(ch.Data)), key: r.Key()})
	}
	if len(refs) > maxChunks {
		return nil, fmt.Errorf("fabricrpc: a call with %d chunks", len(refs)), false
	}
	head := appendHeader(make([]byte, 0, headerSize(len(refs))+shift), xid, refs)
	var err error
	if body == nil {
		err = cc.c.SendPacket(uint64(xid), head, nil)
		c.stats.inline.Add(int64(len(head)))
	} else {
		// The RPC header joins the transport header; the arguments are
		// sent from where they are.
		head = append(head, hw.B...)
		err = cc.c.SendPacket(uint64(xid), head, args.B)
		c.stats.inline.Add(int64(len(head) + len(args.B)))
	}
	if err != nil {
		return nil, fmt.Errorf("fabricrpc: sending a call: %w", err), cc.c.Err() != nil
	}
	c.stats.calls.Add(1)

	var r creply
	select {
	case r = <-rc:
	case <-ctx.Done():
		// The server still holds the call's receive buffer: the credit
		// stays taken until its reply comes, and the reply's chunks are
		// released with DONE without being pulled.
		abandoned = true
		go c.abandon(cc, xid, rc)
		return nil, ctx.Err(), false
	case <-cc.c.Done():
		select {
		case r = <-rc:
		default:
			// Whether the server ran the call is unknown: not sent again.
			return nil, fmt.Errorf("fabricrpc: %w", cc.c.Err()), false
		}
	}
	res, err := c.receive(ctx, cc, r, dst)
	return res, err, err != nil && cc.c.Err() != nil && ctx.Err() == nil
}

// settle ends a call: it forgets xid and gives the credit back.
func (c *Client) settle(cc *cconn, xid uint32, rc chan creply) {
	c.mu.Lock()
	if c.pending[xid] == rc {
		delete(c.pending, xid)
	}
	c.mu.Unlock()
	<-cc.credits
}

// abandon waits for the reply of a call given up on, sends DONE for its
// chunks, and settles the call.
func (c *Client) abandon(cc *cconn, xid uint32, rc chan creply) {
	select {
	case r := <-rc:
		if len(r.h.refs) > 0 && cc.c.Err() == nil {
			cc.c.SendLater(uint64(xid), doneMsg(xid))
		}
	case <-cc.c.Done():
	}
	c.settle(cc, xid, rc)
}

// receive pulls a reply's chunks, sends DONE, and decodes the RPC reply
// header.
func (c *Client) receive(ctx context.Context, cc *cconn, r creply, dst []byte) (*xdr.Reader, error) {
	msg, refs := r.buf, r.h.refs
	var err error
	pull := func(ref chunkRef, into []byte) ([]byte, error) {
		if into == nil || int(ref.len) > len(into) {
			into = make([]byte, ref.len)
		}
		into = into[:ref.len]
		if err := cc.c.Read(ctx, ref.key, ref.addr, into); err != nil {
			return nil, fmt.Errorf("fabricrpc: pulling a reply chunk: %w", err)
		}
		c.stats.pulled.Add(int64(ref.len))
		return into, nil
	}
	if r.h.long {
		c.stats.long.Add(1)
		msg, err = pull(refs[0], nil)
		refs = refs[1:]
		if err == nil && len(refs) > 0 && int(refs[len(refs)-1].pos) > len(msg) {
			err = fmt.Errorf("%w: reply chunk at offset %d past the %d-byte message", ErrProtocol, refs[len(refs)-1].pos, len(msg))
		}
	}
	chunks := make([]xdr.Chunk, 0, len(refs))
	for i, ref := range refs {
		if err != nil {
			break
		}
		var into []byte
		if i == 0 {
			into = dst
		}
		var d []byte
		if d, err = pull(ref, into); err == nil {
			chunks = append(chunks, xdr.Chunk{Pos: int(ref.pos), Data: d})
		}
	}
	if len(r.h.refs) > 0 && cc.c.Err() == nil {
		// Without waiting for an answer: the server frees the reply's
		// memory. Queued before the call's credit is returned, to go
		// with the next send (or within milliseconds), so the server
		// sees it ahead of any call the credit lets through and its
		// replies awaiting DONE stay within the credits (a DONE behind
		// later calls could find its reply evicted); riding along
		// spares each call a system call.
		cc.c.SendLater(uint64(r.h.xid), doneMsg(r.h.xid))
		c.stats.inline.Add(fixedHeader)
	}
	if err != nil {
		return nil, err
	}
	rd := xdr.NewReader(msg)
	rd.SetChunks(chunks)
	if err := oncrpc.ReadReply(rd); err != nil {
		return nil, err
	}
	return rd, nil
}
