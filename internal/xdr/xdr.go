// Package xdr encodes and decodes External Data Representation (RFC
// 4506), the wire format of ONC RPC and NFS: big-endian, every item a
// multiple of four bytes. The Writer appends to a byte slice; the Reader
// decodes from one without copying (opaque data and strings alias the
// input) and with a sticky error, so a decoder reads a whole structure
// and checks Err once. Every variable-length item is bounded by the
// caller, and never by more than the bytes left: hostile lengths cannot
// make a decoder allocate.
//
// For RPC over the fabric (seed 001's xdr_rdma stream), a Writer with
// ChunkMin set leaves large variable-length opaque data where it is and
// lists it in Chunks instead of copying it into B, and a Reader given
// chunks returns their data for the opaque items at their positions. The
// length word stays inline; the data and its padding do not.
package xdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrShort is a message that ends inside an item.
var ErrShort = errors.New("xdr: message too short")

// ErrTooLong is a length beyond what the caller allows.
var ErrTooLong = errors.New("xdr: length over the limit")

// Pad is the padding after n bytes of opaque data.
func Pad(n int) int { return (4 - n&3) & 3 }

// Writer appends XDR items to B.
type Writer struct {
	B []byte
	// ChunkMin, if positive, is the size from which Opaque data is not
	// copied into B but listed in Chunks (RPC over the fabric); zero
	// copies everything inline.
	ChunkMin int
	// Chunks are the opaque data left out of B, by position in B.
	Chunks []Chunk
	// Copied counts the data bytes Fixed, Opaque and String copied into
	// B, for the transports' count of bytes copied.
	Copied int64

	holds []func()
}

// Chunk is opaque data carried apart from the inline XDR stream: Pos is
// the offset in the stream where its bytes would be (after its length
// word).
type Chunk struct {
	Pos  int
	Data []byte
}

// Hold registers release to run once the transport no longer needs the
// message: chunk data may alias memory (a cache block) that must stay
// untouched until the peer has pulled it.
func (w *Writer) Hold(release func()) { w.holds = append(w.holds, release) }

// Release runs the holds, once each, and forgets the chunks.
func (w *Writer) Release() {
	for i, f := range w.holds {
		f()
		w.holds[i] = nil
	}
	w.holds = w.holds[:0]
	clear(w.Chunks)
	w.Chunks = w.Chunks[:0]
}

// Reset empties the message for another use (holds already released),
// keeping B's memory and ChunkMin.
func (w *Writer) Reset() {
	w.B = w.B[:0]
	clear(w.Chunks)
	w.Chunks = w.Chunks[:0]
	w.Copied = 0
}

// Uint32 appends an unsigned int.
func (w *Writer) Uint32(v uint32) { w.B = binary.BigEndian.AppendUint32(w.B, v) }

// Int32 appends an int.
func (w *Writer) Int32(v int32) { w.Uint32(uint32(v)) }

// Uint64 appends an unsigned hyper.
func (w *Writer) Uint64(v uint64) { w.B = binary.BigEndian.AppendUint64(w.B, v) }

// Bool appends a bool.
func (w *Writer) Bool(v bool) {
	if v {
		w.Uint32(1)
	} else {
		w.Uint32(0)
	}
}

// Fixed appends fixed-length opaque data, padded.
func (w *Writer) Fixed(p []byte) {
	w.Copied += int64(len(p))
	w.B = append(w.B, p...)
	w.B = append(w.B, make([]byte, Pad(len(p)))...)
}

// Opaque appends variable-length opaque data: its length, then the bytes,
// padded.
func (w *Writer) Opaque(p []byte) {
	w.Uint32(uint32(len(p)))
	if w.ChunkMin > 0 && len(p) >= w.ChunkMin {
		w.Chunks = append(w.Chunks, Chunk{Pos: len(w.B), Data: p})
		return
	}
	w.Fixed(p)
}

// String appends a string as variable-length opaque data.
func (w *Writer) String(s string) {
	w.Uint32(uint32(len(s)))
	w.Copied += int64(len(s))
	w.B = append(w.B, s...)
	w.B = append(w.B, make([]byte, Pad(len(s)))...)
}

// Reserve appends n zero bytes and returns their offset, for a value
// known only later (a count, a length); Put32 fills it.
func (w *Writer) Reserve(n int) int {
	off := len(w.B)
	w.B = append(w.B, make([]byte, n)...)
	return off
}

