package metaapi

import (
	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
)

// CapKeys tell storage nodes which capabilities to accept
// (docs/capkeys.md): the ids of the keys that MAC them (only ids travel;
// the keys are derived from the cluster secret) and the clients whose
// capabilities issued up to a time are revoked.
type CapKeys struct {
	Keys    []uint32        `json:"keys"`
	Revoked []RevokedClient `json:"revoked,omitempty"`
	// RevokedBefore, if not 0, revokes every client's capabilities
	// issued up to it (unix ns).
	RevokedBefore int64 `json:"revoked_before,omitempty"`
}

// RevokedClient: Client's capabilities issued at or before Before (unix
// ns, meta's clock) are refused.
type RevokedClient struct {
	Client ids.ClientID `json:"client"`
	Before int64        `json:"before"`
}

// Accepted converts k for capability.Keyring.Set (which validates it).
func (k *CapKeys) Accepted() capability.Accepted {
	a := capability.Accepted{Keys: k.Keys, RevokedBefore: k.RevokedBefore}
	if len(k.Revoked) > 0 {
		a.Revoked = make([]capability.Revocation, len(k.Revoked))
		for i, r := range k.Revoked {
			a.Revoked[i] = capability.Revocation{Client: r.Client, Before: r.Before}
		}
	}
	return a
}
