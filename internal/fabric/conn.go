package fabric

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Handler receives the two-sided messages arriving on a connection.
// Both methods run on the connection's reader goroutine, in arrival order:
// HandlePacket must not block for long (blocking it stalls only this
// connection) and must Release every packet it is given.
type Handler interface {
	HandlePacket(p *Packet)
	// Closed is called once, after the last HandlePacket, when the
	// connection ends; err says why (io.EOF for a clean close by the peer).
	Closed(c *Conn, err error)
}

// Placer is implemented by Handlers that can receive a data packet's
// payload straight into its final location (direct placement) instead of
// a receive buffer. The reader goroutine calls PlaceBegin with the
// packet's message id, offset within the message data and length before
// reading its payload; a non-nil result (exactly n bytes) is filled from
// the socket, then PlaceEnd is called, then HandlePacket gets a packet
// whose Data is that slice. Both run on the reader goroutine and must not
// block.
type Placer interface {
	PlaceBegin(c *Conn, id uint64, off int64, n int) []byte
	PlaceEnd(c *Conn)
}

// ErrClosed is returned by operations on a closed connection.
var ErrClosed = errors.New("fabric: connection closed")

// AccessError is a one-sided operation refused by the target.
type AccessError struct{ Reason string }

func (e *AccessError) Error() string { return "fabric: remote access error: " + e.Reason }

// maxBatch bounds the packets sent by one writev.
const maxBatch = 64

// Conn is one connection (a queue pair). Sends are serialised: a message's
// packets are written contiguously. It is safe for concurrent use.
type Conn struct {
	ep      *Endpoint
	nc      net.Conn
	br      *bufio.Reader
	handler Handler
	placer  Placer // the handler, if it places directly
	quota   *quota
	sendMTU int // the peer's receive MTU, capped by ours
	recvMTU int

	sendMu   sync.Mutex
	hdrs     []byte   // header scratch for one batch, under sendMu
	pre      []byte   // one-sided prefix scratch for one batch, under sendMu
	iov      [][]byte // iovec scratch, under sendMu
	deadline time.Time
	lazy     []byte // packets (headers included) to go with the next send, under sendMu
	lazyDue  bool   // a timer will flush lazy, under sendMu

	nextID atomic.Uint64

	opsMu sync.Mutex
	ops   map[uint64]*op // one-sided operations we initiated

	ctrl chan ctrlMsg // small sends on behalf of the reader goroutine

	readSem   chan struct{} // bounds remote READs served concurrently
	readSlots chan struct{} // bounds our READs outstanding at the peer (its readSem)
	peerQuota int           // receive buffers the peer announced
	inHost    string        // the peer's IP for an inbound connection under MaxConnsPerHost

	wire *wire // emulated link delivery, if the endpoint has a Link

	// busySince is the coarse time a packet began arriving, 0 between
	// packets: the endpoint's watchdog closes connections stalled mid-packet.
	busySince atomic.Int64

	// Reader-goroutine state for the message being received, and its
	// timer for emulated ingress (made on first need).
	inTimer *wireTimer
	inMsg   bool
	inID    uint64
	inOff   int64

	// Local is for the Handler's per-connection state. Only the reader
	// goroutine (HandlePacket, Closed) may touch it.
	Local any

	closeOnce  sync.Once
	done       chan struct{}
	readerDone chan struct{}
	err        error
}

type op struct {
	dst  []byte // READ destination
	got  int
	done chan error
}

type ctrlMsg struct {
	kind  Kind
	flags uint8
	id    uint64
	data  []byte
	flush chan struct{} // if set: a marker, closed once everything before it is sent
}

// flushCtrl waits (at most d) until the small sends queued so far are out.
func (c *Conn) flushCtrl(d time.Duration) {
	done := make(chan struct{})
	select {
	case c.ctrl <- ctrlMsg{flush: done}:
	default:
		return
	}
	select {
	case <-done:
	case <-c.done:
	case <-time.After(d):
	}
}

// MaxReads is how many one-sided READs a connection serves at once (an
// RDMA queue pair's responder resources). Read waits for a slot rather
// than exceed it at the peer, where it would be a fatal access error.
const MaxReads = 8

