package expcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/sluicefs/sluice/internal/ids"
)

const bs = 512

func arena(slots int) []byte {
	// 8-byte aligned: a []uint64's memory.
	w := make([]uint64, slots*(HeaderSize+bs)/8)
	return unsafeBytes(w)
}

func pattern(block, version uint64, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(block*31 + version*7 + uint64(i))
	}
	return p
}

// read is an optimistic read as a client makes it: the slot, then its
// generation word.
func read(c *Cache, r Ref) ([]byte, error) {
	off := r.Off(bs)
	slot := bytes.Clone(c.mem[off : off+HeaderSize+bs])
	gen := c.header(r.Slot).gen().Load()
	return Check(r, slot, gen, bs)
}

func TestFillGetRead(t *testing.T) {
	c, err := New(arena(4), bs, 100)
	if err != nil {
		t.Fatal(err)
	}
	want := pattern(3, 9, 300)
	r, err := c.Fill(7, 3, 9, want)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := c.Get(7, 3, 9); !ok || got != r {
		t.Fatalf("Get: %+v %v, want %+v", got, ok, r)
	}
	if _, ok := c.Get(7, 3, 10); ok {
		t.Fatal("Get found a block at a version older than asked")
	}
	if _, ok := c.Get(7, 4, 0); ok {
		t.Fatal("Get found a block never filled")
	}
	got, err := read(c, r)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read: %v, equal %v", err, bytes.Equal(got, want))
	}
	if r.Gen < 100 || r.Gen%2 != 0 {
		t.Fatalf("generation %d: not even, or below the base", r.Gen)
	}
}

// TestStaleReferencesFail: a refill, an eviction, an invalidation of the
// block or its chunk each make the references given before fail.
func TestStaleReferencesFail(t *testing.T) {
	c, _ := New(arena(2), bs, 0)
	r1, _ := c.Fill(1, 0, 1, pattern(0, 1, bs))
	r2, _ := c.Fill(1, 0, 2, pattern(0, 2, bs)) // the same block, newer
	if _, err := read(c, r1); !errors.Is(err, ErrStale) {
		t.Fatalf("refilled: %v", err)
	}
	if got, err := read(c, r2); err != nil || !bytes.Equal(got, pattern(0, 2, bs)) {
		t.Fatalf("current: %v", err)
	}
	// Two more blocks in a cache of two slots: one of the three goes.
	ra, _ := c.Fill(2, 0, 1, pattern(5, 1, 10))
	rb, _ := c.Fill(3, 0, 1, pattern(6, 1, 10))
	alive := 0
	for _, r := range []Ref{r2, ra, rb} {
		if _, err := read(c, r); err == nil {
			alive++
		} else if !errors.Is(err, ErrStale) {
			t.Fatal(err)
		}
	}
	if alive != 2 {
		t.Fatalf("%d of 3 references alive in a cache of 2", alive)
	}
	for _, r := range []Ref{ra, rb} {
		c.InvalidateChunk(r.Chunk)
		if _, err := read(c, r); !errors.Is(err, ErrStale) {
			t.Fatalf("invalidated chunk %v: %v", r.Chunk, err)
		}
	}
	r3, _ := c.Fill(4, 2, 1, pattern(2, 1, 10))
	c.Invalidate(4, 2)
	if _, err := read(c, r3); !errors.Is(err, ErrStale) {
		t.Fatalf("invalidated block: %v", err)
	}
}

