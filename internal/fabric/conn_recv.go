package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// Receiving: the connection's reader loop and what it does with each
// kind of packet.

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
		c.active()
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
		case KindOReadReq:
			err = c.recvOReadReq(h)
		case KindReadResp:
			err = c.recvReadResp(h)
		case KindAck, KindAccessErr, KindSoftErr:
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
	var b [oreadPayload + MaxAuth]byte // the longest prefix (escapes no further than this frame)
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
	if h.kind == KindSoftErr {
		// An optimistic operation's refusal: that operation's alone.
		if !c.complete(h.id, &RemoteError{Reason: string(msg)}) {
			return fmt.Errorf("%w: %s for unknown operation %d", ErrProtocol, h.kind, h.id)
		}
		return nil
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