func newConn(ep *Endpoint, nc net.Conn, h Handler, peerMTU, peerQuota int, inHost string) *Conn {
	o := ep.opts
	c := &Conn{
		ep:         ep,
		nc:         nc,
		br:         bufio.NewReaderSize(nc, 8<<10),
		handler:    h,
		quota:      newQuota(o.Quota, o.MTU),
		sendMTU:    min(peerMTU, o.MTU),
		recvMTU:    o.MTU,
		hdrs:       make([]byte, HeaderSize*maxBatch),
		pre:        make([]byte, oneSidedPrefix*maxBatch),
		iov:        make([][]byte, 0, 3*maxBatch),
		ops:        make(map[uint64]*op),
		ctrl:       make(chan ctrlMsg, 64),
		readSem:    make(chan struct{}, MaxReads),
		readSlots:  make(chan struct{}, MaxReads),
		peerQuota:  peerQuota,
		inHost:     inHost,
		done:       make(chan struct{}),
		readerDone: make(chan struct{}),
	}
	c.placer, _ = h.(Placer)
	if o.Link != nil {
		c.wire = &wire{}
		c.wire.cond.L = &c.wire.mu
		go c.runWire()
	}
	go c.readLoop()
	go c.ctrlLoop()
	return c
}

// NewID returns a message or operation id unique on this connection.
func (c *Conn) NewID() uint64 { return c.nextID.Add(1) }

// MTU is the largest packet payload this connection sends.
func (c *Conn) MTU() int { return c.sendMTU }

// PeerQuota is the number of receive buffers (each of MTU bytes) the peer
// posted for this connection, from its hello: an upper layer keeps the
// messages it has outstanding at the peer within it, as credits.
func (c *Conn) PeerQuota() int { return c.peerQuota }

// RemoteAddr is the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Done is closed when the connection has failed or been closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it is open).
func (c *Conn) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Close closes the connection. Pending operations fail with ErrClosed.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	return nil
}

// CloseWithError closes the connection, recording why; handlers see the
// reason in Closed.
func (c *Conn) CloseWithError(err error) { c.fail(err) }

// Wait blocks until the reader goroutine has exited (after Close or a
// failure), so no handler or READ placement runs any more.
func (c *Conn) Wait() { <-c.readerDone }

func (c *Conn) fail(err error) {
	c.closeOnce.Do(func() {
		if err == nil {
			err = ErrClosed
		}
		c.err = err
		close(c.done)
		c.nc.Close()
		c.quota.close()
		if c.wire != nil {
			c.wire.close()
		}
		c.opsMu.Lock()
		for id, o := range c.ops {
			delete(c.ops, id)
			o.done <- fmt.Errorf("%w: %v", ErrClosed, err)
		}
		c.opsMu.Unlock()
		c.ep.forget(c)
	})
}

// ---- receiving ----

func (c *Conn) readLoop() {
	var err error
	defer func() {
		if errors.Is(err, io.EOF) {
			// The peer finished sending; let replies already queued for
			// it (refusals, say) leave before the connection closes.
			c.flushCtrl(time.Second)
		}
		if c.wire != nil {
			// Likewise what an emulated link still holds (an access
			// error notice, say).
			c.wire.drain(time.Second)
		}
		c.fail(err)
		reason := c.err // the first cause, e.g. a CloseWithError reason
		if c.inMsg {
			reason = fmt.Errorf("connection ended mid-message %d: %w", c.inID, reason)
		}
		c.handler.Closed(c, reason)
		close(c.readerDone)
		c.ep.readers.Done()
	}()
	var hb [HeaderSize]byte
	defer func() {
		if c.inTimer != nil {
			c.inTimer.close()
		}
	}()
	for {
		// Idle between packets is normal (pooled connections wait for
		// minutes); once a packet has begun, the peer must finish it
		// within the stall timeout (see Endpoint.watch).
		if _, err = c.br.Peek(1); err != nil {
			return
		}
		c.busySince.Store(c.ep.clock.Load())
		if _, err = io.ReadFull(c.br, hb[:]); err != nil {
			return
		}
		var h header
		if h, err = parseHeader(hb[:], c.recvMTU); err != nil {
			return
		}
		if l := c.ep.opts.Link; l != nil {
			// The header's arrival stands for the packet's: an emulated
			// sender writes a packet whole when its transmission ends.
			if err = c.ingress(l, h); err != nil {
				return
			}
		}
		switch h.kind {
		case KindSend:
			err = c.recvSend(h)
		case KindWrite:
			err = c.recvWrite(h)
		case KindReadReq:
			err = c.recvReadReq(h)
		case KindReadResp:
			err = c.recvReadResp(h)
		case KindAck, KindAccessErr:
			err = c.recvCompletion(h)
		}
		c.busySince.Store(0)
		if err != nil {
			return
		}
	}
}