// Put32 stores v at offset off.
func (w *Writer) Put32(off int, v uint32) { binary.BigEndian.PutUint32(w.B[off:], v) }

// ErrChunk is a chunk that does not fit the inline stream: not at an
// opaque item, or of another length than the item's.
var ErrChunk = errors.New("xdr: chunk does not match the message")

// Reader decodes XDR items from a message.
type Reader struct {
	b      []byte
	off    int
	err    error
	chunks []Chunk // not yet consumed, by ascending Pos
}

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Reset makes r read b from the start, with no error.
func (r *Reader) Reset(b []byte) { *r = Reader{b: b} }

// SetChunks makes the opaque items at the chunks' positions in the
// stream read their data from the chunks. Positions must ascend (the
// transport checks); an item other than an opaque of the chunk's length
// at a chunk's position is an error (ErrChunk).
func (r *Reader) SetChunks(c []Chunk) { r.chunks = c }

// Err is the first error met, if any.
func (r *Reader) Err() error { return r.err }

// Pos is the offset of the next item.
func (r *Reader) Pos() int { return r.off }

// Len is the number of bytes left.
func (r *Reader) Len() int { return len(r.b) - r.off }

// Rest returns the bytes left, consuming them.
func (r *Reader) Rest() []byte {
	p := r.b[r.off:]
	r.off = len(r.b)
	return p
}

// Fail records err (the first one sticks) for a decoder that found a
// value it cannot accept.
func (r *Reader) Fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *Reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b)-r.off {
		r.err = ErrShort
		return nil
	}
	if len(r.chunks) > 0 && n > 0 && r.off+n > r.chunks[0].Pos {
		r.err = fmt.Errorf("%w: chunk at offset %d inside an item at %d", ErrChunk, r.chunks[0].Pos, r.off)
		return nil
	}
	p := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return p
}

// Uint32 reads an unsigned int (0 after an error).
func (r *Reader) Uint32() uint32 {
	p := r.take(4)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

// Int32 reads an int.
func (r *Reader) Int32() int32 { return int32(r.Uint32()) }

// Uint64 reads an unsigned hyper.
func (r *Reader) Uint64() uint64 {
	p := r.take(8)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

// Bool reads a bool; anything but 0 or 1 is an error.
func (r *Reader) Bool() bool {
	v := r.Uint32()
	if v > 1 {
		r.Fail(fmt.Errorf("xdr: bool %d", v))
	}
	return v == 1
}

// Fixed reads n bytes of fixed-length opaque data and their padding; the
// result aliases the message.
func (r *Reader) Fixed(n int) []byte {
	p := r.take(n)
	r.take(Pad(n))
	if r.err != nil {
		return nil
	}
	return p
}

// Opaque reads variable-length opaque data of at most max bytes; the
// result aliases the message.
func (r *Reader) Opaque(max int) []byte {
	n := r.Uint32()
	if r.err == nil && int64(n) > int64(max) {
		r.Fail(fmt.Errorf("%w: %d bytes, at most %d", ErrTooLong, n, max))
	}
	if r.err != nil {
		return nil
	}
	if len(r.chunks) > 0 && r.chunks[0].Pos == r.off {
		c := r.chunks[0]
		r.chunks = r.chunks[1:]
		if len(c.Data) != int(n) {
			r.Fail(fmt.Errorf("%w: chunk of %d bytes for an opaque of %d", ErrChunk, len(c.Data), n))
			return nil
		}
		return c.Data
	}
	return r.Fixed(int(n))
}

// String reads a string of at most max bytes (a copy: strings outlive
// the message).
func (r *Reader) String(max int) string { return string(r.Opaque(max)) }

// Count reads an array length of at most max elements, each at least
// minSize bytes on the wire, so a count larger than the message could
// hold is an error before anything is allocated for it.
func (r *Reader) Count(max, minSize int) int {
	n := r.Uint32()
	switch {
	case r.err != nil:
		return 0
	case int64(n) > int64(max):
		r.Fail(fmt.Errorf("%w: %d elements, at most %d", ErrTooLong, n, max))
		return 0
	case minSize > 0 && int64(n)*int64(minSize) > int64(r.Len()):
		r.Fail(ErrShort)
		return 0
	}
	return int(n)
}
