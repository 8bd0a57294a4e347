package capability

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestSetRotates: after a swap the ring mints with the new last key,
// accepts what the set names and refuses a key it dropped.
func TestSetRotates(t *testing.T) {
	meta := NewKeyring(testKeys(1, 1)...)
	node := NewKeyring(testKeys(1, 1)...)
	c := sample()
	old := meta.Mint(&c)
	if err := meta.Set(Accepted{Keys: testKeys(1, 1, 2)}); err != nil {
		t.Fatal(err)
	}
	if meta.CurrentKey() != 2 {
		t.Fatalf("current key %d after rotation, want 2", meta.CurrentKey())
	}
	c2 := sample()
	fresh := meta.Mint(&c2)
	if c2.KeyID != 2 {
		t.Fatalf("minted with key %d, want 2", c2.KeyID)
	}
	now := time.Now().UnixNano()
	var got Capability
	// A node that has not learned key 2 refuses what it signed...
	if _, err := node.Open(fresh, now, &got); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("node without key 2: %v, want ErrUnknownKey", err)
	}
	// ... and accepts it once told.
	if err := node.Set(Accepted{Keys: testKeys(1, 1, 2, 3)}); err != nil {
		t.Fatal(err)
	}
	for _, raw := range [][]byte{old, fresh} {
		if _, err := node.Open(raw, now, &got); err != nil {
			t.Fatalf("node with keys 1-3: %v", err)
		}
	}
	// The previous key retired: what it signed is refused.
	if err := node.Set(Accepted{Keys: testKeys(1, 2, 3)}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.Open(old, now, &got); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("retired key 1: %v, want ErrUnknownKey", err)
	}
	if _, err := node.Open(fresh, now, &got); err != nil {
		t.Fatalf("key 2 after retiring 1: %v", err)
	}
	if a := node.Accepted(); !a.Equal(Accepted{Keys: testKeys(1, 2, 3)}) {
		t.Fatalf("Accepted() = %+v", a)
	}
	// Forwarded-request seals do not depend on the key ids.
	body := []byte("forwarded")
	if s := meta.Seal(body); !node.CheckSeal(body, s[:]) {
		t.Fatal("seal refused across key sets")
	}
}