// ingress holds a packet until the emulated link's ingress would have
// delivered it, so that receivers with many senders are bandwidth-bound
// as on a real NIC. The reader sleeps, and TCP holds the sender back.
func (c *Conn) ingress(l *Link, h header) error {
	due := l.receive(HeaderSize+int(h.length), time.Now())
	if time.Until(due) <= wakeLatency {
		return nil
	}
	if c.inTimer == nil {
		t, err := newWireTimer()
		if err != nil {
			return fmt.Errorf("fabric: link emulation: %w", err)
		}
		c.inTimer = t
	}
	// Our own (emulated) slowness, not a stalled peer.
	c.busySince.Store(0)
	c.inTimer.sleepUntil(due)
	c.busySince.Store(c.ep.clock.Load())
	return nil
}

func (c *Conn) recvSend(h header) error {
	first := h.flags&FlagFirst != 0
	switch {
	case h.flags&FlagSignal != 0:
		return fmt.Errorf("%w: signal flag on a send packet", ErrProtocol)
	case first && c.inMsg:
		return fmt.Errorf("%w: message %d started while message %d is incomplete", ErrProtocol, h.id, c.inID)
	case !first && !c.inMsg:
		return fmt.Errorf("%w: packet for unknown message %d", ErrProtocol, h.id)
	case !first && h.id != c.inID:
		return fmt.Errorf("%w: packet for message %d inside message %d", ErrProtocol, h.id, c.inID)
	}
	// Waiting for a receive buffer is our slowness, not the peer's.
	c.busySince.Store(0)
	p := c.quota.get()
	if p == nil {
		return ErrClosed
	}
	c.busySince.Store(c.ep.clock.Load())
	p.ID, p.Flags, p.Conn = h.id, h.flags, c
	p.refs.Store(1)
	p.Data = p.buf[:h.length]
	placed := false
	if first {
		c.inMsg, c.inID, c.inOff = true, h.id, 0
		p.Off = 0
	} else {
		p.Off = c.inOff
		c.inOff += int64(h.length)
		if c.placer != nil && h.length > 0 {
			if dst := c.placer.PlaceBegin(c, h.id, p.Off, int(h.length)); dst != nil {
				p.Data, placed = dst, true
			}
		}
	}
	_, err := io.ReadFull(c.br, p.Data)
	if placed {
		c.placer.PlaceEnd(c)
	}
	if err != nil {
		p.Release()
		return err
	}
	if h.flags&FlagLast != 0 {
		c.inMsg = false
	}
	c.busySince.Store(0)
	c.handler.HandlePacket(p)
	return nil
}

func (c *Conn) readPrefix(h header, n int) ([]byte, error) {
	if int(h.length) < n {
		return nil, fmt.Errorf("%w: %s packet of %d bytes, need %d", ErrProtocol, h.kind, h.length, n)
	}
	var b [24]byte
	if _, err := io.ReadFull(c.br, b[:n]); err != nil {
		return nil, err
	}
	return b[:n], nil
}

// accessDenied tells the initiator why and then closes the connection: as
// on an RDMA queue pair, a remote access error is fatal to the connection.
// The notice is sent from the reader goroutine itself (bounded by the
// write timeout) so it leaves before the close.
func (c *Conn) accessDenied(id uint64, err error) error {
	c.sendOne(KindAccessErr, 0, id, []byte(err.Error()))
	return fmt.Errorf("remote access refused: %w", err)
}

