package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
)

// One-sided operations: WRITE into and READ from a peer's registered
// regions.

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
	if c.direct != nil {
		if err := c.Err(); err != nil {
			return err
		}
		if err := c.direct.writeRegion(ctx, key, off, data); err != errNotDirect {
			return c.directOp(err)
		}
	}
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
	if len(dst) == 0 {
		return nil
	}
	if c.direct != nil {
		if err := c.Err(); err != nil {
			return err
		}
		if err := c.direct.readRegion(ctx, key, off, dst); err != errNotDirect {
			return c.directOp(err)
		}
	}
	o := &op{dst: dst, done: make(chan error, 1)}
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

// directOp completes a one-sided operation the transport performed
// itself (directAccess): a refusal is fatal to the connection, as when
// the target refuses a packet; so is any other failure of the transport.
func (c *Conn) directOp(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrNoRegion) || errors.Is(err, ErrBounds) || errors.Is(err, ErrPerm) {
		ae := &AccessError{Reason: err.Error()}
		c.fail(ae)
		return ae
	}
	err = fmt.Errorf("fabric: one-sided operation: %w", err)
	c.fail(err)
	return err
}
