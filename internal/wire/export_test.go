package wire

import (
	"encoding/binary"
	"errors"
	"testing"
)

func TestReplyExportRoundTrip(t *testing.T) {
	want := Export{Epoch: 7, Region: 1<<63 | 5, Block: 4096, First: 3, List: []ExportRef{{Slot: 1, Gen: 10, Key: [16]byte{1, 2, 3}}, {Slot: 9, Gen: 1 << 40, Key: [16]byte{15: 9}}}}
	b := AppendReply(nil, &Reply{Version: 4, Skipped: 1, DataOff: 12288, DataLen: 8192, BlockSize: 4096, Export: want}, []uint32{1, 2}, "x")
	var got Reply
	if err := ParseReply(b, &got); err != nil {
		t.Fatal(err)
	}
	e := got.Export
	if e.Epoch != 7 || e.Region != want.Region || e.Block != 4096 || e.First != 3 || e.N() != 2 || e.Ref(0) != want.List[0] || e.Ref(1) != want.List[1] {
		t.Fatalf("decoded %+v", e)
	}
	if got.Skipped != 1 || got.NCRC() != 2 || got.CRC(1) != 2 || string(got.Msg) != "x" {
		t.Fatalf("the rest of the reply: %+v", got)
	}
	if len(b) != ReplySize(2, 1)+8+ExportSize(2) {
		t.Fatalf("%d bytes, ReplySize+Skipped+ExportSize say %d", len(b), ReplySize(2, 1)+8+ExportSize(2))
	}
	// A reply without references decodes with none, even into a Reply
	// that had some.
	if err := ParseReply(AppendReply(nil, &Reply{Version: 1}, nil, ""), &got); err != nil || got.Export.Block != 0 || got.Export.N() != 0 {
		t.Fatalf("no references: %v %+v", err, got.Export)
	}
	// No references listed: no trailer, whatever else Export says.
	if err := ParseReply(AppendReply(nil, &Reply{Version: 1, Export: Export{Block: 4096}}, nil, ""), &got); err != nil || got.Export.Block != 0 {
		t.Fatalf("empty list: %v %+v", err, got.Export)
	}
}

func TestReplyExportMalformed(t *testing.T) {
	good := AppendReply(nil, &Reply{Version: 4, Export: Export{Epoch: 1, Region: 2, Block: 4096, First: 0, List: []ExportRef{{Slot: 1, Gen: 2}}}}, nil, "")
	at := replyFixed // the trailer's start (no Skipped)
	cases := map[string]func(b []byte) []byte{
		"block not a power of two": func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at+16:], 4097); return b },
		"block too small":          func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at+16:], 256); return b },
		"block too large":          func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at+16:], 2<<20); return b },
		"no references":            func(b []byte) []byte { binary.LittleEndian.PutUint16(b[at+20:], 0); return b },
		"too many references":      func(b []byte) []byte { binary.LittleEndian.PutUint16(b[at+20:], MaxExportRefs+1); return b },
		"more than the bytes":      func(b []byte) []byte { binary.LittleEndian.PutUint16(b[at+20:], 2); return b },
		"reserved":                 func(b []byte) []byte { b[at+22] = 1; return b },
		"first out of range":       func(b []byte) []byte { binary.LittleEndian.PutUint64(b[at+24:], 1<<62); return b },
		"truncated":                func(b []byte) []byte { return b[:at+10] },
	}
	for name, f := range cases {
		b := f(append([]byte(nil), good...))
		var r Reply
		if err := ParseReply(b, &r); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

func TestParseReplyExportAllocatesNothing(t *testing.T) {
	b := AppendReply(nil, &Reply{Version: 4, Export: Export{Epoch: 1, Region: 2, Block: 4096, List: []ExportRef{{Slot: 1, Gen: 2}, {Slot: 3, Gen: 4}}}}, []uint32{9}, "")
	var r Reply
	if n := testing.AllocsPerRun(100, func() {
		if err := ParseReply(b, &r); err != nil {
			t.Fatal(err)
		}
		_ = r.Export.Ref(1)
	}); n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}
