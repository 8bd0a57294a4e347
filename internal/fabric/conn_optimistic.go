package fabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Optimistic one-sided reads (seed 004's ORDMA with recoverable remote
// exceptions): a READ of a range, then of an 8-byte word, the word read
// after the range was copied — one round trip where two READs would
// need two (a target serves each READ on a goroutine of its own, so two
// sent together could be served in either order) — whose refusal (no
// such region, out of bounds, not readable) is that operation's error
// alone: the connection stays up, and the initiator falls back to a
// request. A reader of a seqlocked slot (internal/expcache) reads the
// slot and its generation word this way.

// RemoteError is an optimistic operation refused by the target (or, over
// shared memory, by the region's grant): recoverable, the connection is
// still usable.
type RemoteError struct{ Reason string }

func (e *RemoteError) Error() string { return "fabric: optimistic access refused: " + e.Reason }

// oreadPayload is an optimistic READ request's payload before its
// authenticator, which is at most MaxAuth bytes.
const oreadPayload = 32

// MaxAuth bounds an optimistic operation's authenticator.
const MaxAuth = 64

// Guard admits optimistic READs of a region registered with
// RegisterGuarded (seed 004 §4.1's protection over a network): given the
// region's key, the range, the word and the initiator's authenticator,
// it returns the value the word must hold for the read to be served —
// the target checks it again after copying the range, so bytes that changed under
// the copy never leave — or why not (a refusal of that read alone). It
// runs on the connection's reader: it must be quick and must not block.
type Guard func(key, off, n, wordOff uint64, auth []byte) (word uint64, err error)

// ReadOptimistic fills dst from offset off of the peer's region key, then
// reads the 8-byte little-endian word at wordOff of the same region (8-byte
// aligned), after dst's bytes were copied, and returns it. auth (at most
// MaxAuth bytes) goes to the region's Guard if it has one. A refusal is a
// *RemoteError and leaves the connection up; other errors are the
// connection's, as for Read.
func (c *Conn) ReadOptimistic(ctx context.Context, key, off uint64, dst []byte, wordOff uint64, auth []byte) (uint64, error) {
	if wordOff%8 != 0 {
		return 0, &RemoteError{Reason: fmt.Sprintf("word offset %d is not 8-byte aligned", wordOff)}
	}
	if len(auth) > MaxAuth {
		return 0, &RemoteError{Reason: fmt.Sprintf("authenticator of %d bytes, at most %d", len(auth), MaxAuth)}
	}
	if c.direct != nil {
		if err := c.Err(); err != nil {
			return 0, err
		}
		var w [8]byte
		err := c.direct.readRegion(ctx, key, off, dst)
		if err == nil {
			err = c.direct.readRegion(ctx, key, wordOff, w[:])
		}
		switch {
		case err == nil:
			return binary.LittleEndian.Uint64(w[:]), nil
		case errors.Is(err, ErrNoRegion), errors.Is(err, ErrBounds), errors.Is(err, ErrPerm):
			return 0, &RemoteError{Reason: err.Error()}
		case err != errNotDirect:
			return 0, c.directOp(err)
		}
	}
	buf := make([]byte, len(dst)+8)
	o := &op{dst: buf, done: make(chan error, 1)}
	select {
	case c.readSlots <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-c.done:
		return 0, c.Err()
	}
	defer func() { <-c.readSlots }()
	id, err := c.register(o)
	if err != nil {
		return 0, err
	}
	var req [oreadPayload + MaxAuth]byte
	binary.LittleEndian.PutUint64(req[:], key)
	binary.LittleEndian.PutUint64(req[8:], off)
	binary.LittleEndian.PutUint64(req[16:], uint64(len(dst)))
	binary.LittleEndian.PutUint64(req[24:], wordOff)
	k := copy(req[oreadPayload:], auth)
	if err := c.sendOne(KindOReadReq, 0, id, req[:oreadPayload+k]); err != nil {
		return 0, err
	}
	if err := c.wait(ctx, o); err != nil {
		return 0, err
	}
	copy(dst, buf)
	return binary.LittleEndian.Uint64(buf[len(dst):]), nil
}

// recvOReadReq serves an optimistic READ, or refuses it softly.
func (c *Conn) recvOReadReq(h header) error {
	if h.length < oreadPayload || h.length > oreadPayload+MaxAuth {
		return fmt.Errorf("%w: optimistic read request of %d bytes", ErrProtocol, h.length)
	}
	pre, err := c.readPrefix(h, int(h.length))
	if err != nil {
		return err
	}
	key, off, n := binary.LittleEndian.Uint64(pre), binary.LittleEndian.Uint64(pre[8:]), binary.LittleEndian.Uint64(pre[16:])
	wordOff := binary.LittleEndian.Uint64(pre[24:])
	auth := pre[oreadPayload:]
	r, src, aerr := c.ep.regions.access(c, key, off, n, permOptimistic)
	if aerr != nil {
		return c.softDenied(h.id, aerr)
	}
	rw, word, aerr := c.ep.regions.access(c, key, wordOff, 8, permOptimistic)
	if aerr == nil && (wordOff%8 != 0 || uintptr(unsafe.Pointer(&word[0]))%8 != 0) {
		rw.unuse()
		aerr = fmt.Errorf("%w: word at %d is not 8-byte aligned", ErrBounds, wordOff)
	}
	if aerr != nil {
		r.unuse()
		return c.softDenied(h.id, aerr)
	}
	var want uint64
	if r.guard != nil {
		if want, aerr = r.guard(key, off, n, wordOff, auth); aerr != nil {
			r.unuse()
			rw.unuse()
			return c.softDenied(h.id, aerr)
		}
	}
	select {
	case c.readSem <- struct{}{}:
	default:
		r.unuse()
		rw.unuse()
		return c.softDenied(h.id, errors.New("too many outstanding remote reads"))
	}
	go func() {
		defer func() { <-c.readSem }()
		defer r.unuse()
		defer rw.unuse()
		if r.guard != nil {
			c.sendGuarded(h.id, src, (*atomic.Uint64)(unsafe.Pointer(&word[0])), want)
			return
		}
		if err := c.sendStreamLast(KindReadResp, h.id, src, false); err != nil {
			c.fail(err)
			return
		}
		// After the range went out: a change that began before the copy
		// shows in the word (the seqlock's second read).
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], (*atomic.Uint64)(unsafe.Pointer(&word[0])).Load())
		if err := c.sendOne(KindReadResp, FlagLast, h.id, w[:]); err != nil {
			c.fail(err)
		}
	}()
	return nil
}

