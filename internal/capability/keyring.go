package capability

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"hash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/secret"
)

// Bounds on what a Keyring holds (they come from meta over the network).
const (
	MaxKeys        = 16
	MaxRevocations = 4096
)

// Keyring holds the MAC keys by id and the revocations to enforce. Meta
// mints with the current key; nodes accept any key on the ring, so keys
// rotate by adding a new id, minting with it, and dropping the old one
// once everything it signed has expired (docs/capkeys.md). Keys are
// derived from the cluster secret: only key ids ever travel.
//
// Set replaces the keys and revocations while checks run: Open and Mint
// read one immutable set through an atomic pointer, so a check takes no
// lock and allocates nothing. A Keyring is safe for concurrent use.
type Keyring struct {
	sec   secret.Secret
	set   atomic.Pointer[keySet]
	mu    sync.Mutex // serialises Set
	seals sync.Pool  // of *macState, under the forward-seal key
}

// keySet is one immutable generation of what a Keyring accepts.
type keySet struct {
	acc     Accepted               // as given (copied)
	current uint32                 // the key Mint uses
	macs    map[uint32]*sync.Pool  // of *macState; HMAC state is reused, not rebuilt per check
	revoked map[ids.ClientID]int64 // client -> refuse what was issued at or before
}

// Revocation refuses Client's capabilities issued at or before Before
// (unix nanoseconds, meta's clock: Issued is stamped by the same clock).
type Revocation struct {
	Client ids.ClientID
	Before int64
}

// Accepted is what a Keyring accepts.
type Accepted struct {
	// Keys are the key ids accepted; the last is the one Mint uses.
	Keys    []uint32
	Revoked []Revocation
	// RevokedBefore, if not 0, refuses every client's capabilities issued
	// at or before it (what meta falls back to when too many clients were
	// revoked at once to list them).
	RevokedBefore int64
}

// Equal reports whether a and b accept the same.
func (a Accepted) Equal(b Accepted) bool {
	return slices.Equal(a.Keys, b.Keys) && slices.Equal(a.Revoked, b.Revoked) && a.RevokedBefore == b.RevokedBefore
}

// Validate checks a is within bounds and consistent.
func (a Accepted) Validate() error {
	if len(a.Keys) == 0 || len(a.Keys) > MaxKeys {
		return fmt.Errorf("capability: %d key ids, want 1 to %d", len(a.Keys), MaxKeys)
	}
	if len(a.Revoked) > MaxRevocations {
		return fmt.Errorf("capability: %d revocations, at most %d", len(a.Revoked), MaxRevocations)
	}
	for i, id := range a.Keys {
		if slices.Contains(a.Keys[:i], id) {
			return fmt.Errorf("capability: key id %d given twice", id)
		}
	}
	if a.RevokedBefore < 0 {
		return fmt.Errorf("capability: revocation time %d is negative", a.RevokedBefore)
	}
	return nil
}

// macState is an HMAC with its output buffer, pooled together so a check
// does not allocate.
type macState struct {
	h   hash.Hash
	out [sha256.Size]byte
}

// NewKeyring derives the keys with the given ids from the cluster secret;
// the last id is the one Mint uses (default: key 1 alone).
func NewKeyring(s secret.Secret, keyIDs ...uint32) *Keyring {
	if len(keyIDs) == 0 {
		keyIDs = []uint32{1}
	}
	k := &Keyring{sec: s}
	fwd := s.Derive(secret.PurposeForward, 0)
	k.seals.New = func() any { return &macState{h: hmac.New(sha256.New, fwd)} }
	if err := k.Set(Accepted{Keys: keyIDs}); err != nil {
		panic(err) // a program's own constant list of ids
	}
	return k
}

// Set replaces the keys and revocations the ring accepts, atomically for
// checks running meanwhile. Keys already on the ring keep their pooled
// HMAC state.
func (k *Keyring) Set(a Accepted) error {
	if err := a.Validate(); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	old := k.set.Load()
	ns := &keySet{
		acc:     Accepted{Keys: slices.Clone(a.Keys), Revoked: slices.Clone(a.Revoked), RevokedBefore: a.RevokedBefore},
		current: a.Keys[len(a.Keys)-1],
		macs:    make(map[uint32]*sync.Pool, len(a.Keys)),
	}
	for _, id := range a.Keys {
		if old != nil && old.macs[id] != nil {
			ns.macs[id] = old.macs[id]
			continue
		}
		key := k.sec.Derive(secret.PurposeCapability, uint64(id))
		ns.macs[id] = &sync.Pool{New: func() any { return &macState{h: hmac.New(sha256.New, key)} }}
	}
	if len(a.Revoked) > 0 {
		ns.revoked = make(map[ids.ClientID]int64, len(a.Revoked))
		for _, r := range a.Revoked {
			ns.revoked[r.Client] = max(ns.revoked[r.Client], r.Before)
		}
	}
	k.set.Store(ns)
	return nil
}

// Accepted returns what the ring accepts now.
func (k *Keyring) Accepted() Accepted {
	a := k.set.Load().acc
	return Accepted{Keys: slices.Clone(a.Keys), Revoked: slices.Clone(a.Revoked), RevokedBefore: a.RevokedBefore}
}

// Seal returns the MAC a node puts on a request it forwards to another
// node, so the receiver knows a node (not a client, which never holds the
// cluster secret) produced it. The seal key does not rotate with the
// capability keys: it only ever covers a request in flight between nodes.
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
func (k *Keyring) CurrentKey() uint32 { return k.set.Load().current }

func (s *keySet) sum(keyID uint32, body []byte, out *[MACSize]byte) bool {
	p, ok := s.macs[keyID]
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
	s := k.set.Load()
	c.KeyID = s.current
	body := c.appendBody(make([]byte, 0, c.Size()))
	s.sum(c.KeyID, body, &c.MAC)
	return append(body, c.MAC[:]...)
}

// Open decodes the capability at the front of b into c, authenticates it
// and checks it has neither expired at now (unix nanoseconds) nor been
// revoked. It returns the number of bytes the capability used. It does
// not allocate.
func (k *Keyring) Open(b []byte, now int64, c *Capability) (int, error) {
	n, err := Decode(b, c)
	if err != nil {
		return 0, err
	}
	s := k.set.Load() // one generation for the whole check
	var want [MACSize]byte
	if !s.sum(c.KeyID, b[:n-MACSize], &want) {
		return 0, fmt.Errorf("%w %d", ErrUnknownKey, c.KeyID)
	}
	if !hmac.Equal(want[:], c.MAC[:]) {
		return 0, ErrBadMAC
	}
	if now > c.Expiry {
		return 0, fmt.Errorf("%w at %s", ErrExpired, time.Unix(0, c.Expiry).UTC().Format(time.RFC3339))
	}
	if s.acc.RevokedBefore != 0 && c.Issued <= s.acc.RevokedBefore {
		return 0, fmt.Errorf("%w: every capability issued up to %s", ErrRevoked, time.Unix(0, s.acc.RevokedBefore).UTC().Format(time.RFC3339Nano))
	}
	if len(s.revoked) > 0 {
		if before, ok := s.revoked[c.Client]; ok && c.Issued <= before {
			return 0, fmt.Errorf("%w: client %v's capabilities issued up to %s", ErrRevoked, c.Client, time.Unix(0, before).UTC().Format(time.RFC3339Nano))
		}
	}
	return n, nil
}
