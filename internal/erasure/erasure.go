// Package erasure is the Reed-Solomon arithmetic of Sluice's erasure
// codes, on top of github.com/klauspost/reedsolomon: whole-stripe
// encoding and reconstruction (central encoding, degraded reads), the
// partial parities a data unit contributes (its column of the generator
// matrix times its bytes: streaming and per-chunk encoding, seed 003's
// "intermediate parity"), and the decoding coefficients for distributed
// repair (each survivor multiplies its unit by one coefficient and the
// rebuilder XORs the products).
//
// Everything here is pure computation; a Codes value caches the coders
// and coefficient rows so the per-packet path never builds one.
package erasure

import (
	"crypto/subtle"
	"fmt"
	"slices"
	"sync"

	"github.com/klauspost/reedsolomon"
)

// Code is RS(K, M) with the library's systematic generator matrix.
type Code struct {
	K, M int
	enc  reedsolomon.Encoder
	// parity[p][j] is the coefficient of data unit j in parity unit p.
	parity [][]byte
	// column[j] encodes one data unit's partial parities in one pass.
	column []reedsolomon.Encoder

	mu     sync.Mutex
	decode map[string][]byte // lost unit + survivors -> coefficients
}

// Codes caches codes by shape and coefficient multipliers. The zero value
// is ready to use; it is safe for concurrent use.
type Codes struct {
	mu    sync.Mutex
	codes map[[2]int]*Code
	mul   [256]reedsolomon.Encoder
}

// Get returns RS(k, m), building it on first use.
func (cs *Codes) Get(k, m int) (*Code, error) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.codes[[2]int{k, m}]; ok {
		return c, nil
	}
	c, err := newCode(k, m)
	if err != nil {
		return nil, err
	}
	if cs.codes == nil {
		cs.codes = map[[2]int]*Code{}
	}
	cs.codes[[2]int{k, m}] = c
	return c, nil
}

func newCode(k, m int) (*Code, error) {
	if k < 1 || m < 1 {
		return nil, fmt.Errorf("erasure: RS(%d,%d): need at least one data and one parity unit", k, m)
	}
	enc, err := reedsolomon.New(k, m, opts...)
	if err != nil {
		return nil, fmt.Errorf("erasure: RS(%d,%d): %w", k, m, err)
	}
	c := &Code{K: k, M: m, enc: enc, parity: make([][]byte, m), decode: map[string][]byte{}}
	for p := range c.parity {
		c.parity[p] = make([]byte, k)
	}
	// Read the coefficients off the library: unit j = 1, the others 0.
	one := []byte{1}
	out := make([][]byte, m)
	for j := 0; j < k; j++ {
		for p := range out {
			out[p] = []byte{0}
		}
		if err := enc.EncodeIdx(one, j, out); err != nil {
			return nil, fmt.Errorf("erasure: reading RS(%d,%d)'s matrix: %w", k, m, err)
		}
		for p := range out {
			c.parity[p][j] = out[p][0]
		}
	}
	c.column = make([]reedsolomon.Encoder, k)
	for j := range c.column {
		col := make([][]byte, m)
		for p := range col {
			col[p] = []byte{c.parity[p][j]}
		}
		if c.column[j], err = reedsolomon.New(1, m, append([]reedsolomon.Option{reedsolomon.WithCustomMatrix(col)}, opts...)...); err != nil {
			return nil, fmt.Errorf("erasure: RS(%d,%d) column %d: %w", k, m, j, err)
		}
	}
	return c, nil
}

// Units is K+M.
func (c *Code) Units() int { return c.K + c.M }

// Coefficient is data unit j's coefficient in parity unit p.
func (c *Code) Coefficient(p, j int) byte { return c.parity[p][j] }

// Encode computes the M parity shards (shards[K:]) from the K data
// shards; all shards have the same length.
func (c *Code) Encode(shards [][]byte) error { return c.enc.Encode(shards) }

// Partial computes data unit j's partial parity for each parity unit:
// shards[0] is the unit's data, and shards[1+p] (as long as the data) is
// set to coef(p, j) · data. XORing the K units' partials gives the parity
// (the code is linear). The caller owns shards, so the per-packet path
// allocates nothing.
func (c *Code) Partial(j int, shards [][]byte) error {
	if j < 0 || j >= c.K || len(shards) != 1+c.M {
		return fmt.Errorf("erasure: partial parity of unit %d into %d outputs for RS(%d,%d)", j, len(shards)-1, c.K, c.M)
	}
	if len(shards[0]) == 0 {
		return nil
	}
	return c.column[j].Encode(shards)
}

