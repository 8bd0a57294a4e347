// Package regionmac authenticates optimistic one-sided operations over a
// network (seed 004 §4.1, the thesis' second scheme): a secret is handed
// to a client over an authenticated channel with a reference, and every
// optimistic operation carries HMAC(secret; region, offset, length,
// timestamp), which the target checks before it touches the region. The
// secret is a reference's own (RefKey: derived by the node from a secret
// of its run and what the reference names), so it opens that reference
// and nothing else: a client that read one block learns no key to the
// blocks that share the region. The timestamp bounds how long a
// tag is good for, and a window of the tags already seen refuses replays
// within it. A tag that fails is a recoverable refusal: the client falls
// back to an RPC. Pure: the caller gives the time.
package regionmac

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"
)

// SecretSize is the bytes of a region's secret.
const SecretSize = 32

// TagSize is the bytes of a tag: HMAC-SHA256 truncated to 128 bits.
const TagSize = 16

// Tag is an operation's authenticator.
type Tag [TagSize]byte

// Op is what a tag covers.
type Op struct {
	Region uint64
	Off    uint64
	Len    uint32
	Time   int64 // Unix nanoseconds, the initiator's clock
}

// Sign returns op's tag under secret (at most 64 bytes: a SecretSize
// secret, or a Tag used as a reference's key). It allocates nothing: a
// node signs or checks two per optimistic read.
func Sign(secret []byte, op Op) Tag {
	var b [28]byte
	binary.LittleEndian.PutUint64(b[0:], op.Region)
	binary.LittleEndian.PutUint64(b[8:], op.Off)
	binary.LittleEndian.PutUint32(b[16:], op.Len)
	binary.LittleEndian.PutUint64(b[20:], uint64(op.Time))
	sum := hmacSHA256(secret, &b)
	var t Tag
	copy(t[:], sum[:])
	return t
}

// hmacSHA256 is HMAC-SHA256 (RFC 2104) of a 28-byte message under a key
// of at most one block, on the stack.
func hmacSHA256(key []byte, msg *[28]byte) [sha256.Size]byte {
	if len(key) > sha256.BlockSize {
		panic("regionmac: key longer than a SHA-256 block")
	}
	var in [sha256.BlockSize + 28]byte
	var out [sha256.BlockSize + sha256.Size]byte
	copy(in[:], key)
	copy(out[:], key)
	for i := range sha256.BlockSize {
		in[i] ^= 0x36
		out[i] ^= 0x5c
	}
	copy(in[sha256.BlockSize:], msg[:])
	inner := sha256.Sum256(in[:])
	copy(out[sha256.BlockSize:], inner[:])
	return sha256.Sum256(out[:])
}

// Errors of Verify; each refuses the operation alone.
var (
	ErrBadTag  = errors.New("regionmac: tag does not match")
	ErrExpired = errors.New("regionmac: timestamp outside the window")
	ErrReplay  = errors.New("regionmac: operation replayed")
	ErrBusy    = errors.New("regionmac: too many operations in the window")
)

// Verifier checks tags for one target. Safe for concurrent use.
//
// The tags seen are kept in buckets by their operations' times, a tenth
// of the window each: a replay has its original's time, so one bucket is
// looked in, and buckets whose times have left the window are dropped
// whole — no scan of the tags, whatever the rate.
type Verifier struct {
	window time.Duration
	span   int64 // a bucket's nanoseconds
	max    int

	mu      sync.Mutex
	buckets map[int64]map[Tag]struct{} // time / span -> tags
	n       int                        // tags in all buckets
	oldest  int64                      // no bucket below it is kept
}

// NewVerifier returns a verifier accepting timestamps up to window behind
// its clock and a quarter of it ahead, remembering at most limit tags (an
// operation that would need more is refused with ErrBusy: memory stays
// bounded whatever peers send).
func NewVerifier(window time.Duration, limit int) *Verifier {
	return &Verifier{window: window, span: max(int64(window)/10, 1), max: limit, buckets: map[int64]map[Tag]struct{}{}}
}

// Verify checks op's tag under secret at time now (Unix nanoseconds).
func (v *Verifier) Verify(secret []byte, op Op, tag Tag, now int64) error {
	// Up to the window old, but only a quarter of it ahead: a tag dated
	// ahead stays remembered longer, and clocks agree far better.
	if d := now - op.Time; d > int64(v.window) || d < -int64(v.window)/4 {
		return fmt.Errorf("%w: %v off", ErrExpired, time.Duration(d))
	}
	want := Sign(secret, op)
	if !hmac.Equal(want[:], tag[:]) {
		return ErrBadTag
	}
	b := floorDiv(op.Time, v.span)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pruneLocked(now)
	m := v.buckets[b]
	if _, ok := m[tag]; ok {
		return ErrReplay
	}
	if v.n >= v.max {
		return ErrBusy
	}
	if m == nil {
		m = map[Tag]struct{}{}
		v.buckets[b] = m
	}
	m[tag] = struct{}{}
	v.n++
	return nil
}

// pruneLocked drops the buckets whose every time has left the window:
// their tags would be refused as expired anyway.
func (v *Verifier) pruneLocked(now int64) {
	low := floorDiv(now-int64(v.window), v.span)
	if low <= v.oldest {
		return
	}
	for b, m := range v.buckets {
		if b < low {
			v.n -= len(m)
			delete(v.buckets, b)
		}
	}
	v.oldest = low
}

// floorDiv is a/b rounded down (times may be before 1970 in tests).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// RefKey is the secret of one reference: the slot at off of region as
// filled under generation gen, derived from the node's run secret. The
// node derives it again to check an operation, and keeps nothing per
// reference.
func RefKey(secret []byte, region, off, gen uint64) Tag {
	return Sign(secret, Op{Region: region, Off: off, Len: refKeyOp, Time: int64(gen)})
}

// refKeyOp marks a RefKey derivation: no operation's length, so a key is
// never an operation's tag under the same secret.
const refKeyOp = 1<<32 - 1

// AuthSize is the bytes of an optimistic read's authenticator.
const AuthSize = 8 + 8 + TagSize

// Auth is what an optimistic read carries: the generation it expects
// (which picks the reference's key), the initiator's time, and the tag.
type Auth struct {
	Gen  uint64
	Time int64
	Tag  Tag
}

// Append appends a's encoding to b.
func (a Auth) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, a.Gen)
	b = binary.LittleEndian.AppendUint64(b, uint64(a.Time))
	return append(b, a.Tag[:]...)
}

// ParseAuth decodes an authenticator.
func ParseAuth(b []byte) (Auth, error) {
	if len(b) != AuthSize {
		return Auth{}, fmt.Errorf("%w: authenticator of %d bytes, want %d", ErrBadTag, len(b), AuthSize)
	}
	a := Auth{Gen: binary.LittleEndian.Uint64(b), Time: int64(binary.LittleEndian.Uint64(b[8:]))}
	copy(a.Tag[:], b[16:])
	return a, nil
}

// NewAuth is the authenticator of an optimistic read of n bytes at off of
// region, expecting the fill gen, signed with that reference's key at
// time now.
func NewAuth(key []byte, region, off uint64, n uint32, gen uint64, now int64) Auth {
	return Auth{Gen: gen, Time: now, Tag: Sign(key, Op{Region: region, Off: off, Len: n, Time: now})}
}
