package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/metaapi"
)

// Capability keys (docs/capkeys.md): meta tells the node, with its
// registration and every heartbeat, which keys to accept (the random keys
// themselves: the node derives nothing) and which clients' capabilities
// are revoked. The node swaps its keyring at once
// (checks in flight keep the set they loaded) and keeps a copy in its
// data directory, so after a restart it accepts what it last knew until
// meta tells it again.

const capKeysFile = "capkeys.json"

// newKeyring is the node's keyring as it last knew it (accepting nothing
// if it never heard from meta: it does at registration).
func (n *Node) newKeyring() *capability.Keyring {
	k := capability.NewKeyring()
	raw, err := os.ReadFile(filepath.Join(n.opts.DataDir, capKeysFile))
	if errors.Is(err, os.ErrNotExist) {
		return k
	}
	var ck metaapi.CapKeys
	if err == nil {
		err = json.Unmarshal(raw, &ck)
	}
	var a capability.Accepted
	if err == nil {
		a, err = ck.Accepted()
	}
	if err == nil {
		err = k.Set(a)
	}
	if err != nil {
		// Meta tells it again at registration, a moment from now.
		n.log.Warn("ignoring the capability keys last known", "file", capKeysFile, "err", err)
	}
	return k
}

// applyCapKeys makes what meta said the node's keyring (nil: meta said
// nothing; keep what it knows).
func (n *Node) applyCapKeys(ck *metaapi.CapKeys) {
	if ck == nil {
		return
	}
	a, err := ck.Accepted()
	if err != nil {
		n.log.Error("capability keys from meta refused", "err", err)
		return
	}
	n.capKeysMu.Lock()
	defer n.capKeysMu.Unlock()
	if a.Equal(n.keys.Accepted()) {
		return
	}
	if err := n.keys.Set(a); err != nil {
		n.log.Error("capability keys from meta refused", "err", err)
		return
	}
	n.log.Debug("capability keys", "keys", ck.IDs(), "revoked", len(a.Revoked), "revoked_before", a.RevokedBefore)
	raw, err := json.Marshal(ck)
	if err == nil {
		err = saveFile(n.opts.DataDir, capKeysFile, raw)
	}
	if err != nil {
		n.log.Warn("saving the capability keys", "err", fmt.Errorf("node: %w", err))
	}
}
