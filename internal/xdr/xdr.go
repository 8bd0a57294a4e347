// Package xdr encodes and decodes External Data Representation (RFC
// 4506), the wire format of ONC RPC and NFS: big-endian, every item a
// multiple of four bytes. The Writer appends to a byte slice; the Reader
// decodes from one without copying (opaque data and strings alias the
// input) and with a sticky error, so a decoder reads a whole structure
// and checks Err once. Every variable-length item is bounded by the
// caller, and never by more than the bytes left: hostile lengths cannot
// make a decoder allocate.
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
type Writer struct{ B []byte }

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
	w.B = append(w.B, p...)
	w.B = append(w.B, make([]byte, Pad(len(p)))...)
}

// Opaque appends variable-length opaque data: its length, then the bytes,
// padded.
func (w *Writer) Opaque(p []byte) {
	w.Uint32(uint32(len(p)))
	w.Fixed(p)
}

// String appends a string as variable-length opaque data.
func (w *Writer) String(s string) {
	w.Uint32(uint32(len(s)))
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

// Reader decodes XDR items from a message.
type Reader struct {
	b   []byte
	off int
	err error
}

// NewReader reads b.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Reset makes r read b from the start, with no error.
func (r *Reader) Reset(b []byte) { *r = Reader{b: b} }

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
