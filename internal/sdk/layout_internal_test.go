package sdk

import (
	"testing"
	"time"
)

// TestUsableUntil: a cached capability stops being used 30 s before it
// expires, or a quarter of its lifetime before if that is less — so a
// cluster with short lifetimes (--cap-ttl 12s) still caches them.
func TestUsableUntil(t *testing.T) {
	s := int64(time.Second)
	for _, c := range []struct{ got, expiry, want int64 }{
		{0, 300 * s, 270 * s}, // the default lifetime: 30 s
		{0, 12 * s, 9 * s},    // short: a quarter
		{0, 120 * s, 90 * s},  // exactly both
		{50 * s, 40 * s, 40 * s},
	} {
		if got := usableUntil(c.got, c.expiry); got != c.want {
			t.Errorf("usableUntil(%v, %v) = %v, want %v", time.Duration(c.got), time.Duration(c.expiry), time.Duration(got), time.Duration(c.want))
		}
	}
}
