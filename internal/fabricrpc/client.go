package fabricrpc

import (
	"context"
	"fmt"
	"math/rand/v2"
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
}

// Client makes RPC calls over one fabric connection, as many in flight as
// the server posted receive buffers for (less one, kept for DONE).
type Client struct {
	ep       *fabric.Endpoint
	conn     *fabric.Conn
	chunkMin int
	credits  chan struct{}
	stats    counters

	mu      sync.Mutex
	pending map[uint32]chan creply
	next    uint32
}

// creply is a reply's transport header and a copy of its inline part.
type creply struct {
	h   header
	buf []byte
}

// Dial connects to a fabricrpc server.
func Dial(ctx context.Context, addr string, opts ClientOptions) (*Client, error) {
	ep, err := fabric.NewEndpoint(fabric.Options{MTU: cmpOr(opts.BufSize, DefaultBufSize), Quota: cmpOr(opts.BufCount, DefaultBufCount)})
	if err != nil {
		return nil, fmt.Errorf("fabricrpc: %w", err)
	}
	c := &Client{ep: ep, chunkMin: cmpOr(opts.ChunkMin, DefaultChunkMin), pending: map[uint32]chan creply{}, next: rand.Uint32()}
	conn, err := ep.Dial(ctx, addr, c)
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("fabricrpc: %w", err)
	}
	c.conn = conn
	// Credits: the server's buffers less one for DONE, and no more than
	// our own buffers less one, so neither side's SENDs ever wait.
	n := max(1, min(conn.PeerQuota(), cmpOr(opts.BufCount, DefaultBufCount))-1)
	c.credits = make(chan struct{}, n)
	return c, nil
}

// Credits is how many calls may be outstanding at once.
func (c *Client) Credits() int { return cap(c.credits) }

// ChunkMin is the size from which call data goes as a chunk: callers
// building arguments set it on their xdr.Writer.
func (c *Client) ChunkMin() int { return c.chunkMin }

// Stats returns the client's counters.
func (c *Client) Stats() Stats { return c.stats.snapshot() }

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error { return c.ep.Close() }

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
	select {
	case c.credits <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.conn.Done():
		return nil, c.conn.Err()
	}
	defer func() { <-c.credits }()
	ch := make(chan creply, 1)
	c.mu.Lock()
	xid := c.next
	for c.pending[xid] != nil {
		xid++
	}
	c.next = xid + 1
	c.pending[xid] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, xid)
		c.mu.Unlock()
	}

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
	if headerSize(len(args.Chunks))+len(hw.B)+len(args.B) > c.conn.MTU() {
		whole := append(hw.B, args.B...)
		c.stats.copied.Add(int64(len(args.B)))
		r := c.ep.Register(whole, fabric.RemoteRead)
		regions = append(regions, r)
		refs = append(refs, chunkRef{len: uint32(len(whole)), key: r.Key()})
		body = nil
		c.stats.long.Add(1)
	}
	for _, ch := range args.Chunks {
		r := c.ep.Register(ch.Data, fabric.RemoteRead)
		regions = append(regions, r)
		refs = append(refs, chunkRef{pos: uint32(shift + ch.Pos), len: uint32(len(ch.Data)), key: r.Key()})
	}
	if len(refs) > maxChunks {
		forget()
		return nil, fmt.Errorf("fabricrpc: a call with %d chunks", len(refs))
	}
	head := appendHeader(make([]byte, 0, headerSize(len(refs))+shift), xid, refs)
	var err error
	if body == nil {
		err = c.conn.SendPacket(uint64(xid), head, nil)
		c.stats.inline.Add(int64(len(head)))
	} else {
		// The RPC header joins the transport header; the arguments are
		// sent from where they are.
		head = append(head, hw.B...)
		err = c.conn.SendPacket(uint64(xid), head, args.B)
		c.stats.inline.Add(int64(len(head) + len(args.B)))
	}
	if err != nil {
		forget()
		return nil, fmt.Errorf("fabricrpc: sending a call: %w", err)
	}
	c.stats.calls.Add(1)

	var r creply
	select {
	case r = <-ch:
	case <-ctx.Done():
		forget()
		return nil, ctx.Err()
	case <-c.conn.Done():
		select {
		case r = <-ch:
		default:
			return nil, fmt.Errorf("fabricrpc: %w", c.conn.Err())
		}
	}
	return c.receive(ctx, r, dst)
}

// receive pulls a reply's chunks, sends DONE, and decodes the RPC reply
// header.
func (c *Client) receive(ctx context.Context, r creply, dst []byte) (*xdr.Reader, error) {
	msg, refs := r.buf, r.h.refs
	var err error
	pull := func(ref chunkRef, into []byte) ([]byte, error) {
		if into == nil || int(ref.len) > len(into) {
			into = make([]byte, ref.len)
		}
		into = into[:ref.len]
		if err := c.conn.Read(ctx, ref.key, ref.addr, into); err != nil {
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
	if len(r.h.refs) > 0 && c.conn.Err() == nil {
		// Without waiting for an answer: the server frees the reply's
		// memory. Queued before the call's credit is returned, to go
		// with the next send (or within milliseconds), so the server
		// sees it ahead of any call the credit lets through and its
		// replies awaiting DONE stay within the credits (a DONE behind
		// later calls could find its reply evicted); riding along
		// spares each call a system call.
		c.conn.SendLater(uint64(r.h.xid), doneMsg(r.h.xid))
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
