package fabricrpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
)

// checkHeader checks what parseHeader accepted against its invariants.
func checkHeader(t *testing.T, b []byte, h *header, maxChunk, maxTotal int) {
	t.Helper()
	if h.xid != binary.BigEndian.Uint32(b) {
		t.Fatalf("xid %#x of a message starting %x", h.xid, b[:4])
	}
	switch h.proc {
	case procDone:
		if len(b) != fixedHeader || len(h.refs) != 0 || len(h.body) != 0 || h.long {
			t.Fatalf("DONE of %d bytes parsed as %+v", len(b), h)
		}
		if !bytes.Equal(doneMsg(h.xid), b) {
			t.Fatalf("DONE re-encodes as %x, was %x", doneMsg(h.xid), b)
		}
		return
	case procMsg:
	default:
		t.Fatalf("procedure %d accepted", h.proc)
	}
	if len(h.refs) > maxChunks {
		t.Fatalf("%d chunks accepted", len(h.refs))
	}
	total := 0
	for i, r := range h.refs {
		total += int(r.len)
		switch {
		case r.len == 0 || int(r.len) > maxChunk:
			t.Fatalf("chunk %d of %d bytes accepted", i, r.len)
		case r.pos%4 != 0:
			t.Fatalf("chunk %d at unaligned offset %d", i, r.pos)
		case i == 0 && r.pos == 0 != h.long:
			t.Fatalf("first chunk at %d, long %v", r.pos, h.long)
		case i > 0 && r.pos == 0:
			t.Fatalf("data chunk %d at offset 0", i)
		case i > 0 && !(h.long && i == 1) && r.pos <= h.refs[i-1].pos:
			t.Fatalf("chunk offsets not ascending: %+v", h.refs)
		}
	}
	if total > maxTotal {
		t.Fatalf("chunks of %d bytes accepted", total)
	}
	if h.long && len(h.body) != 0 {
		t.Fatalf("long message with %d inline bytes", len(h.body))
	}
	if n := len(h.refs); !h.long && n > 0 && int(h.refs[n-1].pos) > len(h.body) {
		t.Fatalf("chunk at %d past the %d-byte body", h.refs[n-1].pos, len(h.body))
	}
	if len(h.body) > 0 && &h.body[len(h.body)-1] != &b[len(b)-1] {
		t.Fatal("body is not the message's tail")
	}
	// Round trip: the header re-encodes to the same bytes, which parse
	// to the same header.
	enc := append(appendHeader(nil, h.xid, h.refs), h.body...)
	if !bytes.Equal(enc, b) {
		t.Fatalf("re-encoded as %x, was %x", enc, b)
	}
	var h2 header
	if err := parseHeader(enc, &h2, maxChunk, maxTotal); err != nil {
		t.Fatalf("re-encoded header refused: %v", err)
	}
	if h2.xid != h.xid || h2.long != h.long || !bytes.Equal(h2.body, h.body) || len(h2.refs) != len(h.refs) ||
		len(h.refs) > 0 && !reflect.DeepEqual(h2.refs, h.refs) {
		t.Fatalf("re-encoded header parses as %+v, want %+v", h2, h)
	}
}

// FuzzParseHeader: arbitrary bytes never panic parseHeader; what it
// accepts satisfies its invariants and round-trips through appendHeader;
// what it refuses is an ErrProtocol naming the xid when there is one.
func FuzzParseHeader(f *testing.F) {
	f.Add(appendHeader(nil, 1, nil), uint32(MaxChunk))
	f.Add(doneMsg(7), uint32(MaxChunk))
	f.Add(callMsg(2, procEcho, []chunkRef{{pos: dataPos, len: 2000, key: 3, addr: 4}}, words(2000)), uint32(MaxChunk))
	f.Add(appendHeader(nil, 3, []chunkRef{{len: 100, key: 5}, {pos: 44, len: 2000, key: 6}}), uint32(MaxChunk))
	f.Add(appendHeader(nil, 4, []chunkRef{{pos: 8, len: 1, key: 5}, {pos: 4, len: 2, key: 6}}), uint32(1000))
	f.Add(words(1, Version, procMsg, 2, 0), uint32(MaxChunk))
	f.Add(words(1, 2, procMsg, 0), uint32(MaxChunk))
	var many []chunkRef
	for i := range maxChunks + 1 {
		many = append(many, chunkRef{pos: uint32(4 * (i + 1)), len: 1, key: 1})
	}
	f.Add(appendHeader(nil, 5, many[:maxChunks]), uint32(MaxChunk))
	f.Add(appendHeader(nil, 5, many), uint32(MaxChunk))
	f.Fuzz(func(t *testing.T, b []byte, maxChunk uint32) {
		mc := int(maxChunk%(2*MaxChunk)) + 1
		maxTotal := 2 * mc
		// A header reused from an earlier parse must not leak into this one.
		h := header{refs: []chunkRef{{pos: 4, len: 9, key: 9, addr: 9}}, long: true, body: []byte{1}, xid: 9, proc: 9}
		err := parseHeader(b, &h, mc, maxTotal)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not ErrProtocol", err)
			}
			if len(b) >= 4 && h.xid != binary.BigEndian.Uint32(b) {
				t.Fatalf("refused message's xid %#x, starts %x", h.xid, b[:4])
			}
			return
		}
		checkHeader(t, b, &h, mc, maxTotal)
	})
}

