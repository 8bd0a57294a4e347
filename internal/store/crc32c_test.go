package store

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// castagnoli is the tests' own CRC32C table, a reference independent of
// package crc32c.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TestCRCCombineRandomSplits checks the block-accumulation identity the
// store relies on: the CRC of a buffer equals the XOR over any split into
// pieces of crcShift(crc(piece), bytes after the piece), in any order.
func TestCRCCombineRandomSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 500 {
		n := rng.IntN(70000)
		if iter%10 == 0 {
			n = rng.IntN(8)
		}
		buf := make([]byte, n)
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		want := crc32.Checksum(buf, castagnoli)

		// Cut into random pieces, then fold them in a random order.
		var cuts []int
		for pos := 0; pos < n; {
			step := 1 + rng.IntN(max(1, n/3+1))
			pos = min(n, pos+step)
			cuts = append(cuts, pos)
		}
		var got uint32
		prev := 0
		order := rng.Perm(len(cuts))
		starts := make([]int, len(cuts))
		for i, c := range cuts {
			starts[i] = prev
			prev = c
		}
		for _, i := range order {
			piece := buf[starts[i]:cuts[i]]
			got ^= crcShift(crc32.Checksum(piece, castagnoli), int64(n-cuts[i]))
		}
		if got != want {
			t.Fatalf("iter %d: n=%d cuts=%v: accumulated %#08x, want %#08x", iter, n, cuts, got, want)
		}

		// Pairwise combine agrees with crc32.Update continuing a CRC.
		k := 0
		if n > 0 {
			k = rng.IntN(n + 1)
		}
		a, b := buf[:k], buf[k:]
		c := crcCombine(crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), int64(len(b)))
		if u := crc32.Update(crc32.Checksum(a, castagnoli), castagnoli, b); c != u || c != want {
			t.Fatalf("iter %d: combine %#08x, update %#08x, want %#08x", iter, c, u, want)
		}
	}
}

func TestCRCZeros(t *testing.T) {
	zeros := make([]byte, 1<<20+3)
	for _, n := range []int{0, 1, 2, 7, 8, 4095, 4096, 16384, 65537, 1 << 20, 1<<20 + 3} {
		if got, want := crcZeros(int64(n)), crc32.Checksum(zeros[:n], castagnoli); got != want {
			t.Errorf("crcZeros(%d) = %#08x, want %#08x", n, got, want)
		}
	}
}

// TestCRCShiftComposes checks shifts by huge lengths (beyond anything we
// could hash directly) compose: shift(shift(c, a), b) = shift(c, a+b).
func TestCRCShiftComposes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 1000 {
		c := rng.Uint32()
		a, b := rng.Int64N(1<<61), rng.Int64N(1<<61)
		if x, y := crcShift(crcShift(c, a), b), crcShift(c, a+b); x != y {
			t.Fatalf("shift(shift(%#x,%d),%d)=%#x, shift by sum=%#x", c, a, b, x, y)
		}
	}
	if crcShift(0x12345678, 0) != 0x12345678 {
		t.Fatal("shift by 0 is not the identity")
	}
}
