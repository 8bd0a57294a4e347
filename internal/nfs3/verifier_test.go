package nfs3

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

// TestVerifierPerFile: a loss changes the verifier of its file alone.
func TestVerifierPerFile(t *testing.T) {
	v := newVerifiers(1234, 8)
	a, b := v.get(1), v.get(2)
	v.lost(1)
	if v.get(1) == a {
		t.Fatal("a loss left its file's verifier as it was")
	}
	if v.get(2) != b {
		t.Fatal("a loss of file 1's writes changed file 2's verifier")
	}
}

// TestVerifierNeverRepeats: under random losses over a few files, with a
// table small enough to overflow often, a file's verifier changes at
// every loss of its own and never returns to a value it had before
// (clients would then take lost writes for kept ones).
func TestVerifierNeverRepeats(t *testing.T) {
	v := newVerifiers(^uint64(0)-5, 3) // wraps around too
	rng := rand.New(rand.NewPCG(7, 8))
	const files = 6
	had := map[ids.Ino]map[[8]byte]bool{}
	cur := map[ids.Ino][8]byte{}
	for ino := ids.Ino(1); ino <= files; ino++ {
		cur[ino] = v.get(ino)
		had[ino] = map[[8]byte]bool{cur[ino]: true}
	}
	for range 5000 {
		lostIno := ids.Ino(rng.IntN(files) + 1)
		v.lost(lostIno)
		if len(v.losses) > 3 {
			t.Fatalf("the table holds %d files, bound 3", len(v.losses))
		}
		for ino := ids.Ino(1); ino <= files; ino++ {
			now := v.get(ino)
			switch {
			case now == cur[ino] && ino == lostIno:
				t.Fatalf("file %d lost writes but kept its verifier %x", ino, now)
			case now != cur[ino] && had[ino][now]:
				t.Fatalf("file %d's verifier went back to %x", ino, now)
			}
			had[ino][now] = true
			cur[ino] = now
		}
	}
}

// TestVerifierCountWraps: a file's 2^32nd loss starts a new generation
// rather than wrap its count back to a value it had.
func TestVerifierCountWraps(t *testing.T) {
	v := newVerifiers(0, 8)
	v.losses[1] = 1<<32 - 1
	before := v.get(1)
	v.lost(1)
	if after := v.get(1); after == before || after == v.get(2) && v.gen == 0 {
		t.Fatalf("verifier %x after the count's last value (before %x, gen %d)", after, before, v.gen)
	}
	if v.gen != 1 {
		t.Fatalf("gen %d, want 1", v.gen)
	}
}
