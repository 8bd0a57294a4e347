// Package regionmac authenticates optimistic one-sided operations over a
// network (seed 004 §4.1, the thesis' second scheme): each exported
// region has a secret the node hands a client over an authenticated
// channel with a reference, and every optimistic operation carries
// HMAC(secret; region, offset, length, timestamp), which the target
// checks before it touches the region. The timestamp bounds how long a
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

// Sign returns op's tag under secret.
func Sign(secret []byte, op Op) Tag {
	m := hmac.New(sha256.New, secret)
	var b [28]byte
	binary.LittleEndian.PutUint64(b[0:], op.Region)
	binary.LittleEndian.PutUint64(b[8:], op.Off)
	binary.LittleEndian.PutUint32(b[16:], op.Len)
	binary.LittleEndian.PutUint64(b[20:], uint64(op.Time))
	m.Write(b[:])
	var t Tag
	copy(t[:], m.Sum(nil))
	return t
}

// Errors of Verify; each refuses the operation alone.
var (
	ErrBadTag  = errors.New("regionmac: tag does not match")
	ErrExpired = errors.New("regionmac: timestamp outside the window")
	ErrReplay  = errors.New("regionmac: operation replayed")
	ErrBusy    = errors.New("regionmac: too many operations in the window")
)

// Verifier checks tags for one target. Safe for concurrent use.
type Verifier struct {
	window time.Duration
	max    int

	mu     sync.Mutex
	seen   map[Tag]int64 // tag -> its operation's time
	pruned int64         // when seen was last pruned
}

// NewVerifier returns a verifier accepting timestamps within window of
// its clock either way, remembering at most max tags (an operation that
// would need more is refused with ErrBusy: memory stays bounded whatever
// peers send).
func NewVerifier(window time.Duration, max int) *Verifier {
	return &Verifier{window: window, max: max, seen: map[Tag]int64{}}
}

// Verify checks op's tag under secret at time now (Unix nanoseconds).
func (v *Verifier) Verify(secret []byte, op Op, tag Tag, now int64) error {
	if d := now - op.Time; d > int64(v.window) || d < -int64(v.window) {
		return fmt.Errorf("%w: %v off", ErrExpired, time.Duration(d))
	}
	want := Sign(secret, op)
	if !hmac.Equal(want[:], tag[:]) {
		return ErrBadTag
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pruneLocked(now)
	if _, ok := v.seen[tag]; ok {
		return ErrReplay
	}
	if len(v.seen) >= v.max {
		return ErrBusy
	}
	v.seen[tag] = op.Time
	return nil
}

// pruneLocked forgets tags whose times have left the window: they would
// be refused as expired anyway. At most once per tenth of the window.
func (v *Verifier) pruneLocked(now int64) {
	if now-v.pruned < int64(v.window)/10 && len(v.seen) < v.max {
		return
	}
	v.pruned = now
	for t, at := range v.seen {
		if now-at > int64(v.window) {
			delete(v.seen, t)
		}
	}
}
