package store

import (
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestVerifyDetectsFlippedByte(t *testing.T) {
	s := openStore(t, Options{BlockSize: 4096})
	rng := rand.New(rand.NewPCG(1, 3))
	// Several checksum pages' worth, so Verify crosses read views.
	const n = 3*crcsPerPage*4096 + 1234
	if _, err := write(s, rng, 8, 0, randBytes(rng, n), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(8); err != nil {
		t.Fatalf("Verify of a healthy chunk: %v", err)
	}
	for _, off := range []int64{5, 2*crcsPerPage*4096 + 4097, n - 1} {
		f, err := os.OpenFile(s.chunkPath(8), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := []byte{0}
		f.ReadAt(b, off)
		b[0] ^= 0x10
		f.WriteAt(b, off)
		err = s.Verify(8)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Verify after flipping byte %d: %v, want ErrCorrupt", off, err)
		}
		if want := "block " + strconv.FormatInt(off/4096, 10) + " "; !strings.Contains(err.Error(), want) {
			t.Fatalf("Verify error %q does not name %q", err, want)
		}
		b[0] ^= 0x10 // restore
		f.WriteAt(b, off)
		f.Close()
	}
	if err := s.Verify(8); err != nil {
		t.Fatalf("Verify after restoring: %v", err)
	}
	if err := s.Verify(12345); err != nil {
		t.Fatalf("Verify of an unknown chunk: %v", err)
	}
}
