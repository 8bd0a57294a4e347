package meta

import (
	"fmt"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
	"github.com/sluicefs/sluice/internal/secret"
)

// Capability keys and revocation (docs/capkeys.md). Meta mints under the
// current key id and moves to the next one every CapKeyRotate; a retired
// key stays accepted until everything it signed has expired. Every key is
// random (capability.GenerateKey), made by meta and kept in its state;
// nodes get the keys and the revoked clients from every RegisterResp and
// HeartbeatResp, over their mutual-TLS connection. The next key is
// announced a whole period before meta mints with it, so no node refuses
// a capability because it has not heard of its key yet.
//
// The state is one record (keyCapKeys) so a restart neither reuses a key
// id nor forgets a key or a revocation; in memory it is Service.capKeys,
// under mu.

// Defaults: how long a capability lives, how often the key rotates.
const (
	DefaultCapabilityTTL = 10 * time.Minute
	DefaultCapKeyRotate  = 24 * time.Hour
)

// maxRevokedClients bounds the clients revoked one by one (the list goes
// to every node with every heartbeat); past it, meta revokes every
// client's capabilities issued so far at once (clients fetch new ones).
const maxRevokedClients = 1024

// maxRetiredKeys bounds the retired keys kept accepted (with the current
// and the next key they fit capability.MaxKeys).
const maxRetiredKeys = capability.MaxKeys - 2

// CapClockSkew is how long after a retired key's or a revocation's
// capabilities have all expired by meta's clock meta keeps it. Nodes
// judge expiry by their own clock: a node whose clock is behind meta's
// by less than this still refuses a revoked capability (and still
// accepts a retired key's) for as long as it takes it for unexpired. It
// also covers meta's clock stepping back between minting and retiring.
// Clocks further apart than this are a misconfiguration (docs/capkeys.md).
const CapClockSkew = 10 * time.Minute

type capKeyState struct {
	Current uint32 `json:"current"`
	Since   int64  `json:"since"` // unix ns: when Current began minting
	// Retired keys whose capabilities may not all have expired yet.
	Retired []retiredKey `json:"retired,omitempty"`
	// Keys hold the material of the current key, the next and the retired
	// ones (random keys; an earlier version's state has none: its keys
	// derive from the cluster secret, see upgradeDerived).
	Keys    []metaapi.CapKey `json:"keys,omitempty"`
	Revoked []revokedClient  `json:"revoked,omitempty"`
	// RevokedBefore (until RevokedUntil) revokes every client's
	// capabilities issued up to it: the list collapsed (maxRevokedClients).
	RevokedBefore int64 `json:"revoked_before,omitempty"`
	RevokedUntil  int64 `json:"revoked_until,omitempty"`
	// TTL is the capability lifetime of the meta that wrote the record,
	// and OldUntil when everything minted before it started expires: a
	// restart with a shorter lifetime must not let a key or a revocation
	// go while what earlier runs minted is still valid.
	TTL      int64 `json:"ttl"`
	OldUntil int64 `json:"old_until,omitempty"`
}

type retiredKey struct {
	ID    uint32 `json:"id"`
	Until int64  `json:"until"` // unix ns: everything it signed has expired
}

type revokedClient struct {
	Client ids.ClientID `json:"client"`
	Before int64        `json:"before"` // refuse what was issued at or before
	Until  int64        `json:"until"`  // then nothing issued before is valid anyway
}

func (st capKeyState) clone() capKeyState {
	st.Retired, st.Revoked, st.Keys = slices.Clone(st.Retired), slices.Clone(st.Revoked), slices.Clone(st.Keys)
	return st
}

// expiredBy is when every capability minted up to t has expired.
func (st *capKeyState) expiredBy(t int64) int64 {
	return max(t+st.TTL, st.OldUntil) + int64(CapClockSkew)
}