func (c *Conn) recvWrite(h header) error {
	if h.flags&FlagFirst != 0 {
		return fmt.Errorf("%w: first flag on a write packet", ErrProtocol)
	}
	pre, err := c.readPrefix(h, oneSidedPrefix)
	if err != nil {
		return err
	}
	key, off := binary.LittleEndian.Uint64(pre), binary.LittleEndian.Uint64(pre[8:])
	n := uint64(h.length) - oneSidedPrefix
	r, dst, aerr := c.ep.regions.access(c, key, off, n, RemoteWrite)
	if aerr != nil {
		if _, err := io.CopyN(io.Discard, c.br, int64(n)); err != nil {
			return err
		}
		return c.accessDenied(h.id, aerr)
	}
	// Direct placement: the payload goes from the socket into the region.
	_, err = io.ReadFull(c.br, dst)
	r.unuse()
	if err != nil {
		return err
	}
	if h.flags&FlagSignal != 0 {
		c.postCtrl(ctrlMsg{kind: KindAck, id: h.id})
	}
	return nil
}

func (c *Conn) recvReadReq(h header) error {
	if h.length != 24 {
		return fmt.Errorf("%w: read request of %d bytes", ErrProtocol, h.length)
	}
	pre, err := c.readPrefix(h, 24)
	if err != nil {
		return err
	}
	key, off, n := binary.LittleEndian.Uint64(pre), binary.LittleEndian.Uint64(pre[8:]), binary.LittleEndian.Uint64(pre[16:])
	r, src, aerr := c.ep.regions.access(c, key, off, n, RemoteRead)
	if aerr != nil {
		return c.accessDenied(h.id, aerr)
	}
	select {
	case c.readSem <- struct{}{}:
	default:
		// The initiator keeps MaxReads outstanding, but it may issue the
		// next READ as soon as the last response arrives, before the
		// goroutine that sent it has let its slot go: wait a moment for
		// that before calling it a violation.
		t := time.NewTimer(time.Second)
		select {
		case c.readSem <- struct{}{}:
			t.Stop()
		case <-t.C:
			r.unuse()
			return c.accessDenied(h.id, errors.New("too many outstanding remote reads"))
		case <-c.done:
			t.Stop()
			r.unuse()
			return ErrClosed
		}
	}
	// Serve off the reader goroutine: sending may block on the peer.
	go func() {
		defer func() { <-c.readSem }()
		// The memory stays the region's until the response is written,
		// even if the owner revokes the key meanwhile.
		defer r.unuse()
		if err := c.sendStream(KindReadResp, h.id, src); err != nil {
			c.fail(err)
		}
	}()
	return nil
}

func (c *Conn) recvReadResp(h header) error {
	c.opsMu.Lock()
	o := c.ops[h.id]
	c.opsMu.Unlock()
	if o == nil || o.dst == nil {
		return fmt.Errorf("%w: read response for unknown operation %d", ErrProtocol, h.id)
	}
	if int(h.length) > len(o.dst)-o.got {
		return fmt.Errorf("%w: read response overruns the %d-byte destination", ErrProtocol, len(o.dst))
	}
	// Direct placement into the initiator's destination buffer.
	if _, err := io.ReadFull(c.br, o.dst[o.got:o.got+int(h.length)]); err != nil {
		return err
	}
	o.got += int(h.length)
	if h.flags&FlagLast != 0 {
		var err error
		if o.got != len(o.dst) {
			err = fmt.Errorf("%w: read returned %d of %d bytes", ErrProtocol, o.got, len(o.dst))
		}
		c.complete(h.id, err)
		return err
	}
	return nil
}

func (c *Conn) recvCompletion(h header) error {
	var msg []byte
	if h.length > 0 {
		if h.length > 1024 {
			return fmt.Errorf("%w: %s packet of %d bytes", ErrProtocol, h.kind, h.length)
		}
		msg = make([]byte, h.length)
		if _, err := io.ReadFull(c.br, msg); err != nil {
			return err
		}
	}
	if h.kind == KindAccessErr {
		// Fatal to the connection, as on an RDMA queue pair: it is
		// failed before the initiator hears why, so it finds it broken.
		err := &AccessError{Reason: string(msg)}
		c.opsMu.Lock()
		o := c.ops[h.id]
		delete(c.ops, h.id)
		c.opsMu.Unlock()
		if o == nil {
			return fmt.Errorf("%w: %s for unknown operation %d", ErrProtocol, h.kind, h.id)
		}
		c.fail(err)
		o.done <- err
		return err
	}
	if !c.complete(h.id, nil) {
		return fmt.Errorf("%w: %s for unknown operation %d", ErrProtocol, h.kind, h.id)
	}
	return nil
}

