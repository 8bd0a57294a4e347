package metaapi

import (
	"fmt"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
)

// CapKeys tell storage nodes which capabilities to accept
// (docs/capkeys.md): the keys that MAC them and seal forwarded headers
// (random keys meta makes; they travel only in RegisterResp and
// HeartbeatResp, over the node's mutual-TLS connection) and the clients
// whose capabilities issued up to a time are revoked. Never log one.
type CapKeys struct {
	Keys    []CapKey        `json:"keys"`
	Revoked []RevokedClient `json:"revoked,omitempty"`
	// RevokedBefore, if not 0, revokes every client's capabilities
	// issued up to it (unix ns).
	RevokedBefore int64 `json:"revoked_before,omitempty"`
}

// CapKey is one key id's material (capability.Key): MAC and Seal are
// capability.KeySize bytes; Seal is empty for a key that seals nothing.
type CapKey struct {
	ID   uint32 `json:"id"`
	MAC  []byte `json:"mac"`
	Seal []byte `json:"seal,omitempty"`
}

// CapKeyOf is k's wire form.
func CapKeyOf(k capability.Key) CapKey {
	out := CapKey{ID: k.ID, MAC: k.MAC[:]}
	if k.Seals() {
		out.Seal = k.Seal[:]
	}
	return out
}

// Key decodes k.
func (k CapKey) Key() (capability.Key, error) {
	out := capability.Key{ID: k.ID}
	if len(k.MAC) != capability.KeySize || len(k.Seal) != 0 && len(k.Seal) != capability.KeySize {
		return out, fmt.Errorf("capability key %d: %d and %d bytes, want %d", k.ID, len(k.MAC), len(k.Seal), capability.KeySize)
	}
	copy(out.MAC[:], k.MAC)
	copy(out.Seal[:], k.Seal)
	return out, nil
}

// RevokedClient: Client's capabilities issued at or before Before (unix
// ns, meta's clock) are refused.
type RevokedClient struct {
	Client ids.ClientID `json:"client"`
	Before int64        `json:"before"`
}

// CapKeysOf is a's wire form.
func CapKeysOf(a capability.Accepted) *CapKeys {
	out := &CapKeys{Keys: make([]CapKey, len(a.Keys)), RevokedBefore: a.RevokedBefore}
	for i, k := range a.Keys {
		out.Keys[i] = CapKeyOf(k)
	}
	for _, r := range a.Revoked {
		out.Revoked = append(out.Revoked, RevokedClient{Client: r.Client, Before: r.Before})
	}
	return out
}

// Accepted converts k for capability.Keyring.Set (which validates the
// rest).
func (k *CapKeys) Accepted() (capability.Accepted, error) {
	a := capability.Accepted{RevokedBefore: k.RevokedBefore}
	if len(k.Keys) > capability.MaxKeys {
		return a, fmt.Errorf("%d capability keys, at most %d", len(k.Keys), capability.MaxKeys)
	}
	a.Keys = make([]capability.Key, len(k.Keys))
	for i, ck := range k.Keys {
		var err error
		if a.Keys[i], err = ck.Key(); err != nil {
			return a, err
		}
	}
	if len(k.Revoked) > 0 {
		a.Revoked = make([]capability.Revocation, len(k.Revoked))
		for i, r := range k.Revoked {
			a.Revoked[i] = capability.Revocation{Client: r.Client, Before: r.Before}
		}
	}
	return a, nil
}

// IDs are the key ids k names (what may be logged of it).
func (k *CapKeys) IDs() []uint32 {
	out := make([]uint32, len(k.Keys))
	for i, ck := range k.Keys {
		out[i] = ck.ID
	}
	return out
}
