package meta

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/capability"
	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/metaapi"
)

const (
	testCapTTL    = 10 * time.Minute
	testCapRotate = time.Hour
)

func capKeysFixture(t *testing.T, mods ...func(*Options)) *fixture {
	t.Helper()
	return newFixture(t, append([]func(*Options){func(o *Options) {
		o.CapabilityTTL, o.CapKeyRotate = testCapTTL, testCapRotate
	}}, mods...)...)
}

// nodeRing is a storage node's keyring as the heartbeat r sets it.
func (f *fixture) nodeRing(r metaapi.HeartbeatResp) *capability.Keyring {
	f.t.Helper()
	if r.CapKeys == nil {
		f.t.Fatal("heartbeat says nothing of capability keys")
	}
	a, err := r.CapKeys.Accepted()
	if err != nil {
		f.t.Fatal(err)
	}
	k := capability.NewKeyring()
	if err := k.Set(a); err != nil {
		f.t.Fatal(err)
	}
	return k
}

// capOf opens the first capability of a layout under ring at the fake
// clock's now.
func (f *fixture) capOf(ring *capability.Keyring, l metaapi.LayoutResp) (capability.Capability, error) {
	var c capability.Capability
	_, err := ring.Open(l.Chunks[0].Cap, f.clk.Now().UnixNano(), &c)
	return c, err
}

func TestCapKeysRotate(t *testing.T) {
	f := capKeysFixture(t)
	nodes := f.addNodes(3)
	f.tree("/f")
	hb := f.heartbeat(nodes[0])
	if want := []uint32{2, 1}; !slices.Equal(hb.CapKeys.IDs(), want) {
		t.Fatalf("keys %v on a fresh meta, want %v (the next announced before use)", hb.CapKeys.IDs(), want)
	}
	ring := f.nodeRing(hb)

	// Not yet due: nothing changes.
	f.clk.Advance(testCapRotate - time.Second)
	f.s.tickCapKeys()
	if k := f.s.keys.CurrentKey(); k != 1 {
		t.Fatalf("rotated early to %d", k)
	}
	for _, n := range nodes {
		f.heartbeat(n)
	}
	old := f.layout("/f", 0, 1, true)
	c, err := f.capOf(ring, old)
	if err != nil || c.KeyID != 1 || c.Issued != f.clk.Now().UnixNano() || c.Client != 7 {
		t.Fatalf("capability before the rotation: key %d issued %d client %v, %v", c.KeyID, c.Issued, c.Client, err)
	}
	f.clk.Advance(time.Second)
	rotatedAt := f.clk.Now()
	f.s.tickCapKeys()
	if k := f.s.keys.CurrentKey(); k != 2 {
		t.Fatalf("current key %d after a period, want 2", k)
	}
	// A node that heard only before the rotation takes what the new key
	// signs (announced in advance), and the old key's capabilities.
	fresh := f.layout("/f", 0, 1, true)
	if c, err := f.capOf(ring, fresh); err != nil || c.KeyID != 2 {
		t.Fatalf("new key's capability on a node told before the rotation: key %d, %v", c.KeyID, err)
	}
	hb = f.heartbeat(nodes[0])
	if want := []uint32{1, 3, 2}; !slices.Equal(hb.CapKeys.IDs(), want) {
		t.Fatalf("keys %v after the rotation, want %v", hb.CapKeys.IDs(), want)
	}
	ring = f.nodeRing(hb)
	for _, l := range []metaapi.LayoutResp{old, fresh} {
		if _, err := f.capOf(ring, l); err != nil {
			t.Fatalf("after the rotation: %v", err)
		}
	}

	// Key 1 retires once what it signed has expired (with the slack).
	f.clk.Advance(testCapTTL + CapClockSkew - time.Second)
	f.s.tickCapKeys()
	if hb := f.heartbeat(nodes[0]); !slices.Contains(hb.CapKeys.IDs(), 1) {
		t.Fatalf("key 1 dropped before its capabilities expired: %v", hb.CapKeys.IDs())
	}
	f.clk.Advance(time.Second)
	f.s.tickCapKeys()
	hb = f.heartbeat(nodes[0])
	if want := []uint32{3, 2}; !slices.Equal(hb.CapKeys.IDs(), want) {
		t.Fatalf("keys %v past key 1's capabilities' expiry (rotated at %v), want %v", hb.CapKeys.IDs(), rotatedAt, want)
	}
	var c1 capability.Capability
	if _, err := f.nodeRing(hb).Open(old.Chunks[0].Cap, rotatedAt.UnixNano(), &c1); !errors.Is(err, capability.ErrUnknownKey) {
		t.Fatalf("retired key's capability: %v, want ErrUnknownKey", err)
	}
	// Register tells a (re)starting node the same.
	r, err := f.s.Register(metaapi.RegisterReq{ID: nodes[1], Addr: "127.0.0.1:9002", Capacity: 1 << 40, Free: 1 << 40})
	if err != nil || r.CapKeys == nil || !slices.Equal(r.CapKeys.IDs(), hb.CapKeys.IDs()) {
		t.Fatalf("register: %+v, %v", r.CapKeys, err)
	}
}