func (c *Conn) complete(id uint64, err error) bool {
	c.opsMu.Lock()
	o := c.ops[id]
	delete(c.ops, id)
	c.opsMu.Unlock()
	if o != nil {
		o.done <- err
	}
	return o != nil
}

// ---- sending ----

func (c *Conn) ctrlLoop() {
	for {
		select {
		case m := <-c.ctrl:
			if m.flush != nil {
				close(m.flush)
				continue
			}
			if err := c.sendOne(m.kind, m.flags, m.id, m.data); err != nil {
				c.fail(err)
				return
			}
		case <-c.done:
			return
		}
	}
}

// postCtrl queues a small send without blocking; a peer that lets 64 of
// them pile up is not reading and the connection is failed.
func (c *Conn) postCtrl(m ctrlMsg) {
	select {
	case c.ctrl <- m:
	default:
		c.fail(fmt.Errorf("%w: peer is not reading its replies", ErrProtocol))
	}
}

// Post queues a small single-packet message (header only, at most one MTU)
// without blocking the caller; used by handlers on the reader goroutine to
// answer at once, e.g. with a NACK. hdr is copied.
func (c *Conn) Post(id uint64, hdr []byte) error {
	if len(hdr) > c.sendMTU {
		return fmt.Errorf("fabric: posted message of %d bytes exceeds MTU %d", len(hdr), c.sendMTU)
	}
	c.postCtrl(ctrlMsg{kind: KindSend, flags: FlagFirst | FlagLast, id: id, data: append([]byte(nil), hdr...)})
	return c.Err()
}

