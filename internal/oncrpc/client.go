package oncrpc

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"

	"github.com/sluicefs/sluice/internal/xdr"
)

// clientMaxRecord bounds a reply: an NFS READ or READDIR of a few MiB
// fits, and a server's hostile length claim costs only what it sends.
const clientMaxRecord = 16 << 20

var errClientClosed = fmt.Errorf("oncrpc: client closed: %w", net.ErrClosed)

// Client makes calls over one connection, many in flight at once, each
// reply matched to its call by xid.
type Client struct {
	nc  net.Conn
	wmu sync.Mutex // whole records, one at a time

	mu      sync.Mutex
	pending map[uint32]chan []byte // by xid; buffered so the reader never waits
	next    uint32
	err     error         // why the connection is unusable; set once
	done    chan struct{} // closed when err is set

	stats counters
}

// Stats returns the client's counters.
func (c *Client) Stats() Stats { return c.stats.snapshot() }

// Dial connects over TCP.
func Dial(ctx context.Context, addr string) (*Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("oncrpc: %w", err)
	}
	return NewClient(nc), nil
}

// NewClient runs over an established connection, which it then owns.
func NewClient(nc net.Conn) *Client {
	c := &Client{
		nc:      nc,
		pending: make(map[uint32]chan []byte),
		// A random first xid keeps a restarted client from matching the
		// server's cached replies of its previous life.
		next: rand.Uint32(),
		done: make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// readLoop delivers each reply to its waiting call until the connection
// breaks, then fails every call.
func (c *Client) readLoop() {
	br := bufio.NewReaderSize(c.nc, 64<<10)
	for {
		// A fresh buffer per reply (the results returned alias it), sized
		// by the first fragment's length so a large READ reply is not
		// copied as the buffer grows; a length claim beyond the bound is
		// left for ReadRecord to refuse.
		var buf []byte
		if hdr, err := br.Peek(4); err == nil {
			if n := int(binary.BigEndian.Uint32(hdr) &^ lastFragment); n <= clientMaxRecord {
				buf = make([]byte, 0, n)
			}
		}
		rec, err := ReadRecord(countingReader{br, &c.stats}, buf, clientMaxRecord)
		if err != nil {
			c.fail(fmt.Errorf("oncrpc: connection to %s: %w", c.nc.RemoteAddr(), err))
			c.nc.Close()
			return
		}
		if len(rec) < 4 {
			continue // no xid: nobody to give it to
		}
		xid := binary.BigEndian.Uint32(rec)
		c.mu.Lock()
		ch := c.pending[xid]
		delete(c.pending, xid)
		c.mu.Unlock()
		if ch != nil { // else a call that gave up, or a stray reply
			ch <- rec
		}
	}
}

// fail makes the connection unusable with err, once.
func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

// Call sends one call and waits for its reply. args is the encoded
// arguments; cred nil means AUTH_NONE. On an accepted Success it returns
// the result bytes (after the reply header; the slice belongs to the
// caller). Errors: *AcceptError for other accept states, *RejectError for
// denied replies, and the connection's error (wrapped) if it breaks.
// ctx bounds the wait for the reply, not the sending of the call.
func (c *Client) Call(ctx context.Context, prog, vers, proc uint32, cred *AuthSysCred, args []byte) ([]byte, error) {
	if cred != nil && (len(cred.Machine) > maxMachineName || len(cred.GIDs) > maxGIDs) {
		return nil, fmt.Errorf("oncrpc: AUTH_SYS credential with a %d-byte machine name and %d gids (at most %d and %d)",
			len(cred.Machine), len(cred.GIDs), maxMachineName, maxGIDs)
	}
	if err := ctx.Err(); err != nil {
		return nil, err // not worth sending
	}
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	xid := c.next
	for c.pending[xid] != nil { // a call stuck for 2^32 calls
		xid++
	}
	c.next = xid + 1
	c.pending[xid] = ch
	c.mu.Unlock()

	w := xdr.Writer{B: make([]byte, 4, 128)} // room for the record mark
	AppendCall(&w, xid, prog, vers, proc, cred)
	if err := c.send(w.B, args); err != nil {
		c.forget(xid)
		return nil, err
	}
	select {
	case rec := <-ch:
		return parseReply(rec)
	case <-ctx.Done():
		c.forget(xid)
		return nil, ctx.Err()
	case <-c.done:
		select { // the reply may have come just before the break
		case rec := <-ch:
			return parseReply(rec)
		default:
		}
		return nil, c.err
	}
}

func (c *Client) forget(xid uint32) {
	c.mu.Lock()
	delete(c.pending, xid)
	c.mu.Unlock()
}

// send writes hdr (with four bytes reserved for the record mark) and args
// as one record without copying args.
func (c *Client) send(hdr, args []byte) error {
	n := len(hdr) - 4 + len(args)
	if n > maxFragment {
		return fmt.Errorf("%w: %d bytes of call", ErrRecordTooLarge, n)
	}
	binary.BigEndian.PutUint32(hdr, lastFragment|uint32(n))
	bufs := net.Buffers{hdr}
	if len(args) > 0 { // some conns (net.Pipe) block on an empty write
		bufs = append(bufs, args)
	}
	c.wmu.Lock()
	_, err := bufs.WriteTo(c.nc)
	c.wmu.Unlock()
	c.stats.calls.Add(1)
	c.stats.out.Add(int64(n + 4))
	if err != nil {
		// Part of a record may be out: the stream is lost.
		err = fmt.Errorf("oncrpc: connection to %s: %w", c.nc.RemoteAddr(), err)
		c.fail(err)
		c.nc.Close()
	}
	return err
}

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error {
	c.fail(errClientClosed)
	return c.nc.Close()
}