// TestCapKeysSurviveRestart: the current key, when it began, the retired
// keys and the revocations are kept; a restart neither reuses an id nor
// restarts the period.
func TestCapKeysSurviveRestart(t *testing.T) {
	f := capKeysFixture(t, onDisk)
	nodes := f.addNodes(1)
	for range 2 {
		f.clk.Advance(testCapRotate)
		f.s.tickCapKeys()
	}
	f.clk.Advance(time.Minute)
	if err := f.s.RevokeCapabilities(9); err != nil {
		t.Fatal(err)
	}
	before := f.heartbeat(nodes[0]).CapKeys
	if want := []uint32{2, 4, 3}; !slices.Equal(before.IDs(), want) {
		t.Fatalf("keys %v, want %v", before.IDs(), want)
	}

	f.reopen()
	after := f.heartbeat(nodes[0]).CapKeys
	// The same keys, material and all: they are kept, not made again.
	if !reflect.DeepEqual(after.Keys, before.Keys) || !slices.Equal(after.Revoked, before.Revoked) {
		t.Fatalf("after restart keys %v revoked %+v, before %v %+v", after.IDs(), after.Revoked, before.IDs(), before.Revoked)
	}
	if k := f.s.keys.CurrentKey(); k != 3 {
		t.Fatalf("current key %d after restart, want 3", k)
	}
	// What was left of the period, not a whole one.
	f.clk.Advance(testCapRotate - time.Minute - time.Second)
	f.s.tickCapKeys()
	if k := f.s.keys.CurrentKey(); k != 3 {
		t.Fatalf("rotated to %d before the period that began before the restart ended", k)
	}
	f.clk.Advance(time.Second)
	f.s.tickCapKeys()
	if k := f.s.keys.CurrentKey(); k != 4 {
		t.Fatalf("current key %d, want 4", k)
	}

	// Down for longer than a period: it rotates as it opens, to the next
	// id (announced already), never back to an old one.
	f.s.Close()
	f.clk.Advance(3 * testCapRotate)
	f.reopen()
	if k := f.s.keys.CurrentKey(); k != 5 {
		t.Fatalf("current key %d after a long stop, want 5", k)
	}
}

// TestCapKeysShorterTTLAfterRestart: what the earlier run minted with a
// longer lifetime keeps its key accepted and stays revocable.
func TestCapKeysShorterTTLAfterRestart(t *testing.T) {
	f := capKeysFixture(t, onDisk)
	nodes := f.addNodes(3)
	f.tree("/f")
	long := f.layout("/f", 0, 1, true) // lives testCapTTL
	f.opt.CapabilityTTL = time.Minute
	f.opt.CapKeyRotate = 5 * time.Minute
	f.reopen()
	f.clk.Advance(5 * time.Minute)
	f.s.tickCapKeys()
	if err := f.s.RevokeCapabilities(8); err != nil { // another client: keeps the list non-empty
		t.Fatal(err)
	}
	if err := f.s.RevokeCapabilities(7); err != nil {
		t.Fatal(err)
	}
	// Past the new lifetime, before the old one ended.
	f.clk.Advance(testCapTTL - 5*time.Minute - time.Second)
	f.s.tickCapKeys()
	hb := f.heartbeat(nodes[0])
	if !slices.Contains(hb.CapKeys.IDs(), 1) {
		t.Fatalf("key 1 retired while what it signed under the old lifetime is valid: %v", hb.CapKeys.IDs())
	}
	if _, err := f.capOf(f.nodeRing(hb), long); !errors.Is(err, capability.ErrRevoked) {
		t.Fatalf("capability minted under the old lifetime after its client's revocation: %v, want ErrRevoked", err)
	}
}