// SendPacket sends a message of one packet gathered from two parts (a
// transport header and a body, say) without copying them; together they
// must fit the MTU, the peer's receive buffer.
func (c *Conn) SendPacket(id uint64, head, body []byte) error {
	if len(head)+len(body) > c.sendMTU {
		return fmt.Errorf("fabric: message of %d bytes exceeds MTU %d", len(head)+len(body), c.sendMTU)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.addPacket(0, KindSend, FlagFirst|FlagLast, id, head, body)
	return c.flush()
}

// lazyDelay bounds how long SendLater holds a message when nothing else
// is sent.
const lazyDelay = 2 * time.Millisecond

// SendLater queues a one-packet message to go out with the connection's
// next send, or within lazyDelay if none comes, sparing it a system call
// of its own: for notices that need no haste (RPC's DONE). It keeps the
// order of sends. msg is copied.
func (c *Conn) SendLater(id uint64, msg []byte) error {
	if len(msg) > c.sendMTU {
		return fmt.Errorf("fabric: message of %d bytes exceeds MTU %d", len(msg), c.sendMTU)
	}
	if c.ep.opts.Link != nil {
		// The link emulation paces packets as they are sent.
		return c.SendPacket(id, msg, nil)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if err := c.Err(); err != nil {
		return err
	}
	var h [HeaderSize]byte
	putHeader(h[:], header{kind: KindSend, flags: FlagFirst | FlagLast, length: uint32(len(msg)), id: id})
	c.lazy = append(append(c.lazy, h[:]...), msg...)
	if !c.lazyDue {
		c.lazyDue = true
		time.AfterFunc(lazyDelay, func() {
			c.sendMu.Lock()
			defer c.sendMu.Unlock()
			c.lazyDue = false
			if len(c.lazy) > 0 {
				c.flush()
			}
		})
	}
	return nil
}

func (c *Conn) sendOne(kind Kind, flags uint8, id uint64, data []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.addPacket(0, kind, flags, id, nil, data)
	return c.flush()
}

// addPacket appends packet i of the current batch to the iovec scratch:
// its header, an optional prefix and the data.
func (c *Conn) addPacket(i int, kind Kind, flags uint8, id uint64, prefix, data []byte) {
	h := c.hdrs[i*HeaderSize : (i+1)*HeaderSize]
	putHeader(h, header{kind: kind, flags: flags, length: uint32(len(prefix) + len(data)), id: id})
	c.iov = append(c.iov, h)
	if len(prefix) > 0 {
		c.iov = append(c.iov, prefix)
	}
	if len(data) > 0 {
		c.iov = append(c.iov, data)
	}
}

// flush writes the batched packets with one writev. Caller holds sendMu.
func (c *Conn) flush() error {
	if err := c.Err(); err != nil {
		c.iov = c.iov[:0]
		return err
	}
	if len(c.lazy) > 0 {
		// Queued packets go first: they were sent earlier.
		c.iov = append(c.iov, nil)
		copy(c.iov[1:], c.iov)
		c.iov[0] = c.lazy
		defer func() { c.lazy = c.lazy[:0] }()
	}
	if l := c.ep.opts.Link; l != nil {
		err := c.sendEmulated(l)
		clear(c.iov)
		c.iov = c.iov[:0]
		if err != nil {
			c.fail(err)
		}
		return err
	}
	if now := time.Now(); c.deadline.Sub(now) < c.ep.opts.WriteTimeout/2 {
		c.deadline = now.Add(c.ep.opts.WriteTimeout)
		c.nc.SetWriteDeadline(c.deadline)
	}
	bufs := net.Buffers(c.iov)
	_, err := bufs.WriteTo(c.nc)
	clear(c.iov) // drop references to caller memory
	c.iov = c.iov[:0]
	if err != nil {
		err = fmt.Errorf("fabric: sending to %s: %w", c.nc.RemoteAddr(), err)
		c.fail(err)
	}
	return err
}

// sendStream sends data as packets of kind (ReadResp) with Last on the final one.
func (c *Conn) sendStream(kind Kind, id uint64, data []byte) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	for {
		n := 0
		for n < maxBatch {
			chunk := data[:min(len(data), readRespPacket)]
			data = data[len(chunk):]
			var fl uint8
			if len(data) == 0 {
				fl = FlagLast
			}
			c.addPacket(n, kind, fl, id, nil, chunk)
			n++
			if fl != 0 {
				return c.flush()
			}
		}
		if err := c.flush(); err != nil {
			return err
		}
	}
}

// Send transmits a whole message: hdr alone in the first packet (it must
// fit the MTU), then data split into packets of at most the MTU.
func (c *Conn) Send(id uint64, hdr []byte, data ...[]byte) error {
	w, err := c.Begin(id, hdr, totalLen(data) == 0)
	if err != nil {
		return err
	}
	for i, d := range data {
		if err := w.Write(d, i == len(data)-1); err != nil {
			w.Close()
			return err
		}
	}
	return w.Close()
}

func totalLen(bs [][]byte) int {
	n := 0
	for _, b := range bs {
		n += len(b)
	}
	return n
}

// MessageWriter streams one message. It holds the connection's send side
// until Close, so other messages wait (messages never interleave).
type MessageWriter struct {
	c     *Conn
	id    uint64
	n     int // packets batched, not yet flushed
	ended bool
	err   error
}

// Begin starts a message with header packet hdr. If last, the message is
// just the header. Packets are batched into few writev calls; Flush forces
// them out (forwarders call it per packet so data streams without delay).
func (c *Conn) Begin(id uint64, hdr []byte, last bool) (*MessageWriter, error) {
	if len(hdr) > c.sendMTU {
		return nil, fmt.Errorf("fabric: message header of %d bytes exceeds MTU %d", len(hdr), c.sendMTU)
	}
	c.sendMu.Lock()
	if err := c.Err(); err != nil {
		c.sendMu.Unlock()
		return nil, err
	}
	w := &MessageWriter{c: c, id: id}
	fl := uint8(FlagFirst)
	if last {
		fl |= FlagLast
		w.ended = true
	}
	c.addPacket(0, KindSend, fl, id, nil, hdr)
	w.n = 1
	return w, nil
}

// Write appends data to the message, split at the MTU; last marks the
// message's final bytes. Empty data with last sends an empty final packet.
func (w *MessageWriter) Write(data []byte, last bool) error {
	if w.err != nil {
		return w.err
	}
	if w.ended {
		w.err = errors.New("fabric: write after the message's last packet")
		return w.err
	}
	c := w.c
	for {
		chunk := data[:min(len(data), c.sendMTU)]
		data = data[len(chunk):]
		var fl uint8
		if last && len(data) == 0 {
			fl = FlagLast
			w.ended = true
		}
		if len(chunk) > 0 || fl != 0 {
			if w.n == maxBatch {
				if w.err = c.flush(); w.err != nil {
					return w.err
				}
				w.n = 0
			}
			c.addPacket(w.n, KindSend, fl, w.id, nil, chunk)
			w.n++
		}
		if len(data) == 0 {
			return nil
		}
	}
}

// Flush sends batched packets now.
func (w *MessageWriter) Flush() error {
	if w.err == nil && w.n > 0 {
		w.err = w.c.flush()
		w.n = 0
	}
	return w.err
}

// Close flushes and releases the send side. A message closed before its
// last packet cannot be completed, so the connection is failed: the peer
// then frees the partial message's state at once.
func (w *MessageWriter) Close() error {
	if w.c == nil {
		return w.err
	}
	w.Flush()
	c := w.c
	w.c = nil
	c.sendMu.Unlock()
	if w.err == nil && !w.ended {
		w.err = errors.New("fabric: message abandoned before its last packet")
		c.fail(w.err)
	}
	return w.err
}

// Abort abandons the message and fails the connection.
func (w *MessageWriter) Abort(reason error) {
	if w.c == nil {
		return
	}
	c := w.c
	w.c = nil
	clear(c.iov)
	c.iov = c.iov[:0]
	c.sendMu.Unlock()
	c.fail(fmt.Errorf("fabric: message aborted: %w", reason))
}

// ---- one-sided operations ----

func (c *Conn) register(o *op) (uint64, error) {
	id := c.NewID()
	c.opsMu.Lock()
	defer c.opsMu.Unlock()
	if err := c.Err(); err != nil {
		return 0, err
	}
	c.ops[id] = o
	return id, nil
}

// wait waits for a registered operation; on cancellation it fails the
// connection (an in-flight one-sided operation cannot be recalled) and
// waits for the reader to stop so dst is no longer written.
func (c *Conn) wait(ctx context.Context, o *op) error {
	select {
	case err := <-o.done:
		if err != nil && c.Err() != nil {
			// Failed by the connection closing: the reader may still be
			// placing a response into dst.
			c.Wait()
		}
		return err
	case <-ctx.Done():
		c.fail(fmt.Errorf("fabric: one-sided operation cancelled: %w", ctx.Err()))
		c.Wait()
		return ctx.Err()
	}
}

// Write places data at offset off of the peer's region key. With signal,
// it waits for the peer's acknowledgement that the data is placed;
// without, it returns once the data is sent, and a later message on this
// connection is delivered after the data is placed.
func (c *Conn) Write(ctx context.Context, key, off uint64, data []byte, signal bool) error {
	var o *op
	var id uint64
	if signal {
		o = &op{done: make(chan error, 1)}
		var err error
		if id, err = c.register(o); err != nil {
			return err
		}
	}
	if err := c.writeOneSided(id, key, off, data, signal); err != nil {
		return err
	}
	if !signal {
		return nil
	}
	return c.wait(ctx, o)
}

func (c *Conn) writeOneSided(id, key, off uint64, data []byte, signal bool) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	pre := c.pre
	n := 0
	for {
		chunk := data[:min(len(data), c.sendMTU)]
		p := pre[n*oneSidedPrefix : (n+1)*oneSidedPrefix]
		binary.LittleEndian.PutUint64(p, key)
		binary.LittleEndian.PutUint64(p[8:], off)
		data = data[len(chunk):]
		off += uint64(len(chunk))
		var fl uint8
		if len(data) == 0 && signal {
			fl = FlagSignal
		}
		c.addPacket(n, KindWrite, fl, id, p, chunk)
		n++
		if len(data) == 0 || n == maxBatch {
			if err := c.flush(); err != nil {
				return err
			}
			if len(data) == 0 {
				return nil
			}
			n = 0
		}
	}
}

// Read fills dst from offset off of the peer's region key, placing the
// data directly into dst as it arrives.
func (c *Conn) Read(ctx context.Context, key, off uint64, dst []byte) error {
	o := &op{dst: dst, done: make(chan error, 1)}
	if len(dst) == 0 {
		return nil
	}
	select {
	case c.readSlots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.Err()
	}
	defer func() { <-c.readSlots }()
	id, err := c.register(o)
	if err != nil {
		return err
	}
	var req [24]byte
	binary.LittleEndian.PutUint64(req[:], key)
	binary.LittleEndian.PutUint64(req[8:], off)
	binary.LittleEndian.PutUint64(req[16:], uint64(len(dst)))
	if err := c.sendOne(KindReadReq, 0, id, req[:]); err != nil {
		return err
	}
	return c.wait(ctx, o)
}
