package wire

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/sluicefs/sluice/internal/extent"
	"github.com/sluicefs/sluice/internal/plan"
)

func TestWriteRoundTrip(t *testing.T) {
	h := WriteHeader{Strategy: plan.Ring, Rank: 1, Chunk: 99, Off: 4096, Len: 1 << 20, Version: 7, WriteID: 0xabcdef, Cap: []byte("capability-bytes")}
	addrs := []string{"127.0.0.1:1", "127.0.0.1:22", "[::1]:333"}
	b, err := AppendWrite(nil, &h, addrs)
	if err != nil {
		t.Fatal(err)
	}
	var got WriteHeader
	if err := ParseWrite(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Strategy != h.Strategy || got.Rank != 1 || got.Chunk != 99 || got.Off != 4096 || got.Len != 1<<20 || got.Version != 7 || got.WriteID != 0xabcdef || !bytes.Equal(got.Cap, h.Cap) {
		t.Fatalf("got %+v", got)
	}
	for i, a := range addrs {
		if string(got.Addrs.At(i)) != a {
			t.Fatalf("addr %d = %q", i, got.Addrs.At(i))
		}
	}
	fwd := AppendForward(nil, &got, 2, 8, 7)
	var next WriteHeader
	if err := ParseWrite(fwd, &next); err != nil {
		t.Fatal(err)
	}
	if next.Rank != 2 || next.Version != 8 || next.Base != 7 || next.Flags&FlagBase != 0 || next.WriteID != 0xabcdef || string(next.Addrs.At(2)) != addrs[2] {
		t.Fatalf("forwarded header %+v", next)
	}
	// A write skipping doubtful versions carries its base.
	fwd = AppendForward(nil, &got, 2, 8, 5)
	if err := ParseWrite(fwd, &next); err != nil {
		t.Fatal(err)
	}
	if next.Version != 8 || next.Base != 5 || next.Flags&FlagBase == 0 || string(next.Addrs.At(2)) != addrs[2] {
		t.Fatalf("forwarded header with a base %+v", next)
	}
	if again := AppendForward(nil, &next, 2, next.Version, next.Base); !bytes.Equal(again, fwd) {
		t.Fatal("header with a base does not re-encode identically")
	}
	// A sealed header: the seal covers everything before it.
	sealed := SealForward(AppendForward(nil, &got, 1, 8, 5), func(body []byte) (s [SealSize]byte) {
		for i := range s {
			s[i] = 0xA5
		}
		s[0] = byte(len(body))
		return
	})
	if err := ParseWrite(sealed, &next); err != nil {
		t.Fatal(err)
	}
	if next.Flags&FlagSealed == 0 || next.Base != 5 || len(next.Seal) != SealSize || next.Seal[0] != byte(len(sealed)-SealSize) ||
		!bytes.Equal(next.Sealed, sealed[:len(sealed)-SealSize]) || string(next.Addrs.At(2)) != addrs[2] {
		t.Fatalf("sealed header %+v", next)
	}
	var trunc WriteHeader
	if ParseWrite(sealed[:len(sealed)-1], &trunc) == nil {
		t.Fatal("truncated seal accepted")
	}
	// Re-forwarding drops the old seal.
	if again := AppendForward(nil, &next, 2, 8, 5); bytes.Contains(again, next.Seal) || again[7]&FlagSealed != 0 {
		t.Fatal("forwarded header kept the previous seal")
	}
	for _, base := range []uint64{7, 8, 9, ^uint64(0)} {
		bad, err := AppendWrite(nil, &WriteHeader{Strategy: plan.Ring, Flags: FlagBase, Version: 8, Base: base, Cap: []byte("c")}, addrs)
		if err != nil {
			t.Fatal(err)
		}
		if err := ParseWrite(bad, &next); !errors.Is(err, ErrMalformed) {
			t.Fatalf("flagged base %d for version 8: %v", base, err)
		}
	}
	// Every truncation fails cleanly.
	for i := 0; i < len(b); i++ {
		if err := ParseWrite(b[:i], &got); !errors.Is(err, ErrMalformed) {
			t.Fatalf("truncated to %d: %v", i, err)
		}
	}
	if err := ParseWrite(append(b, 0), &got); !errors.Is(err, ErrMalformed) {
		t.Fatal("trailing byte accepted")
	}
}

func TestWriteModesRoundTrip(t *testing.T) {
	h := WriteHeader{Strategy: plan.Tree, Mode: plan.Pull, Flags: FlagRaw | FlagReserve, Rank: 2, Chunk: 1, Len: 10,
		Cap: []byte("c"), RegionKey: 0xabc, RegionOff: 77}
	b, err := AppendWrite(nil, &h, []string{"a:1", "b:2", "c:3"})
	if err != nil {
		t.Fatal(err)
	}
	var got WriteHeader
	if err := ParseWrite(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Strategy != plan.Tree || got.Mode != plan.Pull || got.Flags != FlagRaw|FlagReserve || got.RegionKey != 0xabc || got.RegionOff != 77 {
		t.Fatalf("got %+v", got)
	}
	if fwd := AppendForward(nil, &got, 2, 0, 0); !bytes.Equal(fwd, b) {
		t.Fatal("forwarded pull header differs")
	}
	bad := append([]byte(nil), b...)
	bad[6] = 9
	if ParseWrite(bad, &got) == nil {
		t.Fatal("unknown mode accepted")
	}
	bad = append([]byte(nil), b...)
	bad[7] = 0x80
	if ParseWrite(bad, &got) == nil {
		t.Fatal("unknown flag accepted")
	}
	if ParseWrite(b[:len(b)-1], &got) == nil {
		t.Fatal("truncated region accepted")
	}
	for _, tc := range []struct {
		s    plan.Strategy
		r, n int
		want []int
	}{
		{plan.Ring, 0, 4, []int{1}}, {plan.Ring, 3, 4, nil},
		{plan.Tree, 0, 4, []int{1, 2}}, {plan.Tree, 1, 4, []int{3}}, {plan.Tree, 1, 5, []int{3, 4}}, {plan.Tree, 2, 4, nil},
		{plan.Flat, 0, 4, nil},
	} {
		if got := tc.s.Children(tc.r, tc.n); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%v children of %d/%d = %v, want %v", tc.s, tc.r, tc.n, got, tc.want)
		}
	}
}

func TestReadRoundTrip(t *testing.T) {
	h := ReadHeader{Chunk: 5, Off: 1, Len: 2, RegionKey: 3, RegionOff: 4, Cap: []byte("cap")}
	b, _ := AppendRead(nil, &h)
	var got ReadHeader
	if err := ParseRead(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Chunk != 5 || got.Off != 1 || got.Len != 2 || got.RegionKey != 3 || got.RegionOff != 4 || string(got.Cap) != "cap" {
		t.Fatalf("got %+v", got)
	}
	for i := 0; i < len(b); i++ {
		if err := ParseRead(b[:i], &got); err == nil {
			t.Fatalf("truncated to %d accepted", i)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	r := Reply{Status: StatusStale, Version: 3, ChunkLen: 100, DataOff: 16384, DataLen: 50, BlockSize: 16384}
	b := AppendReply(nil, &r, []uint32{1, 0xdeadbeef}, "have 2 want 3")
	var got Reply
	if err := ParseReply(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusStale || got.Version != 3 || got.ChunkLen != 100 || got.DataOff != 16384 || got.DataLen != 50 || got.BlockSize != 16384 {
		t.Fatalf("got %+v", got)
	}
	if got.NCRC() != 2 || got.CRC(1) != 0xdeadbeef || string(got.Msg) != "have 2 want 3" {
		t.Fatalf("crcs/msg wrong: %+v", got)
	}
	var we *Error
	if err := got.Err(); !errors.As(err, &we) || we.Status != StatusStale {
		t.Fatalf("Err() = %v", err)
	}
	pb := AppendError(nil, &PartialError{Err: Errorf(StatusReplica, "child gone")})
	if err := ParseReply(pb, &got); err != nil || !got.Partial || got.Status != StatusReplica || !IsPartial(got.Err()) {
		t.Fatalf("partial reply: %v %+v", err, got)
	}
	// A reservation skipping doubtful versions carries its base.
	rb := AppendReply(nil, &Reply{Status: StatusOK, Version: 9, Skipped: 2}, []uint32{5}, "m")
	if err := ParseReply(rb, &got); err != nil || got.Version != 9 || got.Skipped != 2 || got.NCRC() != 1 || got.CRC(0) != 5 || string(got.Msg) != "m" {
		t.Fatalf("reply with skipped versions: %v %+v", err, got)
	}
	if err := ParseReply(rb[:len(rb)-6], &got); !errors.Is(err, ErrMalformed) {
		t.Fatalf("truncated reply with skipped versions: %v", err)
	}
	if err := ParseReply(AppendReply(nil, &Reply{Version: 2, Skipped: 2}, nil, ""), &got); !errors.Is(err, ErrMalformed) {
		t.Fatalf("skipping below version 0: %v", err)
	}
	cb := AppendReply(nil, &Reply{Status: StatusOK, Version: 4, Corrupt: true}, nil, "")
	if err := ParseReply(cb, &got); err != nil || !got.Corrupt || got.Partial || got.Version != 4 {
		t.Fatalf("a fence answer with a corrupt copy: %v %+v", err, got)
	}
	if err := ParseReply(AppendReply(nil, &Reply{Version: 4}, nil, ""), &got); err != nil || got.Corrupt {
		t.Fatalf("Corrupt kept from the last reply: %+v", got)
	}
	long := AppendStatus(nil, StatusIO, string(make([]byte, 2*MaxMsg)))
	if err := ParseReply(long, &got); err != nil || len(got.Msg) != MaxMsg {
		t.Fatalf("long text not truncated: %v %d", err, len(got.Msg))
	}
}

func TestReplyBadBlocks(t *testing.T) {
	data := make([]byte, 3*4096+100)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var crcs []uint32
	for i := 0; i < len(data); i += 4096 {
		crcs = append(crcs, crc32.Checksum(data[i:min(i+4096, len(data))], crc32.MakeTable(crc32.Castagnoli)))
	}
	var r Reply
	if err := ParseReply(AppendReply(nil, &Reply{DataOff: 8192, DataLen: uint64(len(data)), BlockSize: 4096}, crcs, ""), &r); err != nil {
		t.Fatal(err)
	}
	if bad := r.BadBlocks(data, nil); bad != nil {
		t.Fatalf("intact data has bad blocks %v", bad)
	}
	data[4096+5]++
	data[len(data)-1]++
	want := extent.List{{Off: 8192 + 4096, Len: 4096}, {Off: 8192 + 3*4096, Len: 100}}
	if bad := r.BadBlocks(data, nil); len(bad) != 2 || bad[0] != want[0] || bad[1] != want[1] {
		t.Fatalf("bad blocks %v, want %v", bad, want)
	}
}

func TestRepairHeaderFlags(t *testing.T) {
	addrs := []string{"a:1", "b:2", "c:3"}
	b, err := AppendRepair(nil, &RepairHeader{Mode: RepairCopy, Flags: RepairHeal, Unit: 0, Version: 3, Len: 10, Survivors: []byte{2, 1}, Cap: []byte("c")}, addrs)
	if err != nil {
		t.Fatal(err)
	}
	var h RepairHeader
	if err := ParseRepair(b, &h); err != nil || h.Flags != RepairHeal || len(h.Survivors) != 2 {
		t.Fatalf("heal with two survivors: %v %+v", err, h)
	}
	for _, bad := range []RepairHeader{
		{Mode: RepairCopy, Flags: 2, Version: 3, Survivors: []byte{1}},
		{Mode: RepairFence, Flags: RepairHeal},
		{Mode: RepairCopy, Version: 3}, // no survivor
	} {
		bad.Cap = []byte("c")
		b, _ := AppendRepair(nil, &bad, addrs)
		if err := ParseRepair(b, &h); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v accepted: %v", bad, err)
		}
	}
}

func mustParse(f *testing.F, b []byte) *WriteHeader {
	var h WriteHeader
	if err := ParseWrite(b, &h); err != nil {
		f.Fatal(err)
	}
	return &h
}

func FuzzParse(f *testing.F) {
	w, _ := AppendWrite(nil, &WriteHeader{Strategy: plan.Ring, Cap: []byte("c")}, []string{"a:1", "b:2"})
	r, _ := AppendRead(nil, &ReadHeader{Cap: []byte("c")})
	f.Add(w)
	f.Add(r)
	f.Add(AppendReply(nil, &Reply{}, []uint32{1}, "x"))
	f.Add(AppendReply(nil, &Reply{Version: 3, Skipped: 1, Export: Export{Epoch: 1, Region: 2, Block: 4096, First: 5, List: []ExportRef{{Slot: 1, Gen: 2}, {Slot: 3, Gen: 4, Key: [16]byte{7}}}}}, []uint32{1, 2}, "m"))
	f.Add(AppendForward(w[:0:0], mustParse(f, w), 1, 9, 5))
	f.Add(SealForward(AppendForward(nil, mustParse(f, w), 1, 9, 8), func([]byte) [SealSize]byte { return [SealSize]byte{1, 2} }))
	f.Add(AppendReply(nil, &Reply{Status: StatusReplica, Partial: true, Version: 9, Skipped: 3}, []uint32{1}, "x"))
	ec, _ := AppendWrite(nil, &WriteHeader{Strategy: plan.EC, Flags: FlagEncode, Rank: 1, Version: 4, Cap: []byte("c")}, []string{"a:1", "b:2", "c:3"})
	f.Add(ec)
	f.Add(SealForward(AppendPartial(nil, mustParse(f, ec), 2, 1, 4, 3), func([]byte) [SealSize]byte { return [SealSize]byte{7} }))
	sr, _ := AppendRead(nil, &ReadHeader{Scaled: true, Coef: 0x8e, Len: 4096, RegionKey: 3, Cap: []byte("c")})
	f.Add(sr)
	rep, _ := AppendRepair(nil, &RepairHeader{Mode: RepairGather, Unit: 2, Version: 3, Len: 1 << 20, Survivors: []byte{0, 1}, Cap: []byte("c")}, []string{"a:1", "b:2", "c:3"})
	f.Add(rep)
	fence, _ := AppendRepair(nil, &RepairHeader{Mode: RepairFence, Unit: 1, Cap: []byte("c")}, []string{"a:1", "b:2"})
	f.Add(fence)
	cp, _ := AppendRepair(nil, &RepairHeader{Mode: RepairCopy, Unit: 2, Version: 3, Len: 1 << 20, Survivors: []byte{0}, Cap: []byte("c")}, []string{"a:1", "b:2", "c:3"})
	f.Add(cp)
	heal, _ := AppendRepair(nil, &RepairHeader{Mode: RepairCopy, Flags: RepairHeal, Unit: 0, Version: 3, Len: 1 << 20, Survivors: []byte{2, 1}, Cap: []byte("c")}, []string{"a:1", "b:2", "c:3"})
	f.Add(heal)
	f.Add(AppendReply(nil, &Reply{Status: StatusOK, Corrupt: true, Version: 9}, nil, ""))
	drop, _ := AppendRepair(nil, &RepairHeader{Mode: RepairDrop, Unit: 0, Version: 1, Cap: []byte("c")}, []string{"a:1", "b:2", "c:3"})
	f.Add(drop)
	f.Fuzz(func(t *testing.T, b []byte) {
		var wh WriteHeader
		if ParseWrite(b, &wh) == nil {
			for i := 0; i < wh.Addrs.Len(); i++ {
				if len(wh.Addrs.At(i)) == 0 {
					t.Fatal("empty address accepted")
				}
			}
			re := AppendForward(nil, &wh, wh.Rank, wh.Version, wh.Base)
			if wh.Flags&FlagSealed != 0 {
				re = SealForward(re, func([]byte) (s [SealSize]byte) { copy(s[:], wh.Seal); return })
				if !bytes.Equal(wh.Sealed, b[:len(b)-SealSize]) {
					t.Fatal("sealed bytes are not the header before its seal")
				}
			}
			if !bytes.Equal(re, b) {
				t.Fatal("write header does not re-encode identically")
			}
		}
		var rh ReadHeader
		if ParseRead(b, &rh) == nil {
			re, _ := AppendRead(nil, &rh)
			if !bytes.Equal(re, b) {
				t.Fatal("read header does not re-encode identically")
			}
		}
		var rr RepairHeader
		if ParseRepair(b, &rr) == nil {
			addrs := make([]string, rr.Addrs.Len())
			for i := range addrs {
				addrs[i] = string(rr.Addrs.At(i))
			}
			re, err := AppendRepair(nil, &rr, addrs)
			if err != nil || !bytes.Equal(re, b) {
				t.Fatalf("repair header does not re-encode identically: %v", err)
			}
			if len(rr.Survivors) >= rr.Addrs.Len() || int(rr.Unit) >= rr.Addrs.Len() {
				t.Fatal("repair header with impossible units accepted")
			}
			if rr.Mode.Survivorless() != (len(rr.Survivors) == 0) || (rr.Mode.Survivorless() && rr.Flags != 0) || rr.Flags&^RepairHeal != 0 || rr.Mode > RepairDrop {
				t.Fatalf("%s with %d survivors and flags %#x accepted", rr.Mode, len(rr.Survivors), rr.Flags)
			}
		}
		var rp Reply
		if ParseReply(b, &rp) == nil {
			_ = rp.NCRC()
			if rp.NCRC() > 0 {
				_ = rp.CRC(rp.NCRC() - 1)
			}
			if rp.Export.Block != 0 {
				// Accepted references re-encode to the same bytes.
				e := rp.Export
				for i := range e.N() {
					e.List = append(e.List, e.Ref(i))
				}
				if e.N() == 0 || e.N() > MaxExportRefs {
					t.Fatalf("%d export references accepted", e.N())
				}
				crcs := make([]uint32, rp.NCRC())
				for i := range crcs {
					crcs[i] = rp.CRC(i)
				}
				again := rp
				again.Export = e
				if enc := AppendReply(nil, &again, crcs, string(rp.Msg)); !bytes.Equal(enc, b) {
					t.Fatalf("reply with export references re-encodes differently:\n%x\n%x", b, enc)
				}
			}
		}
	})
}

func TestReplyReadData(t *testing.T) {
	data := make([]byte, 3*4096+100) // the chunk's end: 8192+len(data)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var crcs []uint32
	for i := 0; i < len(data); i += 4096 {
		crcs = append(crcs, crc32.Checksum(data[i:min(i+4096, len(data))], crc32.MakeTable(crc32.Castagnoli)))
	}
	reply := func(h Reply, crcs []uint32) *Reply {
		var r Reply
		if err := ParseReply(AppendReply(nil, &h, crcs, ""), &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	chunkLen := uint64(8192 + len(data))
	r := reply(Reply{DataOff: 8192, DataLen: uint64(len(data)), BlockSize: 4096, ChunkLen: chunkLen}, crcs)
	buf := make([]byte, 4*4096)
	copy(buf, data)
	// A read of [8202, +13000) reaches past the chunk's end.
	got, bad, err := r.ReadData(buf, 8202, 13000)
	if err != nil || bad != nil {
		t.Fatalf("intact reply: %v, bad %v", err, bad)
	}
	if !bytes.Equal(got[:len(data)-10], data[10:]) || got[len(got)-1] != 0 || len(got) != 13000 {
		t.Fatal("requested bytes wrong, or not zero-filled past the chunk's end")
	}
	copy(buf, data)
	buf[4096+5]++
	if _, bad, _ := r.ReadData(buf, 8202, 13000); len(bad) != 1 || bad[0] != (extent.Extent{Off: 8192 + 4096, Len: 4096}) {
		t.Fatalf("bad %v, want the second block", bad)
	}
	for _, c := range []struct {
		r   *Reply
		off int64
	}{
		{reply(Reply{DataOff: 8192, DataLen: uint64(len(data)), BlockSize: 3000, ChunkLen: chunkLen}, crcs), 8202},
		{reply(Reply{DataOff: 8192, DataLen: uint64(len(data)), BlockSize: 4096, ChunkLen: chunkLen}, crcs[:3]), 8202},
		{reply(Reply{DataOff: 8192, DataLen: 4096, BlockSize: 4096, ChunkLen: chunkLen}, crcs[:1]), 8202},
		{r, 8192 + 4096 + 10},
	} {
		if _, _, err := c.r.ReadData(buf, c.off, 13000); err == nil {
			t.Fatalf("reply %+v accepted for a read at %d", c.r, c.off)
		}
	}
}
