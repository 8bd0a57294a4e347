package capability

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"hash"
	"sync"
	"time"

	"github.com/sluicefs/sluice/internal/secret"
)

// Keyring holds the MAC keys by id. Meta mints with the current key;
// nodes accept any key on the ring, so keys can be rotated by adding a new
// id, minting with it, and dropping the old one after the longest
// capability lifetime. A Keyring is safe for concurrent use.
type Keyring struct {
	current uint32
	macs    map[uint32]*sync.Pool // of *macState; HMAC state is reused, not rebuilt per check
	seals   sync.Pool             // of *macState, under the forward-seal key
}

// macState is an HMAC with its output buffer, pooled together so a check
// does not allocate.
type macState struct {
	h   hash.Hash
	out [sha256.Size]byte
}

// NewKeyring derives the keys with the given ids from the cluster secret;
// the last id is the one Mint uses.
func NewKeyring(s secret.Secret, keyIDs ...uint32) *Keyring {
	if len(keyIDs) == 0 {
		keyIDs = []uint32{1}
	}
	k := &Keyring{current: keyIDs[len(keyIDs)-1], macs: make(map[uint32]*sync.Pool, len(keyIDs))}
	for _, id := range keyIDs {
		key := s.Derive(secret.PurposeCapability, uint64(id))
		k.macs[id] = &sync.Pool{New: func() any { return &macState{h: hmac.New(sha256.New, key)} }}
	}
	fwd := s.Derive(secret.PurposeForward, 0)
	k.seals.New = func() any { return &macState{h: hmac.New(sha256.New, fwd)} }
	return k
}

// Seal returns the MAC a node puts on a request it forwards to another
// node, so the receiver knows a node (not a client, which never holds the
// cluster secret) produced it.
func (k *Keyring) Seal(body []byte) [MACSize]byte {
	m := k.seals.Get().(*macState)
	m.h.Reset()
	m.h.Write(body)
	var out [MACSize]byte
	copy(out[:], m.h.Sum(m.out[:0]))
	k.seals.Put(m)
	return out
}

// CheckSeal reports whether seal is Seal(body).
func (k *Keyring) CheckSeal(body, seal []byte) bool {
	want := k.Seal(body)
	return hmac.Equal(want[:], seal)
}

// CurrentKey is the key id Mint uses.
func (k *Keyring) CurrentKey() uint32 { return k.current }

func (k *Keyring) sum(keyID uint32, body []byte, out *[MACSize]byte) bool {
	p, ok := k.macs[keyID]
	if !ok {
		return false
	}
	m := p.Get().(*macState)
	m.h.Reset()
	m.h.Write(body)
	copy(out[:], m.h.Sum(m.out[:0]))
	p.Put(m)
	return true
}

// Mint seals c with the current key and returns its encoding.
func (k *Keyring) Mint(c *Capability) []byte {
	c.KeyID = k.current
	body := c.appendBody(make([]byte, 0, c.Size()))
	k.sum(c.KeyID, body, &c.MAC)
	return append(body, c.MAC[:]...)
}

// Open decodes the capability at the front of b into c, authenticates it
// and checks it has not expired at now (unix nanoseconds). It returns the
// number of bytes the capability used. It does not allocate.
func (k *Keyring) Open(b []byte, now int64, c *Capability) (int, error) {
	n, err := Decode(b, c)
	if err != nil {
		return 0, err
	}
	var want [MACSize]byte
	if !k.sum(c.KeyID, b[:n-MACSize], &want) {
		return 0, fmt.Errorf("%w %d", ErrUnknownKey, c.KeyID)
	}
	if !hmac.Equal(want[:], c.MAC[:]) {
		return 0, ErrBadMAC
	}
	if now > c.Expiry {
		return 0, fmt.Errorf("%w at %s", ErrExpired, time.Unix(0, c.Expiry).UTC().Format(time.RFC3339))
	}
	return n, nil
}