// key is the material of key id, if meta has it.
func (st *capKeyState) key(id uint32) (metaapi.CapKey, bool) {
	i := slices.IndexFunc(st.Keys, func(k metaapi.CapKey) bool { return k.ID == id })
	if i < 0 {
		return metaapi.CapKey{}, false
	}
	return st.Keys[i], true
}

// makeKeys makes the random keys the state lacks: the current one and,
// when rotating, the next. It reports a change.
func (st *capKeyState) makeKeys(rotating bool) (bool, error) {
	want := []uint32{st.Current}
	if rotating {
		want = append(want, nextKeyID(st.Current))
	}
	changed := false
	for _, id := range want {
		if _, ok := st.key(id); ok {
			continue
		}
		k, err := capability.GenerateKey(id)
		if err != nil {
			return changed, err
		}
		st.Keys, changed = append(st.Keys, metaapi.CapKeyOf(k)), true
	}
	return changed, nil
}

// upgradeDerived moves a state an earlier version wrote, whose keys all
// derive from the cluster secret, to random keys at now: the derived
// keys still needed (by what they signed) are kept as material, only
// until everything they signed has expired, and never seal; the current
// key retires at once. The id announced as next is skipped, so no id
// ever names two keys. derive is the derived key of an id.
func (st *capKeyState) upgradeDerived(now int64, derive func(id uint32) []byte) {
	// What the earlier version kept it kept for 1 min of clock skew only.
	more := int64(CapClockSkew - time.Minute)
	for i := range st.Retired {
		st.Retired[i].Until += more
	}
	for i := range st.Revoked {
		st.Revoked[i].Until += more
	}
	if st.RevokedUntil != 0 {
		st.RevokedUntil += more
	}
	st.Keys = nil
	for _, id := range append(st.retiredIDs(now), st.Current) {
		st.Keys = append(st.Keys, metaapi.CapKey{ID: id, MAC: derive(id)})
	}
	st.rotate(now)
	st.Current = nextKeyID(st.Current)
}

func (st *capKeyState) retiredIDs(now int64) []uint32 {
	var out []uint32
	for _, r := range st.Retired {
		if r.Until > now {
			out = append(out, r.ID)
		}
	}
	return out
}

// nextKeyID follows id (skipping 0 if it ever wraps).
func nextKeyID(id uint32) uint32 { return max(id+1, 1) }

// prune drops what no longer matters at now; it reports a change.
func (st *capKeyState) prune(now int64) bool {
	n, m := len(st.Retired), len(st.Revoked)
	st.Retired = slices.DeleteFunc(st.Retired, func(r retiredKey) bool { return r.Until <= now })
	st.Revoked = slices.DeleteFunc(st.Revoked, func(r revokedClient) bool { return r.Until <= now })
	changed := n != len(st.Retired) || m != len(st.Revoked)
	changed = st.dropUnusedKeys() || changed
	if st.RevokedBefore != 0 && st.RevokedUntil <= now {
		st.RevokedBefore, st.RevokedUntil, changed = 0, 0, true
	}
	if st.OldUntil != 0 && st.OldUntil <= now {
		st.OldUntil, changed = 0, true
	}
	return changed
}

// dropUnusedKeys forgets the material of keys no longer accepted: only
// the current, the next (kept once made) and the retired ones stay. It
// reports a change.
func (st *capKeyState) dropUnusedKeys() bool {
	n := len(st.Keys)
	st.Keys = slices.DeleteFunc(st.Keys, func(key metaapi.CapKey) bool {
		return key.ID != st.Current && key.ID != nextKeyID(st.Current) &&
			!slices.ContainsFunc(st.Retired, func(r retiredKey) bool { return r.ID == key.ID })
	})
	return n != len(st.Keys)
}

// rotationDue reports whether the current key has minted for a period.
func (st *capKeyState) rotationDue(now int64, period time.Duration) bool {
	return period > 0 && now-st.Since >= int64(period)
}