func TestRevokeCapabilities(t *testing.T) {
	f := capKeysFixture(t)
	nodes := f.addNodes(3)
	f.tree("/f")
	mine := f.layout("/f", 0, 1, true) // client 7
	other, err := f.s.Layout(8, metaapi.LayoutReq{Ino: f.ino("/f"), Len: 1, Who: root})
	if err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(time.Second)
	if err := f.s.RevokeCapabilities(7); err != nil {
		t.Fatal(err)
	}
	revokedAt := f.clk.Now().UnixNano()
	hb := f.heartbeat(nodes[0])
	if want := []metaapi.RevokedClient{{Client: 7, Before: revokedAt}}; !slices.Equal(hb.CapKeys.Revoked, want) {
		t.Fatalf("revoked %+v, want %+v", hb.CapKeys.Revoked, want)
	}
	ring := f.nodeRing(hb)
	_, err = f.capOf(ring, mine)
	if !errors.Is(err, capability.ErrRevoked) || !errors.Is(err, capability.ErrExpired) {
		t.Fatalf("revoked client's capability: %v, want ErrRevoked (an ErrExpired)", err)
	}
	if _, err := f.capOf(ring, other); err != nil {
		t.Fatalf("another client's capability: %v", err)
	}
	// Meta's own ring refuses it too (corruption reports carry one).
	if _, err := f.capOf(f.s.keys, mine); !errors.Is(err, capability.ErrRevoked) {
		t.Fatalf("meta's ring: %v", err)
	}
	// What meta mints for the client afterwards is valid.
	f.clk.Advance(time.Nanosecond)
	if _, err := f.capOf(ring, f.layout("/f", 0, 1, true)); err != nil {
		t.Fatalf("capability minted after the revocation: %v", err)
	}
	// Kept until everything it covers has expired, then forgotten.
	f.clk.Advance(testCapTTL + CapClockSkew - time.Second)
	f.s.tickCapKeys()
	if hb := f.heartbeat(nodes[0]); len(hb.CapKeys.Revoked) != 1 {
		t.Fatalf("revocation forgotten early: %+v", hb.CapKeys)
	}
	f.clk.Advance(2 * time.Second)
	f.s.tickCapKeys()
	if hb := f.heartbeat(nodes[0]); len(hb.CapKeys.Revoked) != 0 {
		t.Fatalf("revocation kept past what it covers: %+v", hb.CapKeys)
	}
}

// TestRevokeManyCollapses: past maxRevokedClients the list becomes one
// revocation of everything issued so far, bounded in what every heartbeat
// carries.
func TestRevokeManyCollapses(t *testing.T) {
	f := capKeysFixture(t)
	nodes := f.addNodes(3)
	f.tree("/f")
	l := f.layout("/f", 0, 1, true)
	for i := range maxRevokedClients {
		if err := f.s.RevokeCapabilities(ids.ClientID(100 + i)); err != nil {
			t.Fatal(err)
		}
	}
	if hb := f.heartbeat(nodes[0]); len(hb.CapKeys.Revoked) != maxRevokedClients || hb.CapKeys.RevokedBefore != 0 {
		t.Fatalf("%d revoked, all before %d", len(hb.CapKeys.Revoked), hb.CapKeys.RevokedBefore)
	}
	if _, err := f.capOf(f.s.keys, l); err != nil {
		t.Fatalf("client 7 not revoked yet: %v", err)
	}
	if err := f.s.RevokeCapabilities(99); err != nil {
		t.Fatal(err)
	}
	hb := f.heartbeat(nodes[0])
	if len(hb.CapKeys.Revoked) != 0 || hb.CapKeys.RevokedBefore != f.clk.Now().UnixNano() {
		t.Fatalf("%d revoked, all before %d", len(hb.CapKeys.Revoked), hb.CapKeys.RevokedBefore)
	}
	if _, err := f.capOf(f.nodeRing(hb), l); !errors.Is(err, capability.ErrRevoked) {
		t.Fatalf("everything revoked: %v", err)
	}
}

func TestCapKeyRotateValidated(t *testing.T) {
	for _, tc := range []struct {
		ttl, rotate time.Duration
		want        string
	}{
		{10 * time.Minute, 10 * time.Minute, "not longer than capabilities live"},
		{time.Second, 3 * time.Second, "heartbeat"},
	} {
		_, err := Open(Options{Dir: t.TempDir(), CapabilityTTL: tc.ttl, CapKeyRotate: tc.rotate, Logger: testLogger()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ttl %s, rotate %s: %v, want %q", tc.ttl, tc.rotate, err, tc.want)
		}
	}
	s, err := Open(Options{Dir: t.TempDir(), CapabilityTTL: time.Hour, CapKeyRotate: -1, Logger: testLogger(), SweepInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ids := s.capKeysLocked(0).IDs(); !slices.Equal(ids, []uint32{1}) {
		t.Fatalf("never rotating: keys %v", ids)
	}
}

// TestPrincipalChangesRevoke: rotating a principal's credential or
// removing it revokes the capabilities minted for it before.
func TestPrincipalChangesRevoke(t *testing.T) {
	f := capKeysFixture(t)
	nodes := f.addNodes(3)
	for name, change := range map[string]func(string) error{
		"rotated": func(n string) error { _, err := f.s.RotatePrincipal(n); return err },
		"removed": f.s.RemovePrincipal,
	} {
		added, err := f.s.AddPrincipal(metaapi.AuthAddReq{Name: name, Rights: metaapi.Rights{Path: "/"}})
		if err != nil {
			t.Fatal(err)
		}
		f.clk.Advance(time.Second)
		if err := change(name); err != nil {
			t.Fatal(err)
		}
		want := metaapi.RevokedClient{Client: added.Principal.ID, Before: f.clk.Now().UnixNano()}
		if hb := f.heartbeat(nodes[0]); !slices.Contains(hb.CapKeys.Revoked, want) {
			t.Fatalf("%s principal: revoked %+v, want %+v among them", name, hb.CapKeys.Revoked, want)
		}
	}
}