// sendGuarded answers a guarded optimistic READ: the range is copied
// first and sent only if the word still holds what the guard admitted —
// the initiator may not be allowed to see what replaced the bytes, so it
// must never get them, even torn.
func (c *Conn) sendGuarded(id uint64, src []byte, word *atomic.Uint64, want uint64) {
	bp, _ := c.ep.guardBufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	defer c.ep.guardBufs.Put(bp)
	if cap(*bp) < len(src) {
		*bp = make([]byte, len(src))
	}
	buf := (*bp)[:len(src)]
	copy(buf, src)
	if word.Load() != want {
		if err := c.softDenied(id, errors.New("stale: the memory changed during the read")); err != nil {
			c.fail(err)
		}
		return
	}
	if err := c.sendStreamLast(KindReadResp, id, buf, false); err != nil {
		c.fail(err)
		return
	}
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], want)
	if err := c.sendOne(KindReadResp, FlagLast, id, w[:]); err != nil {
		c.fail(err)
	}
}

// softDenied refuses an optimistic operation: the initiator hears why,
// and the connection goes on.
func (c *Conn) softDenied(id uint64, err error) error {
	reason := err.Error()
	if len(reason) > 512 {
		reason = reason[:512]
	}
	return c.sendOne(KindSoftErr, 0, id, []byte(reason))
}