// rotate retires the current key at now and moves to the next.
func (st *capKeyState) rotate(now int64) {
	st.Retired = append(st.Retired, retiredKey{ID: st.Current, Until: st.expiredBy(now)})
	if len(st.Retired) > maxRetiredKeys {
		// Only after restarts that shortened the lifetime: refusing the
		// oldest early costs its holders a fresh layout, nothing more.
		st.Retired = st.Retired[len(st.Retired)-maxRetiredKeys:]
	}
	st.Current, st.Since = nextKeyID(st.Current), now
	st.dropUnusedKeys()
}

// revoke refuses client's capabilities issued up to now.
func (st *capKeyState) revoke(client ids.ClientID, now int64) {
	until := st.expiredBy(now)
	st.Revoked = slices.DeleteFunc(st.Revoked, func(r revokedClient) bool { return r.Client == client })
	st.Revoked = append(st.Revoked, revokedClient{Client: client, Before: now, Until: until})
	if len(st.Revoked) > maxRevokedClients {
		st.Revoked = nil
		st.RevokedBefore, st.RevokedUntil = now, until
	}
}

// accepted is what a keyring accepts at now: the retired keys still
// needed, the next key if rotating (announced before it is used), and
// the current key last (the one Mint uses). A key whose material is
// missing or damaged (only from a damaged record) is left out.
func (st *capKeyState) accepted(now int64, rotating bool) capability.Accepted {
	var a capability.Accepted
	add := func(id uint32) {
		if ck, ok := st.key(id); ok {
			if k, err := ck.Key(); err == nil {
				a.Keys = append(a.Keys, k)
			}
		}
	}
	for _, r := range st.Retired {
		if r.Until > now && r.ID != st.Current && r.ID != nextKeyID(st.Current) {
			add(r.ID)
		}
	}
	if rotating {
		add(nextKeyID(st.Current))
	}
	add(st.Current)
	for _, r := range st.Revoked {
		if r.Until > now {
			a.Revoked = append(a.Revoked, capability.Revocation{Client: r.Client, Before: r.Before})
		}
	}
	if st.RevokedUntil > now {
		a.RevokedBefore = st.RevokedBefore
	}
	return a
}

// checkCapKeys validates the rotation period against the lifetime.
func (o *Options) checkCapKeys() error {
	if o.CapKeyRotate <= 0 {
		return nil
	}
	if o.CapKeyRotate <= o.CapabilityTTL {
		return fmt.Errorf("capability keys rotating every %s, not longer than capabilities live (%s): a key would retire while what it signed is still valid",
			o.CapKeyRotate, o.CapabilityTTL)
	}
	if o.CapKeyRotate < 5*o.HeartbeatInterval {
		return fmt.Errorf("capability keys rotating every %s: at least 5 heartbeat intervals (%s) so nodes hear of each key before it is used",
			o.CapKeyRotate, 5*o.HeartbeatInterval)
	}
	return nil
}

