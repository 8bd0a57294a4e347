package capability

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
)

// Bounds on what a Keyring holds (they come from meta over the network).
const (
	MaxKeys        = 16
	MaxRevocations = 4096
)

// KeySize is the length of a capability or forward-seal key.
const KeySize = 32

// Key is one key id's material: the key that MACs capabilities and the
// key that seals headers nodes forward. Meta makes both at random
// (GenerateKey) and hands them to storage nodes over their mutual-TLS
// connection (docs/capkeys.md); nothing else can compute them.
type Key struct {
	ID  uint32
	MAC [KeySize]byte
	// Seal is zero for a key that seals nothing: one derived from the
	// cluster secret by an earlier version, accepted for capabilities
	// only until they expire.
	Seal [KeySize]byte
}

// Seals reports whether k seals forwarded headers.
func (k *Key) Seals() bool { return k.Seal != [KeySize]byte{} }

// GenerateKey makes a random key with id.
func GenerateKey(id uint32) (Key, error) {
	k := Key{ID: id}
	if _, err := rand.Read(k.MAC[:]); err != nil {
		return k, fmt.Errorf("capability: generating key %d: %w", id, err)
	}
	if _, err := rand.Read(k.Seal[:]); err != nil {
		return k, fmt.Errorf("capability: generating key %d: %w", id, err)
	}
	return k, nil
}

// Keyring holds the keys by id and the revocations to enforce. Meta
// mints with the current key; nodes accept any key on the ring, so keys
// rotate by adding a new id, minting with it, and dropping the old one
// once everything it signed has expired (docs/capkeys.md).
//
// Set replaces the keys and revocations while checks run: Open, Mint,
// Seal and CheckSeal read one immutable set through an atomic pointer,
// so a check takes no lock and allocates nothing. A Keyring is safe for
// concurrent use.
type Keyring struct {
	set atomic.Pointer[keySet]
	mu  sync.Mutex // serialises Set
}

// keySet is one immutable generation of what a Keyring accepts.
type keySet struct {
	acc     Accepted // as given (copied)
	current uint32   // the key Mint uses
	macs    map[uint32]*keyState
	// seals are the keys that seal, the current one first: a node seals
	// with it, and checks a seal against each (a node that heard of a
	// rotation before its peer seals with a key the peer has as next).
	seals   []*keyState
	revoked map[ids.ClientID]int64 // client -> refuse what was issued at or before
}

// keyState is one key's pooled HMAC states: built once per key, not per
// check.
type keyState struct {
	key        Key
	mac, seals sync.Pool // of *macState
}

func newKeyState(k Key) *keyState {
	ks := &keyState{key: k}
	ks.mac.New = func() any { return &macState{h: hmac.New(sha256.New, ks.key.MAC[:])} }
	ks.seals.New = func() any { return &macState{h: hmac.New(sha256.New, ks.key.Seal[:])} }
	return ks
}

// Revocation refuses Client's capabilities issued at or before Before
// (unix nanoseconds, meta's clock: Issued is stamped by the same clock).
type Revocation struct {
	Client ids.ClientID
	Before int64
}

// Accepted is what a Keyring accepts.
type Accepted struct {
	// Keys are the keys accepted; the last is the one Mint uses.
	Keys    []Key
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
	for i, k := range a.Keys {
		if slices.ContainsFunc(a.Keys[:i], func(o Key) bool { return o.ID == k.ID }) {
			return fmt.Errorf("capability: key id %d given twice", k.ID)
		}
		if k.MAC == [KeySize]byte{} {
			return fmt.Errorf("capability: key %d is all zeros", k.ID)
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

// NewKeyring returns a ring accepting keys; the last is the one Mint
// uses. With none it accepts nothing (a node that has not heard from
// meta yet) until Set.
func NewKeyring(keys ...Key) *Keyring {
	k := &Keyring{}
	if len(keys) == 0 {
		k.set.Store(&keySet{})
		return k
	}
	if err := k.Set(Accepted{Keys: keys}); err != nil {
		panic(err) // a program's own keys
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
		current: a.Keys[len(a.Keys)-1].ID,
		macs:    make(map[uint32]*keyState, len(a.Keys)),
	}
	for i := len(a.Keys) - 1; i >= 0; i-- { // current first
		key := a.Keys[i]
		ks := newKeyState(key)
		if old != nil && old.macs[key.ID] != nil && old.macs[key.ID].key == key {
			ks = old.macs[key.ID]
		}
		ns.macs[key.ID] = ks
		if key.Seals() {
			ns.seals = append(ns.seals, ks)
		}
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
// node, so the receiver knows a node (not a client, which never holds a
// seal key) produced it. It uses the newest key that seals; a ring with
// none gives a seal no ring accepts.
func (k *Keyring) Seal(body []byte) [MACSize]byte {
	var out [MACSize]byte
	if s := k.set.Load(); len(s.seals) > 0 {
		s.seals[0].seal(body, &out)
	}
	return out
}

// CheckSeal reports whether seal is Seal(body) under a key on the ring.
func (k *Keyring) CheckSeal(body, seal []byte) bool {
	var want [MACSize]byte
	for _, ks := range k.set.Load().seals {
		ks.seal(body, &want)
		if hmac.Equal(want[:], seal) {
			return true
		}
	}
	return false
}

func (ks *keyState) seal(body []byte, out *[MACSize]byte) {
	m := ks.seals.Get().(*macState)
	m.h.Reset()
	m.h.Write(body)
	copy(out[:], m.h.Sum(m.out[:0]))
	ks.seals.Put(m)
}

// CurrentKey is the key id Mint uses.
func (k *Keyring) CurrentKey() uint32 { return k.set.Load().current }

func (s *keySet) sum(keyID uint32, body []byte, out *[MACSize]byte) bool {
	ks, ok := s.macs[keyID]
	if !ok {
		return false
	}
	m := ks.mac.Get().(*macState)
	m.h.Reset()
	m.h.Write(body)
	copy(out[:], m.h.Sum(m.out[:0]))
	ks.mac.Put(m)
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