// fuzzMagicKey in a fuzzed message stands for the key of the fuzzing
// client's region, so that chunks can be pulled.
const fuzzMagicKey = 0x5a5a5a5a5a5a5a5a

var fuzzEnv struct {
	once   sync.Once
	addr   string
	good   *Client
	raw    *fabric.Endpoint
	region *fabric.Region
	conn   *fabric.Conn
	h      *rawClient
	seq    uint32
}

// fuzzSetup serves the test program for the whole fuzzing run.
func fuzzSetup(f *testing.F) {
	e := &fuzzEnv
	e.once.Do(func() {
		// Outlives this test: shared by the fuzzing run's iterations.
		svc := newService()
		svc.openGate()
		srv := &Server{RPC: newRPC(svc), BufCount: 8, DoneTimeout: 50 * time.Millisecond}
		a, err := srv.Listen("127.0.0.1:0")
		if err != nil {
			f.Fatal(err)
		}
		e.addr = a.String()
		if e.good, err = Dial(context.Background(), e.addr, ClientOptions{}); err != nil {
			f.Fatal(err)
		}
		if e.raw, err = fabric.NewEndpoint(fabric.Options{MTU: DefaultBufSize, Quota: DefaultBufCount}); err != nil {
			f.Fatal(err)
		}
		// The region holds a good echo call (for long messages) and then
		// a pattern (for data chunks).
		m := callMsg(1, procEcho, nil, words(2000))[headerSize(0):]
		buf := append(m, pattern(1, 64<<10)...)
		e.region = e.raw.Register(buf, fabric.RemoteRead)
	})
}

// FuzzServerMessage: a message of arbitrary bytes sent to a live server
// neither crashes it nor disturbs another client, and whatever the
// server sends back is a well-formed reply.
func FuzzServerMessage(f *testing.F) {
	fuzzSetup(f)
	mk := uint64(fuzzMagicKey)
	f.Add(callMsg(10, procNull, nil, nil))
	f.Add(callMsg(11, procEcho, nil, words(3, 0x61626300)))
	f.Add(callMsg(12, procEcho, []chunkRef{{pos: dataPos, len: 2000, key: mk, addr: 40000}}, words(2000)))
	f.Add(appendHeader(nil, 13, []chunkRef{{len: dataPos, key: mk}, {pos: dataPos, len: 2000, key: mk, addr: 100}}))
	f.Add(callMsg(14, procHeld, nil, words(5000)))
	f.Add(callMsg(15, procMix, []chunkRef{{pos: 52, len: 1024, key: mk, addr: 4}}, words(1, 7, 100, 1024)))
	f.Add(callMsg(16, procCount, nil, nil))
	f.Add(callMsg(17, procBlock, nil, words(0)))
	f.Add(doneMsg(14))
	f.Add(words(18, Version, procMsg, 1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, m []byte) {
		e := &fuzzEnv
		if len(m) > DefaultBufSize {
			m = m[:DefaultBufSize]
		}
		var magic [8]byte
		binary.BigEndian.PutUint64(magic[:], fuzzMagicKey)
		var key [8]byte
		binary.BigEndian.PutUint64(key[:], e.region.Key())
		m = bytes.ReplaceAll(m, magic[:], key[:])

		if e.conn == nil || e.conn.Err() != nil {
			e.h = &rawClient{ep: e.raw, msgs: make(chan []byte, 256)}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn, err := e.raw.Dial(ctx, e.addr, e.h)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			e.conn, e.h.conn = conn, conn
		}
		r := e.h
		if err := r.send(m); err != nil {
			return // the connection broke on an earlier message
		}
		// A null call after it: once answered (or the connection ended)
		// the server has taken the message in.
		e.seq++
		syncXID := 0xC0000000 | e.seq
		if err := r.send(callMsg(syncXID, procNull, nil, nil)); err == nil {
			for {
				b := r.next(5 * time.Second)
				if b == nil {
					if r.conn.Err() == nil {
						t.Fatal("no answer to a null call on an open connection")
					}
					break
				}
				var h header
				if err := parseHeader(b, &h, MaxChunk, 2*MaxChunk); err != nil || h.proc != procMsg {
					t.Fatalf("server sent a bad message: %v", err)
				}
				if h.xid == syncXID {
					break
				}
			}
		}
		r.mu.Lock()
		bad := r.badPacket
		r.mu.Unlock()
		if bad {
			t.Fatal("server sent a multi-packet message")
		}
		// The other client is unaffected.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		data := pattern(int(e.seq), 2000)
		got, err := echo(ctx, e.good, data, nil)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("well-behaved client: %v", err)
		}
	})
}
