package main

import "testing"

func TestSizeFlag(t *testing.T) {
	good := map[string]int64{"0": 0, "4096": 4096, "4KiB": 4096, "64MiB": 64 << 20, "1GiB": 1 << 30, "3KiB": 3072}
	for in, want := range good {
		var s sizeFlag
		if err := s.Set(in); err != nil || int64(s) != want {
			t.Errorf("%q: %d, %v; want %d", in, s, err, want)
		}
		var again sizeFlag
		if err := again.Set(s.String()); err != nil || again != s {
			t.Errorf("%q prints as %q, which reads back as %d (%v)", in, s.String(), again, err)
		}
	}
	for _, in := range []string{"", "-1", "4k", "4KB", "KiB", "1.5MiB", "99999999999GiB", "4 KiB"} {
		var s sizeFlag
		if err := s.Set(in); err == nil {
			t.Errorf("%q accepted as %d", in, s)
		}
	}
}
