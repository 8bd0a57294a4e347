package lograte

import (
	"testing"
	"time"
)

// TestAllow: the first event is logged, the rest within a second are
// counted, and the next one logged after it carries that count.
func TestAllow(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow(t0); !ok || n != 0 {
		t.Fatalf("first event: %v %d", ok, n)
	}
	for i := range 5 {
		if ok, _ := l.Allow(t0.Add(time.Duration(i) * 100 * time.Millisecond)); ok {
			t.Fatalf("event %d within a second logged", i)
		}
	}
	if ok, n := l.Allow(t0.Add(time.Second)); !ok || n != 5 {
		t.Fatalf("a second later: %v, %d skipped; want true, 5", ok, n)
	}
	if ok, n := l.Allow(t0.Add(time.Hour)); !ok || n != 0 {
		t.Fatalf("an hour later: %v %d", ok, n)
	}
}
