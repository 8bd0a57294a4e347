package oncrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/sluicefs/sluice/internal/xdr"
)

// fragment appends one record-marking fragment to b.
func fragment(b, data []byte, last bool) []byte {
	h := uint32(len(data))
	if last {
		h |= lastFragment
	}
	b = binary.BigEndian.AppendUint32(b, h)
	return append(b, data...)
}

func pattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + i>>8)
	}
	return p
}

func TestRecordRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 4, 100, 70000, 300000}
	var stream bytes.Buffer
	for _, n := range sizes {
		if err := WriteRecord(&stream, pattern(n)); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range []io.Reader{bytes.NewReader(stream.Bytes()), iotest.OneByteReader(bytes.NewReader(stream.Bytes()))} {
		var buf []byte
		for _, n := range sizes {
			rec, err := ReadRecord(r, buf, 300000)
			if err != nil || !bytes.Equal(rec, pattern(n)) {
				t.Fatalf("record of %d: %d bytes, %v", n, len(rec), err)
			}
			if cap(rec) > 300000 {
				t.Fatalf("record of %d: capacity %d over the limit", n, cap(rec))
			}
			buf = rec
		}
		if _, err := ReadRecord(r, buf, 300000); err != io.EOF {
			t.Fatalf("after the last record: %v, want io.EOF", err)
		}
	}
}

func TestRecordFragments(t *testing.T) {
	var s []byte
	s = fragment(s, []byte("abc"), false)
	s = fragment(s, nil, false)
	s = fragment(s, []byte("defgh"), false)
	s = fragment(s, []byte("i"), true)
	s = fragment(s, nil, true) // an empty record
	r := bytes.NewReader(s)
	rec, err := ReadRecord(r, make([]byte, 0, 64), 9)
	if err != nil || string(rec) != "abcdefghi" {
		t.Fatalf("%q, %v", rec, err)
	}
	if rec, err = ReadRecord(r, rec, 9); err != nil || len(rec) != 0 {
		t.Fatalf("empty record: %q, %v", rec, err)
	}

	// One byte over the limit, across fragments.
	if _, err := ReadRecord(bytes.NewReader(s), nil, 8); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("9 bytes with a limit of 8: %v", err)
	}

	// Empty fragments are bounded by count.
	s = nil
	for range maxFragments - 1 {
		s = fragment(s, nil, false)
	}
	if _, err := ReadRecord(bytes.NewReader(fragment(s, []byte("x"), true)), nil, 10); err != nil {
		t.Fatalf("%d fragments: %v", maxFragments, err)
	}
	s = fragment(s, nil, false)
	if _, err := ReadRecord(bytes.NewReader(fragment(s, []byte("x"), true)), nil, 10); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("%d fragments: %v", maxFragments+1, err)
	}
}

func TestRecordTruncated(t *testing.T) {
	full := fragment(fragment(nil, []byte("abcd"), false), []byte("efgh"), true)
	for n := 1; n < len(full); n++ {
		_, err := ReadRecord(bytes.NewReader(full[:n]), nil, 100)
		if err != io.ErrUnexpectedEOF {
			t.Errorf("cut at %d: %v, want io.ErrUnexpectedEOF", n, err)
		}
	}
	if _, err := ReadRecord(bytes.NewReader(nil), nil, 100); err != io.EOF {
		t.Errorf("empty stream: %v, want io.EOF", err)
	}
	boom := errors.New("boom")
	if _, err := ReadRecord(iotest.ErrReader(boom), nil, 100); err != boom {
		t.Errorf("failing reader: %v", err)
	}
}

// TestRecordHugeClaim: a header claiming 1 GiB under a 2 GiB limit, then a
// few bytes and the end, allocates about what arrived, not what was
// claimed.
func TestRecordHugeClaim(t *testing.T) {
	s := binary.BigEndian.AppendUint32(nil, lastFragment|1<<30)
	s = append(s, "only a few bytes"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rec, err := ReadRecord(bytes.NewReader(s), nil, maxFragment)
	runtime.ReadMemStats(&after)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("%v, want io.ErrUnexpectedEOF", err)
	}
	if len(rec) != 0 || cap(rec) > growStep {
		t.Fatalf("returned %d bytes, capacity %d", len(rec), cap(rec))
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("allocated %d bytes for a 16-byte fragment", grew)
	}
}

func TestWriteRecordVectored(t *testing.T) {
	// WriteRecord must not retain or modify rec.
	rec := []byte("payload!")
	var b bytes.Buffer
	if err := WriteRecord(&b, rec); err != nil {
		t.Fatal(err)
	}
	if want := fragment(nil, []byte("payload!"), true); !bytes.Equal(b.Bytes(), want) || string(rec) != "payload!" {
		t.Fatalf("% x", b.Bytes())
	}
	if err := WriteRecord(errWriter{}, rec); err == nil {
		t.Fatal("a failing writer's error was lost")
	}
}

type errWriter struct{}

func (errWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

// A reply written with its opaque data as chunks is byte for byte the
// record of the same reply encoded inline.
func TestWriteChunkedMatchesInline(t *testing.T) {
	for _, sizes := range [][]int{{0}, {8 << 10}, {(8 << 10) + 1}, {1 << 20, 3}, {9000, 8195, 10}} {
		var inline, chunked xdr.Writer
		chunked.ChunkMin = 8 << 10
		for _, w := range []*xdr.Writer{&inline, &chunked} {
			w.Uint32(7)
			for i, n := range sizes {
				p := bytes.Repeat([]byte{byte(i + 1)}, n)
				w.Opaque(p)
				w.Uint32(uint32(n))
			}
		}
		var want, got bytes.Buffer
		if err := WriteRecord(&want, inline.B); err != nil {
			t.Fatal(err)
		}
		n, err := writeChunked(&got, chunked.B, chunked.Chunks)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) || n != len(inline.B) {
			t.Fatalf("sizes %v: chunked record (%d bytes, n %d) differs from inline (%d)", sizes, got.Len(), n, want.Len())
		}
	}
}
