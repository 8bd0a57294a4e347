package wire

import (
	"bytes"
	"errors"
	"testing"
)

func sampleBatch(tb testing.TB) []byte {
	tb.Helper()
	b, err := AppendBatch(nil, []BatchRead{
		{Chunk: 7, Off: 4096, Len: 4096, Window: 16384, RegionKey: 9, RegionOff: 0, Cap: 0},
		{Chunk: 8, Off: 0, Len: 100, Window: 16384, RegionKey: 9, RegionOff: 16384, Cap: 1},
		{Chunk: 7, Off: 1 << 20, Len: 1, Window: 1, RegionKey: 5, RegionOff: 3, Cap: 0},
	}, [][]byte{[]byte("cap-a"), []byte("cap-bb")})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestBatchRoundTrip(t *testing.T) {
	b := sampleBatch(t)
	var h BatchHeader
	if err := ParseBatch(b, &h); err != nil {
		t.Fatal(err)
	}
	if h.Len() != 3 || h.Caps() != 2 {
		t.Fatalf("%d reads, %d caps", h.Len(), h.Caps())
	}
	if d := h.At(1); d.Chunk != 8 || d.Len != 100 || d.RegionOff != 16384 || d.Cap != 1 {
		t.Fatalf("descriptor 1 decoded as %+v", d)
	}
	var caps []string
	h.EachCap(func(_ int, c []byte) { caps = append(caps, string(c)) })
	if len(caps) != 2 || caps[0] != "cap-a" || caps[1] != "cap-bb" {
		t.Fatalf("caps %q", caps)
	}
}

// Each of these is one way a hostile header can be wrong; each must be
// refused as malformed.
func TestBatchRefusesBadShapes(t *testing.T) {
	good := sampleBatch(t)
	put := func(at int, v ...byte) []byte {
		b := bytes.Clone(good)
		copy(b[at:], v)
		return b
	}
	d0 := batchFixed
	cases := map[string][]byte{
		"truncated":       good[:len(good)-1],
		"trailing":        append(bytes.Clone(good), 0),
		"no reads":        put(4, 0, 0),
		"too many reads":  put(4, 0xff, 0xff),
		"caps over reads": put(6, 4, 0),
		"reserved":        put(2, 1),
		"empty read":      put(d0+16, 0, 0, 0, 0),
		"small window":    put(d0+20, 1, 0, 0, 0),
		"no region":       put(d0+24, 0, 0, 0, 0, 0, 0, 0, 0),
		"range overflow":  put(d0+8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"window overflow": put(d0+32, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
		"bad cap index":   put(d0+40, 2, 0),
		"unnamed cap":     put(d0+batchDesc+40, 0, 0),
		"desc reserved":   put(d0+47, 1),
		"zero cap length": put(batchFixed+3*batchDesc, 0, 0),
		"cap too long":    put(batchFixed+3*batchDesc, 0xff, 0),
		"wrong kind":      put(1, 1),
	}
	for name, b := range cases {
		var h BatchHeader
		if err := ParseBatch(b, &h); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The total length bound holds even when each read is within its own.
	var descs []BatchRead
	for range 5 {
		descs = append(descs, BatchRead{Chunk: 1, Len: 4 << 20, Window: 4 << 20, RegionKey: 1})
	}
	b, err := AppendBatch(nil, descs, [][]byte{[]byte("c")})
	if err != nil {
		t.Fatal(err)
	}
	var h BatchHeader
	if err := ParseBatch(b, &h); !errors.Is(err, ErrMalformed) {
		t.Errorf("a 20 MiB batch: %v", err)
	}
}

func TestBatchReplyRoundTrip(t *testing.T) {
	b := AppendBatchReply(nil, 2)
	b = AppendBatchEntry(b, &Reply{Status: StatusOK, Version: 3, DataLen: 4096, BlockSize: 4096}, []uint32{42}, "")
	long := string(bytes.Repeat([]byte("x"), 2*MaxBatchMsg))
	b = AppendBatchEntry(b, &Reply{Status: StatusAuth}, nil, long)
	var got []Reply
	err := ParseBatchReply(b, 2, func(i int, r *Reply) error {
		c := *r
		c.Msg = bytes.Clone(r.Msg)
		got = append(got, c)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Version != 3 || got[0].CRC(0) != 42 || got[1].Status != StatusAuth || len(got[1].Msg) != MaxBatchMsg {
		t.Fatalf("%+v", got)
	}
	if err := ParseBatchReply(b, 3, func(int, *Reply) error { return nil }); !errors.Is(err, ErrMalformed) {
		t.Fatalf("wrong count: %v", err)
	}
	if size := BatchReplySize([]int{1, 0}); len(b) > size {
		t.Fatalf("reply of %d bytes, size bound %d", len(b), size)
	}
}

func FuzzParseBatch(f *testing.F) {
	f.Add(sampleBatch(f))
	rb := AppendBatchReply(nil, 1)
	f.Add(AppendBatchEntry(rb, &Reply{Status: StatusOK, BlockSize: 4096}, []uint32{1}, "m"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h BatchHeader
		if ParseBatch(b, &h) == nil {
			descs := make([]BatchRead, h.Len())
			var total uint64
			for i := range descs {
				descs[i] = h.At(i)
				d := descs[i]
				if d.Len == 0 || d.Window < d.Len || d.RegionKey == 0 || int(d.Cap) >= h.Caps() {
					t.Fatalf("accepted descriptor %+v", d)
				}
				total += uint64(d.Len)
			}
			if total > MaxBatchBytes || h.Len() > MaxBatch {
				t.Fatalf("accepted %d reads of %d bytes", h.Len(), total)
			}
			var caps [][]byte
			h.EachCap(func(_ int, c []byte) { caps = append(caps, c) })
			re, err := AppendBatch(nil, descs, caps)
			if err != nil || !bytes.Equal(re, b) {
				t.Fatalf("batch does not re-encode identically: %v", err)
			}
		}
		n := 0
		if len(b) >= 4 {
			n = int(b[2]) | int(b[3])<<8
		}
		seen := 0
		if ParseBatchReply(b, n, func(i int, r *Reply) error {
			if i != seen || len(r.Msg) > MaxBatchMsg {
				t.Fatalf("reply %d (expected %d), %d bytes of text", i, seen, len(r.Msg))
			}
			seen++
			return nil
		}) == nil && seen != n {
			t.Fatalf("%d replies of %d", seen, n)
		}
	})
}
