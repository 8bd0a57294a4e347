package erasure

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func randShards(rng *rand.Rand, n, size int) [][]byte {
	s := make([][]byte, n)
	for i := range s {
		s[i] = make([]byte, size)
		for j := range s[i] {
			s[i][j] = byte(rng.Uint32())
		}
	}
	return s
}

// Every supported shape: the XOR of the data units' partial parities is
// the library's parity, and decoding coefficients rebuild any lost unit
// from a random set of K survivors.
func TestPartialAndDecodeEveryShape(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var cs Codes
	for k := 1; k < MaxUnits; k++ {
		for m := 1; k+m <= MaxUnits; m++ {
			c, err := cs.Get(k, m)
			if err != nil {
				t.Fatalf("RS(%d,%d): %v", k, m, err)
			}
			size := 1 + rng.IntN(300)
			if k+m == 9 {
				size = 64<<10 + 17 // the vector paths too
			}
			shards := randShards(rng, k+m, size)
			if err := c.Encode(shards); err != nil {
				t.Fatal(err)
			}
			acc := make([][]byte, m)
			for p := range acc {
				acc[p] = make([]byte, size)
			}
			part := append([][]byte{nil}, randShards(rng, m, size)...) // garbage: Partial must overwrite
			for j := 0; j < k; j++ {
				part[0] = shards[j]
				if err := c.Partial(j, part); err != nil {
					t.Fatal(err)
				}
				for p := range acc {
					XOR(acc[p], part[1+p])
				}
			}
			for p := range acc {
				if !bytes.Equal(acc[p], shards[k+p]) {
					t.Fatalf("RS(%d,%d) size %d: XOR of partials differs from parity %d", k, m, size, p)
				}
			}
			lost := rng.IntN(k + m)
			perm := rng.Perm(k + m)
			var surv []int
			for _, u := range perm {
				if u != lost && len(surv) < k {
					surv = append(surv, u)
				}
			}
			coef, err := c.DecodeCoefficients(lost, surv)
			if err != nil {
				t.Fatalf("RS(%d,%d) lost %d from %v: %v", k, m, lost, surv, err)
			}
			got := make([]byte, size)
			prod := make([]byte, size)
			for i, s := range surv {
				if err := cs.Multiply(coef[i], shards[s], prod); err != nil {
					t.Fatal(err)
				}
				XOR(got, prod)
			}
			if !bytes.Equal(got, shards[lost]) {
				t.Fatalf("RS(%d,%d): unit %d rebuilt from %v differs", k, m, lost, surv)
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	var cs Codes
	for _, km := range [][2]int{{0, 2}, {4, 0}, {-1, 1}, {200, 100}} {
		if _, err := cs.Get(km[0], km[1]); err == nil {
			t.Errorf("RS(%d,%d) accepted", km[0], km[1])
		}
	}
	c, _ := cs.Get(4, 2)
	if _, err := c.DecodeCoefficients(1, []int{0, 2, 3}); err == nil {
		t.Error("too few survivors accepted")
	}
	if _, err := c.DecodeCoefficients(1, []int{0, 2, 3, 3}); err == nil {
		t.Error("duplicate survivor accepted")
	}
	if _, err := c.DecodeCoefficients(1, []int{0, 1, 2, 3}); err == nil {
		t.Error("the lost unit as a survivor accepted")
	}
	if err := c.Partial(4, [][]byte{{1}, {0}, {0}}); err == nil {
		t.Error("partial of a parity unit accepted")
	}
	if err := cs.Multiply(3, []byte{1, 2}, []byte{0}); err == nil {
		t.Error("short output accepted")
	}
}

func BenchmarkPartial64K(b *testing.B) {
	var cs Codes
	c, _ := cs.Get(6, 3)
	data := make([]byte, 64<<10)
	shards := [][]byte{data, make([]byte, len(data)), make([]byte, len(data)), make([]byte, len(data))}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Partial(2, shards); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkXOR64K(b *testing.B) {
	dst, src := make([]byte, 64<<10), make([]byte, 64<<10)
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		XOR(dst, src)
	}
}