// TestCheckRefusesAltered: a copy whose bytes, header or reference do not
// agree is refused.
func TestCheckRefusesAltered(t *testing.T) {
	c, _ := New(arena(2), bs, 0)
	r, _ := c.Fill(9, 1, 4, pattern(1, 4, 200))
	good := bytes.Clone(c.mem[r.Off(bs) : r.Off(bs)+HeaderSize+bs])
	gen := r.Gen
	alter := map[string]func(s []byte, r *Ref, g *uint64){
		"data byte":     func(s []byte, _ *Ref, _ *uint64) { s[HeaderSize+5] ^= 1 },
		"header chunk":  func(s []byte, _ *Ref, _ *uint64) { s[offChunk] ^= 1 },
		"header len":    func(s []byte, _ *Ref, _ *uint64) { binary.LittleEndian.PutUint32(s[offLen:], 201) },
		"huge len":      func(s []byte, r *Ref, _ *uint64) { binary.LittleEndian.PutUint32(s[offLen:], 1<<30); r.Len = 1 << 30 },
		"ref version":   func(_ []byte, r *Ref, _ *uint64) { r.Version++ },
		"ref block":     func(_ []byte, r *Ref, _ *uint64) { r.Block++ },
		"odd ref gen":   func(s []byte, r *Ref, g *uint64) { r.Gen++; *g = r.Gen; binary.LittleEndian.PutUint64(s, r.Gen) },
		"gen moved":     func(_ []byte, _ *Ref, g *uint64) { *g += 2 },
		"header gen":    func(s []byte, _ *Ref, _ *uint64) { binary.LittleEndian.PutUint64(s, gen+2) },
		"short copy":    func(s []byte, _ *Ref, _ *uint64) {},
		"zero ref gen":  func(s []byte, r *Ref, g *uint64) { r.Gen, *g = 0, 0; binary.LittleEndian.PutUint64(s, 0) },
		"crc":           func(s []byte, _ *Ref, _ *uint64) { s[offCRC] ^= 1 },
		"tail not data": func(s []byte, r *Ref, _ *uint64) { s[HeaderSize+250] ^= 1; r.Len = 260 },
	}
	for name, f := range alter {
		s, rr, g := bytes.Clone(good), r, gen
		f(s, &rr, &g)
		if name == "short copy" {
			s = s[:len(s)-1]
		}
		if _, err := Check(rr, s, g, bs); !errors.Is(err, ErrStale) {
			t.Errorf("%s: %v, want ErrStale", name, err)
		}
	}
	if _, err := Check(r, good, gen, bs); err != nil {
		t.Fatalf("unaltered: %v", err)
	}
}

// TestGenerationsNeverRepeat: over fills, refills, evictions and drops, no
// two fills share a generation, and no slot's generation word ever goes
// back to a value a reference had.
func TestGenerationsNeverRepeat(t *testing.T) {
	c, _ := New(arena(3), bs, 1<<40)
	seen := map[uint64]bool{}
	for i := range 2000 {
		chunk, block := ids.ChunkID(i%5), uint64(i%7)
		switch i % 4 {
		case 3:
			c.Invalidate(chunk, block)
		default:
			r, err := c.Fill(chunk, block, uint64(i), pattern(block, uint64(i), i%bs))
			if err != nil {
				t.Fatal(err)
			}
			if seen[r.Gen] {
				t.Fatalf("fill %d reused generation %d", i, r.Gen)
			}
			seen[r.Gen] = true
		}
		for s := range c.slots {
			if g := c.header(uint32(s)).gen().Load(); g%2 == 0 && g != 0 && (!c.slots[s].used || c.slots[s].refVal.Gen != g) {
				t.Fatalf("slot %d holds even generation %d, not its current fill's", s, g)
			}
		}
	}
}

func TestNewRefusesBadArenas(t *testing.T) {
	if _, err := New(arena(1)[:HeaderSize+bs-1], bs, 0); err == nil {
		t.Error("an arena too small for one slot was taken")
	}
	if _, err := New(arena(2), 100, 0); err == nil {
		t.Error("a block size not a multiple of 8 was taken")
	}
	if _, err := New(arena(2)[1:], bs, 0); err == nil {
		t.Error("an unaligned arena was taken")
	}
	c, _ := New(arena(1), bs, 0)
	if _, err := c.Fill(1, 0, 1, make([]byte, bs+1)); err == nil {
		t.Error("a block larger than the block size was taken")
	}
}

