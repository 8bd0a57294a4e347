package xdr

import (
	"bytes"
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var w Writer
	w.Uint32(7)
	w.Int32(-2)
	w.Uint64(1 << 40)
	w.Bool(true)
	w.Opaque([]byte("abcde"))
	w.String("xy")
	w.Fixed([]byte{1, 2, 3})
	off := w.Reserve(4)
	w.Put32(off, 99)
	if len(w.B)%4 != 0 {
		t.Fatalf("encoding of %d bytes is not 4-aligned", len(w.B))
	}
	want := []byte{0, 0, 0, 7, 0xff, 0xff, 0xff, 0xfe, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1,
		0, 0, 0, 5, 'a', 'b', 'c', 'd', 'e', 0, 0, 0, 0, 0, 0, 2, 'x', 'y', 0, 0, 1, 2, 3, 0, 0, 0, 0, 99}
	if !bytes.Equal(w.B, want) {
		t.Fatalf("encoding\n% x\nwant\n% x", w.B, want)
	}
	r := NewReader(w.B)
	if r.Uint32() != 7 || r.Int32() != -2 || r.Uint64() != 1<<40 || !r.Bool() ||
		string(r.Opaque(5)) != "abcde" || r.String(2) != "xy" || !bytes.Equal(r.Fixed(3), []byte{1, 2, 3}) || r.Uint32() != 99 {
		t.Fatal("decoded values differ")
	}
	if r.Err() != nil || r.Len() != 0 {
		t.Fatalf("err %v, %d left", r.Err(), r.Len())
	}
}

func TestHostile(t *testing.T) {
	// A length beyond the limit, beyond the message, and a bad bool.
	r := NewReader([]byte{0, 0, 0, 9, 'a'})
	if r.Opaque(8); !errors.Is(r.Err(), ErrTooLong) {
		t.Fatalf("over-limit opaque: %v", r.Err())
	}
	r = NewReader([]byte{0, 0, 0, 9, 'a'})
	if r.Opaque(100); !errors.Is(r.Err(), ErrShort) {
		t.Fatalf("truncated opaque: %v", r.Err())
	}
	r = NewReader([]byte{0xff, 0xff, 0xff, 0xff})
	if r.Opaque(1 << 30); r.Err() == nil {
		t.Fatal("a 4 GiB length was accepted")
	}
	r = NewReader([]byte{0, 0, 0, 2})
	if r.Bool(); r.Err() == nil {
		t.Fatal("bool 2 accepted")
	}
	// A count the message cannot hold fails before allocation.
	r = NewReader([]byte{0, 1, 0, 0})
	if n := r.Count(1<<20, 8); n != 0 || !errors.Is(r.Err(), ErrShort) {
		t.Fatalf("count %d, %v", n, r.Err())
	}
	// Sticky: later reads return zero values.
	if r.Uint32() != 0 || r.Uint64() != 0 || r.Opaque(10) != nil {
		t.Fatal("reads after an error returned data")
	}
}

func FuzzReader(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3, 'a', 'b', 'c', 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewReader(b)
		for r.Err() == nil && r.Len() > 0 {
			switch r.Len() % 5 {
			case 0:
				r.Uint32()
			case 1:
				if p := r.Opaque(64); len(p) > 64 {
					t.Fatal("opaque over its bound")
				}
			case 2:
				r.Count(1000, 4)
			case 3:
				r.Uint64()
			default:
				r.Bool()
			}
			if r.Pos() > len(b) {
				t.Fatal("read past the end")
			}
		}
	})
}

func TestChunks(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 1024)
	w := Writer{ChunkMin: 1024}
	w.Uint32(1)
	w.Opaque([]byte("small"))
	w.Opaque(big)
	w.Uint32(2)
	if len(w.Chunks) != 1 || w.Chunks[0].Pos != 4+4+8+4 {
		t.Fatalf("chunks %+v", w.Chunks)
	}
	if w.Copied != 5 {
		t.Fatalf("copied %d, want 5 (the chunk is not copied)", w.Copied)
	}
	if len(w.B) != 4+12+4+4 {
		t.Fatalf("inline stream %d bytes", len(w.B))
	}

	pulled := append([]byte(nil), big...)
	r := NewReader(w.B)
	r.SetChunks([]Chunk{{Pos: w.Chunks[0].Pos, Data: pulled}})
	if r.Uint32() != 1 || string(r.Opaque(16)) != "small" {
		t.Fatal("inline items")
	}
	if got := r.Opaque(4096); &got[0] != &pulled[0] || r.Uint32() != 2 || r.Err() != nil {
		t.Fatalf("chunked opaque not returned in place: %v", r.Err())
	}

	// A chunk of another length than the inline length word.
	r = NewReader(w.B)
	r.SetChunks([]Chunk{{Pos: w.Chunks[0].Pos, Data: pulled[:1000]}})
	r.Uint32()
	r.Opaque(16)
	if r.Opaque(4096); !errors.Is(r.Err(), ErrChunk) {
		t.Fatalf("length mismatch: %v", r.Err())
	}
	// A chunk where a non-opaque item is.
	r = NewReader(w.B)
	r.SetChunks([]Chunk{{Pos: 4, Data: pulled}})
	if r.Uint32(); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if r.Uint64(); !errors.Is(r.Err(), ErrChunk) {
		t.Fatalf("chunk inside an item: %v", r.Err())
	}
	// Writer without ChunkMin copies.
	var c Writer
	c.Opaque(big)
	if len(c.Chunks) != 0 || c.Copied != 1024 {
		t.Fatal("inline writer chunked")
	}
	held := 0
	w.Hold(func() { held++ })
	w.Release()
	w.Release()
	if held != 1 || len(w.Chunks) != 0 {
		t.Fatalf("holds ran %d times", held)
	}
}
