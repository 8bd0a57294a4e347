package capability

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/ids"
	"github.com/sluicefs/sluice/internal/plan"
)

// testKeys are fixed keys for ids, distinct per seed (as two clusters'
// keys are).
func testKeys(seed byte, keyIDs ...uint32) []Key {
	out := make([]Key, len(keyIDs))
	for i, id := range keyIDs {
		out[i].ID = id
		out[i].MAC = sha256.Sum256(fmt.Appendf(nil, "mac %d %d", seed, id))
		out[i].Seal = sha256.Sum256(fmt.Appendf(nil, "seal %d %d", seed, id))
	}
	return out
}

func sample() Capability {
	c := Capability{Rights: Read | Write, Fanout: plan.FanoutClient, Client: 7, Ino: 42, Chunk: 0x1234, Off: 4096, Len: 1 << 20,
		Expiry: time.Now().Add(time.Minute).UnixNano(), Issued: time.Now().UnixNano(), Epoch: 3}
	_ = c.SetReplicas([]ids.NodeID{5, 9, 2})
	return c
}

func TestMintOpenRoundTrip(t *testing.T) {
	k := NewKeyring(testKeys(1, 1)...)
	c := sample()
	raw := k.Mint(&c)
	if len(raw) != c.Size() {
		t.Fatalf("encoded %d bytes, Size says %d", len(raw), c.Size())
	}
	var got Capability
	n, err := k.Open(append(raw, 0xEE), time.Now().UnixNano(), &got)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(raw) {
		t.Fatalf("used %d bytes, want %d", n, len(raw))
	}
	if got != c {
		t.Fatalf("decoded %+v, want %+v", got, c)
	}
	if got.RankOf(9) != 1 || got.RankOf(4) != -1 {
		t.Fatalf("RankOf wrong")
	}
}

// TestSeal: a seal checks only with the secret it was made with, and
// only for the bytes it was made over.
func TestSeal(t *testing.T) {
	k, other := NewKeyring(testKeys(1, 1)...), NewKeyring(testKeys(2, 1)...)
	body := []byte("forwarded header")
	s := k.Seal(body)
	if !k.CheckSeal(body, s[:]) {
		t.Fatal("own seal refused")
	}
	if other.CheckSeal(body, s[:]) {
		t.Fatal("seal accepted under another secret")
	}
	if k.CheckSeal([]byte("forwarded headeR"), s[:]) || k.CheckSeal(body, s[:8]) || k.CheckSeal(body, nil) {
		t.Fatal("seal accepted for other bytes or truncated")
	}
	// The seal key is not the capability key.
	c := sample()
	raw := k.Mint(&c)
	if k.CheckSeal(raw[:len(raw)-MACSize], raw[len(raw)-MACSize:]) {
		t.Fatal("a capability MAC passes as a seal")
	}
}

func TestOpenRefusesEveryBitFlip(t *testing.T) {
	k := NewKeyring(testKeys(1, 1)...)
	c := sample()
	raw := k.Mint(&c)
	now := time.Now().UnixNano()
	for i := range raw {
		for bit := 0; bit < 8; bit++ {
			b := append([]byte(nil), raw...)
			b[i] ^= 1 << bit
			var got Capability
			if _, err := k.Open(b, now, &got); err == nil {
				t.Fatalf("flipping bit %d of byte %d was accepted", bit, i)
			}
		}
	}
}

func TestOpenErrors(t *testing.T) {
	k := NewKeyring(testKeys(1, 1)...)
	other := NewKeyring(testKeys(2, 1)...)
	c := sample()
	raw := k.Mint(&c)
	now := time.Now().UnixNano()
	var got Capability

	if _, err := other.Open(raw, now, &got); !errors.Is(err, ErrBadMAC) {
		t.Errorf("other cluster's key: %v, want ErrBadMAC", err)
	}
	if _, err := k.Open(raw, c.Expiry+1, &got); !errors.Is(err, ErrExpired) {
		t.Errorf("after expiry: %v, want ErrExpired", err)
	}
	if _, err := k.Open(raw[:len(raw)-1], now, &got); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated: %v, want ErrMalformed", err)
	}
	rotated := NewKeyring(testKeys(1, 2)...)
	if _, err := rotated.Open(raw, now, &got); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("key id 1 on a ring of {2}: %v, want ErrUnknownKey", err)
	}
	both := NewKeyring(testKeys(1, 1, 2)...)
	if _, err := both.Open(raw, now, &got); err != nil {
		t.Errorf("ring {1,2} must still accept key 1: %v", err)
	}
	if both.CurrentKey() != 2 {
		t.Errorf("current key %d, want 2", both.CurrentKey())
	}
}

func TestAllows(t *testing.T) {
	c := sample()
	c.Rights = Read
	cases := []struct {
		name   string
		rights Rights
		chunk  ids.ChunkID
		off, n uint64
		ok     bool
	}{
		{"inside", Read, 0x1234, 4096, 100, true},
		{"whole", Read, 0x1234, 4096, 1 << 20, true},
		{"write on read cap", Write, 0x1234, 4096, 1, false},
		{"other chunk", Read, 0x1235, 4096, 1, false},
		{"before", Read, 0x1234, 4095, 1, false},
		{"past end", Read, 0x1234, 4096, 1<<20 + 1, false},
		{"overflow", Read, 0x1234, 1<<64 - 1, 2, false},
	}
	for _, tc := range cases {
		err := c.Allows(tc.rights, tc.chunk, tc.off, tc.n)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err=%v, want ok=%v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrScope) {
			t.Errorf("%s: %v is not ErrScope", tc.name, err)
		}
	}
}

func TestOpenDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	k := NewKeyring(testKeys(1, 1)...)
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

func BenchmarkOpen(b *testing.B) {
	k := NewKeyring(testKeys(1, 1)...)
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

func FuzzDecode(f *testing.F) {
	k := NewKeyring(testKeys(0, 1)...)
	c := sample()
	f.Add(k.Mint(&c))
	ec := sample()
	ec.Fanout, ec.Data = plan.FanoutEC, 1
	f.Add(k.Mint(&ec))
	f.Add([]byte{})
	f.Add(make([]byte, fixedSize+MACSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		var got Capability
		n, err := Decode(b, &got)
		if err != nil {
			return
		}
		if n > len(b) || n != got.Size() {
			t.Fatalf("Decode used %d of %d bytes, Size %d", n, len(b), got.Size())
		}
		// A decoded capability re-encodes to the same bytes.
		if re := got.AppendBinary(nil); string(re) != string(b[:n]) {
			t.Fatalf("re-encoding differs")
		}
		// Nothing but a real mint passes Open with a fixed secret.
		k.Open(b, 0, &got)
	})
}
