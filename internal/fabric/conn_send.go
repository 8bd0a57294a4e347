package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"
)

// Sending: two-sided messages, small and streamed, and the control
// messages that ride on them.

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
	c.active()
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
	var err error
	if c.tlsw != nil {
		if _, err = bufs.WriteTo(c.tlsw); err == nil {
			err = c.tlsw.Flush()
		}
	} else {
		_, err = bufs.WriteTo(c.nc)
	}
	clear(c.iov) // drop references to caller memory
	c.iov = c.iov[:0]
	if err != nil {
		err = fmt.Errorf("fabric: sending to %s: %w", c.remote, err)
		c.fail(err)
	}
	return err
}

// sendStream sends data as packets of kind (ReadResp) with Last on the final one.
func (c *Conn) sendStream(kind Kind, id uint64, data []byte) error {
	return c.sendStreamLast(kind, id, data, true)
}

// sendStreamLast is sendStream that sets Last on the final packet only if
// last (more of the response follows otherwise).
func (c *Conn) sendStreamLast(kind Kind, id uint64, data []byte, last bool) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	for {
		n := 0
		for n < maxBatch {
			chunk := data[:min(len(data), readRespPacket)]
			data = data[len(chunk):]
			var fl uint8
			if len(data) == 0 && last {
				fl = FlagLast
			}
			c.addPacket(n, kind, fl, id, nil, chunk)
			n++
			if len(data) == 0 {
				return c.flush()
			}
		}
		if err := c.flush(); err != nil {
			return err
		}
	}
}

// sendRangeWord answers an optimistic READ: data, then the 8-byte word
// as the Last packet — in one writev when they fit one batch (a small
// read), so the target makes one system call.
func (c *Conn) sendRangeWord(id uint64, data []byte, word uint64) error {
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], word)
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	for {
		n := 0
		for n < maxBatch-1 && len(data) > 0 {
			chunk := data[:min(len(data), readRespPacket)]
			data = data[len(chunk):]
			c.addPacket(n, KindReadResp, 0, id, nil, chunk)
			n++
		}
		if len(data) == 0 {
			c.addPacket(n, KindReadResp, FlagLast, id, nil, w[:])
			return c.flush()
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