func TestRevocation(t *testing.T) {
	k := NewKeyring(testKeys(1, 1)...)
	now := time.Now().UnixNano()
	mint := func(client ids.ClientID, issued int64) []byte {
		c := sample()
		c.Client, c.Issued = client, issued
		return k.Mint(&c)
	}
	const at = int64(1_700_000_000_000_000_000)
	if err := k.Set(Accepted{Keys: testKeys(1, 1), Revoked: []Revocation{{Client: 7, Before: at}, {Client: 9, Before: at - 10}}}); err != nil {
		t.Fatal(err)
	}
	var got Capability
	cases := []struct {
		name    string
		raw     []byte
		revoked bool
	}{
		{"issued before", mint(7, at-1), true},
		{"issued at", mint(7, at), true},
		{"issued after", mint(7, at+1), false},
		{"other client", mint(8, at-1), false},
		{"second entry", mint(9, at-10), true},
		{"second entry, after", mint(9, at-9), false},
	}
	for _, tc := range cases {
		_, err := k.Open(tc.raw, now, &got)
		if tc.revoked != (err != nil) {
			t.Errorf("%s: %v, want revoked=%v", tc.name, err, tc.revoked)
		}
		if err != nil && (!errors.Is(err, ErrRevoked) || !errors.Is(err, ErrExpired)) {
			t.Errorf("%s: %v is not ErrRevoked and ErrExpired", tc.name, err)
		}
	}
	// Every client at once.
	if err := k.Set(Accepted{Keys: testKeys(1, 1), RevokedBefore: at}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Open(mint(8, at), now, &got); !errors.Is(err, ErrRevoked) {
		t.Errorf("all clients revoked: %v", err)
	}
	if _, err := k.Open(mint(8, at+1), now, &got); err != nil {
		t.Errorf("issued after revoking all: %v", err)
	}
	// Lifting the revocation (it outlived what it covered) accepts again.
	if err := k.Set(Accepted{Keys: testKeys(1, 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Open(mint(7, at-1), now, &got); err != nil {
		t.Errorf("no revocations: %v", err)
	}
}

func TestSetRefusesBadSets(t *testing.T) {
	k := NewKeyring(testKeys(1, 1)...)
	bad := []Accepted{
		{},
		{Keys: make([]Key, MaxKeys+1)},
		{Keys: testKeys(1, 3, 4, 3)},
		{Keys: testKeys(1, 1), Revoked: make([]Revocation, MaxRevocations+1)},
		{Keys: testKeys(1, 1), RevokedBefore: -1},
	}
	for i, a := range bad {
		if err := k.Set(a); err == nil {
			t.Errorf("set %d accepted", i)
		}
	}
	if k.CurrentKey() != 1 {
		t.Fatalf("a refused set changed the ring: current %d", k.CurrentKey())
	}
}

// TestSetWhileOpening swaps the ring under concurrent checks (run with
// -race): a capability under a key every generation holds is always
// accepted, and one under a key some generations lack is accepted or
// refused as unknown, never anything else.
func TestSetWhileOpening(t *testing.T) {
	meta := NewKeyring(testKeys(1, 5, 6)...)
	c := sample()
	stable := meta.Mint(&c) // key 6
	meta.Set(Accepted{Keys: testKeys(1, 7)})
	c = sample()
	flapping := meta.Mint(&c) // key 7
	node := NewKeyring(testKeys(1, 6)...)
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got Capability
			for i := 0; !stop.Load(); i++ {
				now := time.Now().UnixNano()
				if _, err := node.Open(stable, now, &got); err != nil {
					errs <- err
					return
				}
				if _, err := node.Open(flapping, now, &got); err != nil && !errors.Is(err, ErrUnknownKey) {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range 2000 {
		keys := testKeys(1, 6, 7)
		if i%2 == 0 {
			keys = testKeys(1, uint32(100+i%50), 6)
		}
		if err := node.Set(Accepted{Keys: keys, Revoked: []Revocation{{Client: 99, Before: int64(i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestOpenWithRevocationsDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	k := NewKeyring(testKeys(1, 1, 2)...)
	revs := make([]Revocation, 1000)
	for i := range revs {
		revs[i] = Revocation{Client: ids.ClientID(100 + i), Before: time.Now().UnixNano()}
	}
	if err := k.Set(Accepted{Keys: testKeys(1, 1, 2), Revoked: revs}); err != nil {
		t.Fatal(err)
	}
	c := sample()
	raw := k.Mint(&c)
	now := time.Now().UnixNano()
	var got Capability
	k.Open(raw, now, &got) // warm the pool
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := k.Open(raw, now, &got); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Open allocates %.1f times per call", allocs)
	}
}

// BenchmarkOpenRevocations: the check with a ring of three keys and
// 1,000 clients revoked (the capability's client is not one of them).
func BenchmarkOpenRevocations(b *testing.B) {
	k := NewKeyring(testKeys(1, 1, 2, 3)...)
	revs := make([]Revocation, 1000)
	for i := range revs {
		revs[i] = Revocation{Client: ids.ClientID(100 + i), Before: time.Now().UnixNano()}
	}
	if err := k.Set(Accepted{Keys: testKeys(1, 1, 2, 3), Revoked: revs}); err != nil {
		b.Fatal(err)
	}
	c := sample()
	raw := k.Mint(&c)
	now := time.Now().UnixNano()
	var got Capability
	b.ReportAllocs()
	for b.Loop() {
		if _, err := k.Open(raw, now, &got); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSealAcrossRotation: a node that heard of a rotation seals with the
// new key, which a peer that has not heard holds as next; a peer that
// heard accepts the seal of one that has not (the old key, retired). A
// key that does not seal (an earlier version's derived key) is never
// used for a seal, and a ring with no key accepts no seal.
func TestSealAcrossRotation(t *testing.T) {
	body := []byte("forwarded header")
	before := NewKeyring(testKeys(1, 2, 1)...) // current 1, next 2
	after := NewKeyring(testKeys(1, 1, 3, 2)...)
	for _, c := range []struct {
		name     string
		from, to *Keyring
	}{{"new to old", after, before}, {"old to new", before, after}} {
		if seal := c.from.Seal(body); !c.to.CheckSeal(body, seal[:]) {
			t.Errorf("%s: seal refused", c.name)
		}
	}
	other := NewKeyring(testKeys(2, 1)...)
	if seal := other.Seal(body); before.CheckSeal(body, seal[:]) {
		t.Error("another cluster's seal accepted")
	}
	if seal := before.Seal(body); before.CheckSeal([]byte("forwarded headeR"), seal[:]) {
		t.Error("a seal over other bytes accepted")
	}
	legacy := testKeys(1, 7)[0]
	legacy.Seal = [KeySize]byte{}
	macOnly := NewKeyring(testKeys(1, 1)[0], legacy) // current: a key that does not seal
	if seal := macOnly.Seal(body); !before.CheckSeal(body, seal[:]) {
		t.Error("a ring whose current key does not seal: seal not under its sealing key")
	}
	var zero [MACSize]byte
	if seal := NewKeyring(legacy).Seal(body); seal != zero || NewKeyring(legacy).CheckSeal(body, zero[:]) {
		t.Error("a key that does not seal sealed, or a zero seal was accepted")
	}
	empty := NewKeyring()
	if seal := before.Seal(body); empty.CheckSeal(body, seal[:]) {
		t.Error("a ring with no keys accepted a seal")
	}
	var c Capability
	if _, err := empty.Open(before.Mint(new(sample())), time.Now().UnixNano(), &c); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("a ring with no keys: %v, want ErrUnknownKey", err)
	}
}

// TestSealDoesNotAllocate: sealing and checking a forwarded header, on
// every hop of every replicated write, allocates nothing.
func TestSealDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	k := NewKeyring(testKeys(1, 1, 3, 2)...)
	old := NewKeyring(testKeys(1, 1)...) // checked against its retired key: the slowest accepting path
	body := make([]byte, 200)
	seal := old.Seal(body)
	if n := testing.AllocsPerRun(200, func() {
		s := k.Seal(body)
		if !k.CheckSeal(body, s[:]) || !k.CheckSeal(body, seal[:]) {
			t.Fatal("seal refused")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per seal and check", n)
	}
}