// openCapKeys loads the key state at startup (creating it on first
// start: a random key 1), rotating if a period has passed while meta was
// down or the state is an earlier version's (keys derived from the
// cluster secret), and persists it with this run's lifetime.
func (s *Service) openCapKeys() error {
	if err := s.opts.checkCapKeys(); err != nil {
		return err
	}
	now := s.opts.Now().UnixNano()
	var st capKeyState
	found, err := getJSON(s.db, keyCapKeys, &st)
	if err != nil {
		return fmt.Errorf("reading the capability key state: %w", err)
	}
	if !found {
		st = capKeyState{Current: 1, Since: now}
	}
	if st.Current == 0 || st.TTL < 0 || len(st.Retired) > maxRetiredKeys || len(st.Revoked) > maxRevokedClients || len(st.Keys) > capability.MaxKeys {
		return fmt.Errorf("capability key state is corrupt: key %d, lifetime %d, %d retired keys, %d revocations",
			st.Current, st.TTL, len(st.Retired), len(st.Revoked))
	}
	prevTTL := st.TTL
	if prevTTL == 0 {
		prevTTL = int64(s.opts.CapabilityTTL) // a version that did not record it
	}
	// Everything earlier runs minted, they minted before now.
	st.OldUntil = max(st.OldUntil, now+prevTTL)
	st.TTL = int64(s.opts.CapabilityTTL)
	st.prune(now)
	if found && len(st.Keys) == 0 {
		st.upgradeDerived(now, func(id uint32) []byte { return s.sec.Derive(secret.PurposeCapability, uint64(id)) })
		s.log.Warn("capability keys: moving from keys derived from the cluster secret to random keys",
			"key", st.Current, "derived_keys_accepted_until", time.Unix(0, st.expiredBy(now)).UTC().Format(time.RFC3339))
	} else if st.rotationDue(now, s.opts.CapKeyRotate) {
		st.rotate(now)
	}
	if _, err := st.makeKeys(s.opts.CapKeyRotate > 0); err != nil {
		return err
	}
	if err := s.db.Set(keyCapKeys, mustJSON(&st), pebble.Sync); err != nil {
		return fmt.Errorf("recording the capability key state: %w", err)
	}
	s.capKeys = st
	if err := s.keys.Set(st.accepted(now, s.opts.CapKeyRotate > 0)); err != nil {
		return fmt.Errorf("capability key state: %w", err)
	}
	return nil
}

// setCapKeys records st in tx and makes it current once committed.
func (s *Service) setCapKeys(tx *txn, st capKeyState) error {
	if err := tx.setJSON(keyCapKeys, &st); err != nil {
		return err
	}
	now := tx.now
	tx.after = append(tx.after, func() {
		old := s.capKeys.Current
		s.capKeys = st
		if err := s.keys.Set(st.accepted(now, s.opts.CapKeyRotate > 0)); err != nil {
			s.log.Error("capability keys", "err", err) // bounded above: cannot happen
		}
		if st.Current != old {
			s.log.Info("capability key rotated", "key", st.Current, "previous", old)
		}
	})
	return nil
}

// tickCapKeys rotates the key when due and forgets retired keys and
// revocations whose capabilities have all expired (the sweeper calls it).
func (s *Service) tickCapKeys() {
	now := s.opts.Now().UnixNano()
	s.mu.RLock()
	st := s.capKeys.clone()
	due := st.prune(now) || st.rotationDue(now, s.opts.CapKeyRotate)
	s.mu.RUnlock()
	if !due {
		return
	}
	err := s.update(func(tx *txn) error {
		st := s.capKeys.clone()
		st.prune(tx.now)
		if st.rotationDue(tx.now, s.opts.CapKeyRotate) {
			st.rotate(tx.now)
		}
		if _, err := st.makeKeys(s.opts.CapKeyRotate > 0); err != nil {
			return err
		}
		return s.setCapKeys(tx, st)
	})
	if err != nil && err != errClosed {
		s.log.Error("rotating capability keys", "err", err)
	}
}

// RevokeCapabilities refuses, on every storage node within a heartbeat
// or two, the capabilities already minted for client (those issued up to
// now); the ones minted from now on are valid. The revocation is kept
// until everything it covers has expired. A client refused this way
// fetches a fresh layout, as for an expired capability.
func (s *Service) RevokeCapabilities(client ids.ClientID) error {
	return s.update(func(tx *txn) error {
		st := s.capKeys.clone()
		st.prune(tx.now)
		st.revoke(client, tx.now)
		return s.setCapKeys(tx, st)
	})
}

// capKeysLocked is what nodes are told to accept. Needs s.mu.
func (s *Service) capKeysLocked(now int64) *metaapi.CapKeys {
	return metaapi.CapKeysOf(s.capKeys.accepted(now, s.opts.CapKeyRotate > 0))
}

// Keyring is the ring meta mints with (for in-process harnesses and
// tests that mint capabilities as meta does).
func (s *Service) Keyring() *capability.Keyring { return s.keys }
