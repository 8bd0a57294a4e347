package regionmac

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

var secret = bytes.Repeat([]byte{7}, SecretSize)

func TestVerify(t *testing.T) {
	const now = int64(1_000_000_000_000)
	op := Op{Region: 3, Off: 4096, Len: 4096, Time: now}
	tag := Sign(secret, op)
	v := NewVerifier(time.Second, 100)
	if err := v.Verify(secret, op, tag, now+int64(time.Millisecond)); err != nil {
		t.Fatalf("a good tag: %v", err)
	}
	if err := v.Verify(secret, op, tag, now+int64(2*time.Millisecond)); !errors.Is(err, ErrReplay) {
		t.Fatalf("the same operation again: %v, want ErrReplay", err)
	}
	altered := map[string]Op{
		"region": {Region: 4, Off: 4096, Len: 4096, Time: now},
		"offset": {Region: 3, Off: 0, Len: 4096, Time: now},
		"length": {Region: 3, Off: 4096, Len: 8192, Time: now},
		"time":   {Region: 3, Off: 4096, Len: 4096, Time: now + 1},
	}
	for name, a := range altered {
		if err := v.Verify(secret, a, tag, now); !errors.Is(err, ErrBadTag) {
			t.Errorf("%s altered: %v, want ErrBadTag", name, err)
		}
	}
	other := bytes.Repeat([]byte{8}, SecretSize)
	op2 := Op{Region: 3, Off: 0, Len: 1, Time: now}
	if err := v.Verify(secret, op2, Sign(other, op2), now); !errors.Is(err, ErrBadTag) {
		t.Errorf("another region's secret: %v", err)
	}
	for _, d := range []time.Duration{2 * time.Second, -2 * time.Second} {
		old := Op{Region: 3, Off: 0, Len: 1, Time: now}
		if err := v.Verify(secret, old, Sign(secret, old), now+int64(d)); !errors.Is(err, ErrExpired) {
			t.Errorf("timestamp %v off: %v, want ErrExpired", d, err)
		}
	}
}

// TestBoundedWindow: the tags remembered never exceed the bound whatever
// is sent; past it operations are refused (busy), and once their times
// leave the window there is room again, without a replay becoming
// acceptable (it is then expired).
func TestBoundedWindow(t *testing.T) {
	const now = int64(5_000_000_000_000)
	v := NewVerifier(time.Second, 10)
	var first Op
	for i := range 25 {
		op := Op{Region: 1, Off: uint64(i), Len: 1, Time: now}
		err := v.Verify(secret, op, Sign(secret, op), now)
		switch {
		case i == 0:
			first = op
			fallthrough
		case i < 10:
			if err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
		default:
			if !errors.Is(err, ErrBusy) {
				t.Fatalf("op %d past the bound: %v, want ErrBusy", i, err)
			}
		}
		if v.n > 10 {
			t.Fatalf("%d tags remembered, bound 10", v.n)
		}
	}
	later := now + int64(1500*time.Millisecond)
	op := Op{Region: 1, Off: 99, Len: 1, Time: later}
	if err := v.Verify(secret, op, Sign(secret, op), later); err != nil {
		t.Fatalf("after the window: %v", err)
	}
	if err := v.Verify(secret, first, Sign(secret, first), later); !errors.Is(err, ErrExpired) {
		t.Fatalf("a replay after its window: %v, want ErrExpired", err)
	}
}

func FuzzVerify(f *testing.F) {
	f.Add(uint64(1), uint64(2), uint32(3), int64(0), make([]byte, TagSize), int64(0))
	f.Fuzz(func(t *testing.T, region, off uint64, n uint32, at int64, tag []byte, now int64) {
		v := NewVerifier(time.Second, 4)
		var tg Tag
		copy(tg[:], tag)
		op := Op{Region: region, Off: off, Len: n, Time: at}
		err := v.Verify(secret, op, tg, now)
		if err == nil && tg != Sign(secret, op) {
			t.Fatal("accepted a tag that is not the operation's")
		}
	})
}

// TestSignIsHMAC: Sign is HMAC-SHA256 truncated, for keys of every
// length up to a block, and allocates nothing.
func TestSignIsHMAC(t *testing.T) {
	op := Op{Region: 1 << 60, Off: 12345, Len: 4160, Time: -77}
	var b [28]byte
	binary.LittleEndian.PutUint64(b[0:], op.Region)
	binary.LittleEndian.PutUint64(b[8:], op.Off)
	binary.LittleEndian.PutUint32(b[16:], op.Len)
	binary.LittleEndian.PutUint64(b[20:], uint64(op.Time))
	for n := 0; n <= 64; n++ {
		key := bytes.Repeat([]byte{byte(n + 1)}, n)
		m := hmac.New(sha256.New, key)
		m.Write(b[:])
		want := m.Sum(nil)[:TagSize]
		if got := Sign(key, op); !bytes.Equal(got[:], want) {
			t.Fatalf("key of %d bytes: %x, want %x", n, got, want)
		}
	}
	if a := testing.AllocsPerRun(100, func() { Sign(secret, op) }); a != 0 {
		t.Errorf("Sign allocates %v times", a)
	}
}

// TestFutureTimestamps: a tag may be dated up to the window in the past
// but only a quarter of it ahead (a tag dated ahead stays remembered
// longer: a peer could fill the window with them).
func TestFutureTimestamps(t *testing.T) {
	const now = int64(1_000_000_000_000)
	v := NewVerifier(2*time.Second, 100)
	for _, c := range []struct {
		ahead time.Duration
		ok    bool
	}{{400 * time.Millisecond, true}, {600 * time.Millisecond, false}, {-1900 * time.Millisecond, true}, {-2100 * time.Millisecond, false}} {
		op := Op{Region: 1, Off: uint64(c.ahead), Len: 1, Time: now + int64(c.ahead)}
		err := v.Verify(secret, op, Sign(secret, op), now)
		if (err == nil) != c.ok {
			t.Errorf("dated %v ahead: %v, want ok %v", c.ahead, err, c.ok)
		}
	}
}
