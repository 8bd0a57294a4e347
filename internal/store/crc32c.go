package store

// CRC32C arithmetic beyond what hash/crc32 offers: combining the CRCs of
// adjacent byte ranges without the bytes, after zlib's crc32_combine.
//
// A CRC register is a polynomial over GF(2) of degree < 32, stored
// bit-reflected (bit 31 is the x^0 coefficient). Feeding n zero bytes into a
// register multiplies it by x^(8n) mod P. Because the standard CRC's initial
// and final XORs cancel out across a concatenation,
//
//	crc(A || B) = crc(A)·x^(8·len(B)) mod P  XOR  crc(B)
//
// so a block's CRC is the XOR over its pieces of crcShift(crc(piece), bytes
// of the block after the piece), accumulated in any order.

// castagnoliPoly is P, the Castagnoli polynomial, bit-reflected.
const castagnoliPoly = 0x82f63b78

// byteShifts[i] = x^(8·2^i) mod P, so shifting by n bytes takes one
// multiplication per set bit of n. Computed once; never written after.
var byteShifts = func() (t [64]uint32) {
	p := uint32(1) << 30 // x^1
	for range 3 {
		p = gfMul(p, p) // x^2, x^4, x^8
	}
	t[0] = p
	for i := 1; i < len(t); i++ {
		t[i] = gfMul(t[i-1], t[i-1])
	}
	return t
}()

// gfMul returns a·b mod P (zlib's multmodp).
func gfMul(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// crcShift returns crc·x^(8n) mod P: the contribution of a piece whose CRC
// is crc when n more bytes follow it. O(log n).
func crcShift(crc uint32, n int64) uint32 {
	for i := 0; n != 0; i, n = i+1, n>>1 {
		if n&1 != 0 {
			crc = gfMul(byteShifts[i], crc)
		}
	}
	return crc
}

// crcCombine returns crc(A || B) given crc(A), crc(B) and len(B).
func crcCombine(crcA, crcB uint32, lenB int64) uint32 {
	return crcShift(crcA, lenB) ^ crcB
}

// crcZeros returns the CRC32C of n zero bytes without touching them: the
// raw register starts at all ones and is only ever shifted.
func crcZeros(n int64) uint32 {
	return ^crcShift(^uint32(0), n)
}