func FuzzCheck(f *testing.F) {
	c, _ := New(arena(1), bs, 0)
	r, _ := c.Fill(3, 2, 1, pattern(2, 1, 100))
	f.Add(bytes.Clone(c.mem[:HeaderSize+bs]), uint64(r.Chunk), r.Block, r.Version, r.Len, r.Gen, r.Gen)
	f.Fuzz(func(t *testing.T, slot []byte, chunk, block, version uint64, n uint32, refGen, gen uint64) {
		rr := Ref{Chunk: ids.ChunkID(chunk), Block: block, Version: version, Len: n, Gen: refGen}
		data, err := Check(rr, slot, gen, bs)
		if err != nil {
			if !errors.Is(err, ErrStale) {
				t.Fatalf("error not ErrStale: %v", err)
			}
			return
		}
		if len(data) != int(n) || gen != refGen || refGen%2 != 0 || len(slot) != HeaderSize+bs {
			t.Fatalf("accepted %d bytes, ref %+v, gen %d", len(data), rr, gen)
		}
	})
}

// TestAdmit: the node serves a guarded read only of a whole slot from its
// header, with the slot's generation as its word, while the slot holds
// the fill the reader names.
func TestAdmit(t *testing.T) {
	c, err := New(arena(4), bs, 100)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Fill(1, 0, 3, pattern(0, 3, bs))
	if err != nil {
		t.Fatal(err)
	}
	off, size := uint64(r.Off(bs)), uint64(HeaderSize+bs)
	if g, err := c.Admit(off, size, off, r.Gen); err != nil || g != r.Gen {
		t.Fatalf("a whole slot: %d, %v", g, err)
	}
	bad := map[string][4]uint64{
		"inside a slot":       {off + 8, size - 8, off, r.Gen},
		"past the last slot":  {4 * size, size, 4 * size, r.Gen},
		"longer than a slot":  {off, size + 1, off, r.Gen},
		"nothing":             {off, 0, off, r.Gen},
		"another slot's word": {off, size, off + size, r.Gen},
		"another fill":        {off, size, off, r.Gen + 2},
		"an odd generation":   {off, size, off, r.Gen - 1},
	}
	for name, a := range bad {
		if _, err := c.Admit(a[0], a[1], a[2], a[3]); err == nil {
			t.Errorf("%s: admitted", name)
		}
	}
	c.InvalidateChunk(1)
	if _, err := c.Admit(off, size, off, r.Gen); err == nil {
		t.Error("an invalidated fill: admitted")
	}
}

// TestExpire: slots extended to a time are dropped after it (their
// references fail); slots never extended stay; a refill forgets the old
// fill's time.
func TestExpire(t *testing.T) {
	c, err := New(arena(4), bs, 100)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := c.Fill(1, 0, 3, pattern(0, 3, bs))
	b, _ := c.Fill(1, 1, 3, pattern(1, 3, bs))
	k, _ := c.Fill(2, 0, 3, pattern(0, 3, bs))
	c.Extend(a.Slot, a.Gen, 100)
	c.Extend(a.Slot, a.Gen, 50) // never shortens
	c.Extend(b.Slot, b.Gen, 200)
	c.Extend(k.Slot, k.Gen+2, 10) // another fill's: ignored
	if n := c.Expire(150); n != 1 {
		t.Fatalf("expired %d at 150, want 1", n)
	}
	if _, err := read(c, a); !errors.Is(err, ErrStale) {
		t.Fatalf("expired slot: %v", err)
	}
	for _, r := range []Ref{b, k} {
		if _, err := read(c, r); err != nil {
			t.Fatalf("slot %d: %v", r.Slot, err)
		}
	}
	b2, _ := c.Fill(1, 1, 4, pattern(1, 4, bs))
	if n := c.Expire(1 << 40); n != 0 {
		t.Fatalf("a refill kept the old fill's time: %d expired", n)
	}
	if _, err := read(c, b2); err != nil {
		t.Fatal(err)
	}
}
