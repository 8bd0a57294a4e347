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

// Guard serves the optimistic READs of a region registered with
// RegisterGuarded (seed 004 §4.1's protection over a network): given the
// region's key, the offset, the word's offset and the initiator's
// authenticator, it decides whether the read may be served and, if so,
// copies the range into dst and returns the word — one consistent
// snapshot of both, taken under the owner's own synchronisation, so the
// bytes sent never mix two states (or reveal what replaced the ones the
// initiator may see). A refusal is of that read alone. It runs on the
// connection's reader: it must be quick and must not block.
type Guard func(key, off, wordOff uint64, auth, dst []byte) (word uint64, err error)

// maxGuardedRead bounds a guarded read's copy (what the target buffers
// before sending).
const maxGuardedRead = 1<<20 + 4096

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
	if r.guard != nil {
		err := c.serveGuarded(h.id, r, key, off, n, wordOff, auth)
		r.unuse() // the guard's copy is done
		rw.unuse()
		return err
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

// serveGuarded answers an optimistic READ of a guarded region: the
// guard copies the range (or refuses), and the copy is sent.
func (c *Conn) serveGuarded(id uint64, r *Region, key, off, n, wordOff uint64, auth []byte) error {
	if n > r.guardMax {
		return c.softDenied(id, fmt.Errorf("%w: guarded read of %d bytes, at most %d", ErrBounds, n, r.guardMax))
	}
	inline := n <= inlineGuardedRead
	if !inline {
		select {
		case c.readSem <- struct{}{}:
		default:
			return c.softDenied(id, errors.New("too many outstanding remote reads"))
		}
	}
	bp, _ := c.ep.guardBufs.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	if uint64(cap(*bp)) < n {
		*bp = make([]byte, n)
	}
	buf := (*bp)[:n]
	word, err := r.guard(key, off, wordOff, auth, buf)
	if err != nil {
		c.ep.guardBufs.Put(bp)
		if !inline {
			<-c.readSem
		}
		return c.softDenied(id, err)
	}
	if inline {
		// Small: answered from the reader, as a refusal is — no
		// goroutine and no hand-off for the common 4 KiB slot.
		defer c.ep.guardBufs.Put(bp)
		return c.sendRangeWord(id, buf, word)
	}
	go func() {
		defer func() { <-c.readSem }()
		defer c.ep.guardBufs.Put(bp)
		if err := c.sendRangeWord(id, buf, word); err != nil {
			c.fail(err)
		}
	}()
	return nil
}

// inlineGuardedRead is the largest guarded read the connection's reader
// answers itself.
const inlineGuardedRead = 64<<10 + 4096

// softDenied refuses an optimistic operation: the initiator hears why,
// and the connection goes on.
func (c *Conn) softDenied(id uint64, err error) error {
	reason := err.Error()
	if len(reason) > 512 {
		reason = reason[:512]
	}
	return c.sendOne(KindSoftErr, 0, id, []byte(reason))
}