// MaxUnits bounds K+M (what one write header and capability can name).
const MaxUnits = 32

// opts: one goroutine (the engine's workers are the parallelism), and no
// GFNI path, whose per-call matrix escapes to the heap; AVX2 is as fast
// at packet sizes.
var opts = []reedsolomon.Option{reedsolomon.WithMaxGoroutines(1), reedsolomon.WithGFNI(false), reedsolomon.WithAVXGFNI(false)}

// Reconstruct fills the nil or empty shards among the K+M from any K
// present ones (data and parity).
func (c *Code) Reconstruct(shards [][]byte) error { return c.enc.Reconstruct(shards) }

// ReconstructOne fills only shard u (nil or empty) from any K present.
func (c *Code) ReconstructOne(shards [][]byte, u int) error {
	var required [MaxUnits]bool
	required[u] = true
	return c.enc.ReconstructSome(shards, required[:len(shards)])
}

// ReconstructData fills only the missing data shards.
func (c *Code) ReconstructData(shards [][]byte) error { return c.enc.ReconstructData(shards) }

// Verify reports whether the parity shards match the data shards.
func (c *Code) Verify(shards [][]byte) (bool, error) { return c.enc.Verify(shards) }

// row returns unit u's row of the (K+M)×K generator matrix.
func (c *Code) row(u int) []byte {
	r := make([]byte, c.K)
	if u < c.K {
		r[u] = 1
		return r
	}
	copy(r, c.parity[u-c.K])
	return r
}

// DecodeCoefficients returns, for rebuilding unit lost from the K units
// survivors (distinct, none of them lost), the coefficient of each
// survivor: lost = XOR over i of coef[i] · survivors[i]. Results are
// cached per erasure pattern.
func (c *Code) DecodeCoefficients(lost int, survivors []int) ([]byte, error) {
	n := c.Units()
	if lost < 0 || lost >= n || len(survivors) != c.K {
		return nil, fmt.Errorf("erasure: rebuilding unit %d of RS(%d,%d) from %d survivors", lost, c.K, c.M, len(survivors))
	}
	key := make([]byte, 0, 1+len(survivors))
	key = append(key, byte(lost))
	for i, s := range survivors {
		if s < 0 || s >= n || s == lost || slices.Contains(survivors[:i], s) {
			return nil, fmt.Errorf("erasure: survivor set %v for unit %d of RS(%d,%d)", survivors, lost, c.K, c.M)
		}
		key = append(key, byte(s))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if coef, ok := c.decode[string(key)]; ok {
		return coef, nil
	}
	// data = inv(G_S) · units_S, so lost = G_lost · inv(G_S) · units_S.
	g := make([][]byte, c.K)
	for i, s := range survivors {
		g[i] = c.row(s)
	}
	inv, err := invert(g)
	if err != nil {
		return nil, fmt.Errorf("erasure: survivors %v of RS(%d,%d): %w", survivors, c.K, c.M, err)
	}
	want := c.row(lost)
	coef := make([]byte, c.K)
	for i := range coef {
		var s byte
		for j := 0; j < c.K; j++ {
			s ^= gfMul(want[j], inv[j][i])
		}
		coef[i] = s
	}
	if len(c.decode) > 4096 { // bound the cache: patterns are few in practice
		clear(c.decode)
	}
	c.decode[string(key)] = coef
	return coef, nil
}

// Multiply sets out = coef · in (GF(2^8), element-wise); len(out) == len(in).
func (cs *Codes) Multiply(coef byte, in, out []byte) error {
	if len(in) != len(out) {
		return fmt.Errorf("erasure: multiply %d bytes into %d", len(in), len(out))
	}
	if len(in) == 0 {
		return nil
	}
	cs.mu.Lock()
	e := cs.mul[coef]
	if e == nil {
		var err error
		if e, err = reedsolomon.New(1, 1, append([]reedsolomon.Option{reedsolomon.WithCustomMatrix([][]byte{{coef}})}, opts...)...); err != nil {
			cs.mu.Unlock()
			return fmt.Errorf("erasure: multiplier %d: %w", coef, err)
		}
		cs.mul[coef] = e
	}
	cs.mu.Unlock()
	return e.Encode([][]byte{in, out})
}

// XOR sets dst ^= src (len(dst) >= len(src)), with the standard
// library's vectorised loop.
func XOR(dst, src []byte) { subtle.XORBytes(dst, dst, src) }
