package fabricrpc

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/fabric"
	"github.com/sluicefs/sluice/internal/oncrpc"
)

// What the server does with a bad message.
type outcome int

const (
	answered outcome = iota // GARBAGE_ARGS with the message's xid; the connection goes on
	dropped                 // no answer; the connection goes on
	closed                  // the connection is closed
	succeeds                // a good message, for the harness's sake
	rejected                // an RPC-level denial (AUTH_BADCRED) from oncrpc
)

// echoCall is an echo call's arguments whose data is a chunk: just the
// length word, the data (n bytes) at offset callHeaderLen+4.
func echoCall(n uint32) []byte { return words(n) }

const dataPos = callHeaderLen + 4

// bogusKey names no region: a message the server must refuse before
// pulling anything refers to it, so that a pull would end the connection.
const bogusKey = 0x0123456789abcdef

// TestBadInput: a raw client's malformed messages are each answered
// with GARBAGE_ARGS when their xid is known, dropped, or end the
// connection, as the transport specifies, while a well-behaved client
// works on undisturbed.
func TestBadInput(t *testing.T) {
	s, _, addr := startServer(t, nil)
	stop := background(t, addr)
	defer stop()

	type tcase struct {
		name string
		// send sends the bad message; xid is what it should be answered as.
		send func(t *testing.T, r *rawClient, xid uint32)
		want outcome
	}
	msg := func(build func(r *rawClient, xid uint32) []byte) func(*testing.T, *rawClient, uint32) {
		return func(t *testing.T, r *rawClient, xid uint32) {
			if err := r.send(build(r, xid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// region registers n bytes of pattern with the raw client.
	region := func(r *rawClient, n int) *fabric.Region {
		return r.ep.Register(pattern(n, n), fabric.RemoteRead)
	}
	withRefs := func(refs func(r *rawClient) []chunkRef, args []byte) func(*testing.T, *rawClient, uint32) {
		return msg(func(r *rawClient, xid uint32) []byte { return callMsg(xid, procEcho, refs(r), args) })
	}
	raw := func(build func(xid uint32) []byte) func(*testing.T, *rawClient, uint32) {
		return msg(func(_ *rawClient, xid uint32) []byte { return build(xid) })
	}
	hdr := func(xid, vers, proc uint32, rest ...uint32) []byte {
		return append(words(xid, vers, proc), words(rest...)...)
	}
	// wholeCall registers a whole echo call (for a long message) and
	// returns its chunk.
	wholeCall := func(r *rawClient, xid uint32, args []byte) chunkRef {
		m := callMsg(xid, procEcho, nil, args)[headerSize(0):]
		return chunkRef{len: uint32(len(m)), key: r.ep.Register(m, fabric.RemoteRead).Key()}
	}

	cases := []tcase{
		{"good chunked echo", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: 2000, key: region(r, 2000).Key()}}
		}, echoCall(2000)), succeeds},
		{"good long echo with a data chunk", func(t *testing.T, r *rawClient, xid uint32) {
			refs := []chunkRef{wholeCall(r, xid, echoCall(3000)), {pos: dataPos, len: 3000, key: region(r, 3000).Key()}}
			if err := r.send(appendHeader(nil, xid, refs)); err != nil {
				t.Fatal(err)
			}
		}, succeeds},
		{"chunks out of order", withRefs(func(r *rawClient) []chunkRef {
			k := uint64(bogusKey)
			return []chunkRef{{pos: dataPos + 4, len: 2000, key: k}, {pos: dataPos, len: 2000, key: k}}
		}, words(2000, 2000)), answered},
		{"chunks at the same offset", withRefs(func(r *rawClient) []chunkRef {
			k := uint64(bogusKey)
			return []chunkRef{{pos: dataPos, len: 2000, key: k}, {pos: dataPos, len: 2000, key: k}}
		}, echoCall(2000)), answered},
		{"chunk length differs from the length word", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: 1500, key: region(r, 1500).Key()}}
		}, echoCall(2000)), answered},
		{"chunk inside an inline item", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: 2000, key: region(r, 2000).Key()}}
		}, words(4, 0)), answered},
		{"chunk at the verifier", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: callHeaderLen, len: 2000, key: region(r, 2000).Key()}}
		}, echoCall(2000)), rejected},
		{"key never registered", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: 2000, key: bogusKey}}
		}, echoCall(2000)), closed},
		{"key deregistered", withRefs(func(r *rawClient) []chunkRef {
			reg := region(r, 2000)
			r.ep.Deregister(reg)
			return []chunkRef{{pos: dataPos, len: 2000, key: reg.Key()}}
		}, echoCall(2000)), closed},
		{"chunk beyond its region", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: 2000, key: region(r, 1000).Key()}}
		}, echoCall(2000)), closed},
		{"message larger than the receive buffer", func(t *testing.T, r *rawClient, xid uint32) {
			m := callMsg(xid, procEcho, nil, echoCall(DefaultBufSize))
			if err := r.conn.Send(r.conn.NewID(), m, make([]byte, DefaultBufSize)); err != nil {
				t.Fatal(err)
			}
		}, closed},
		{"transport version 2", raw(func(x uint32) []byte { return hdr(x, 2, procMsg, 0) }), answered},
		{"transport version 0", raw(func(x uint32) []byte { return hdr(x, 0, procMsg, 0) }), answered},
		{"unknown transport procedure", raw(func(x uint32) []byte { return hdr(x, Version, 7, 0) }), answered},
		{"header of 8 bytes", raw(func(x uint32) []byte { return hdr(x, Version, procMsg)[:8] }), answered},
		{"header of 4 bytes", raw(func(x uint32) []byte { return hdr(x, Version, procMsg)[:4] }), answered},
		{"header of 3 bytes", raw(func(uint32) []byte { return []byte{1, 2, 3} }), closed},
		{"empty message", raw(func(uint32) []byte { return nil }), closed},
		{"chunk list missing", raw(func(x uint32) []byte { return hdr(x, Version, procMsg) }), answered},
		{"chunk entry cut short", raw(func(x uint32) []byte { return hdr(x, Version, procMsg, 1, 8, 1000, 0, 1) }), answered},
		{"chunk list marker 2", raw(func(x uint32) []byte {
			// An entry but for its marker.
			m := hdr(x, Version, procMsg, 2, dataPos, 2000, bogusKey>>32, bogusKey&0xffffffff, 0, 0, 0)
			return append(m, callMsg(x, procEcho, nil, echoCall(2000))[headerSize(0):]...)
		}), answered},
		{"more than maxChunks chunks", withRefs(func(r *rawClient) []chunkRef {
			var refs []chunkRef
			for i := range maxChunks + 1 {
				refs = append(refs, chunkRef{pos: uint32(dataPos + 4*i), len: 2000, key: bogusKey})
			}
			return refs
		}, bytes.Repeat(echoCall(2000), maxChunks+1)), answered},
		{"chunk of 0 bytes", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: 0, key: bogusKey}}
		}, echoCall(0)), answered},
		{"chunk over MaxChunk", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos, len: MaxChunk + 4, key: bogusKey}}
		}, echoCall(MaxChunk+4)), answered},
		{"chunk at an unaligned offset", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos + 1, len: 2000, key: bogusKey}}
		}, words(2000, 0)), answered},
		{"data chunk at offset 0 after a long chunk", func(t *testing.T, r *rawClient, xid uint32) {
			refs := []chunkRef{wholeCall(r, xid, echoCall(3000)), {pos: 0, len: 3000, key: bogusKey}}
			if err := r.send(appendHeader(nil, xid, refs)); err != nil {
				t.Fatal(err)
			}
		}, answered},
		{"long message with inline bytes", func(t *testing.T, r *rawClient, xid uint32) {
			refs := []chunkRef{{len: dataPos, key: bogusKey}}
			if err := r.send(append(appendHeader(nil, xid, refs), words(0)...)); err != nil {
				t.Fatal(err)
			}
		}, answered},
		{"chunk past the message end", withRefs(func(r *rawClient) []chunkRef {
			return []chunkRef{{pos: dataPos + 4, len: 2000, key: bogusKey}}
		}, echoCall(2000)), answered},
		{"chunk past the long message's end", func(t *testing.T, r *rawClient, xid uint32) {
			refs := []chunkRef{wholeCall(r, xid, echoCall(3000)), {pos: dataPos + 4, len: 3000, key: bogusKey}}
			if err := r.send(appendHeader(nil, xid, refs)); err != nil {
				t.Fatal(err)
			}
		}, answered},
		{"long chunk past its region", func(t *testing.T, r *rawClient, xid uint32) {
			ref := wholeCall(r, xid, echoCall(3))
			ref.len += 100
			if err := r.send(appendHeader(nil, xid, []chunkRef{ref})); err != nil {
				t.Fatal(err)
			}
		}, closed},
		{"long message not a call", func(t *testing.T, r *rawClient, xid uint32) {
			ref := chunkRef{len: 12, key: r.ep.Register(words(xid, 1, 0), fabric.RemoteRead).Key()}
			if err := r.send(appendHeader(nil, xid, []chunkRef{ref})); err != nil {
				t.Fatal(err)
			}
		}, dropped},
		{"DONE with bytes after it", raw(func(x uint32) []byte { return append(doneMsg(x), 0, 0, 0, 0) }), answered},
		{"DONE for no reply", raw(func(x uint32) []byte { return doneMsg(x) }), dropped},
		{"RPC reply instead of a call", msg(func(r *rawClient, xid uint32) []byte {
			return append(appendHeader(nil, xid, nil), words(xid, 1, 0, 0, 0, 0)...)
		}), dropped},
		{"RPC message cut short", msg(func(r *rawClient, xid uint32) []byte {
			return append(appendHeader(nil, xid, nil), words(xid)...)
		}), dropped},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := dialRaw(t, addr)
			xid := uint32(0x7000 + i)
			tc.send(t, r, xid)
			switch tc.want {
			case closed:
				if !r.closedWithin(5 * time.Second) {
					t.Fatal("connection not closed")
				}
				return
			}
			// A null call after it shows the connection goes on and
			// bounds the wait for an answer.
			const nullXID = 0x5555
			if err := r.send(callMsg(nullXID, procNull, nil, nil)); err != nil {
				t.Fatalf("connection closed: %v", err)
			}
			var got []reply
			for len(got) < 2 {
				m := r.next(5 * time.Second)
				if m == nil {
					break
				}
				got = append(got, decodeReply(t, m))
				if tc.want == dropped && got[len(got)-1].h.xid == nullXID {
					// Give a wrongly sent answer a moment to show.
					if m := r.next(50 * time.Millisecond); m != nil {
						got = append(got, decodeReply(t, m))
					}
					break
				}
			}
			var sawNull, sawAnswer bool
			for _, rep := range got {
				switch {
				case rep.h.xid == nullXID && rep.err == nil && !sawNull:
					sawNull = true
				case rep.h.xid == xid && tc.want == answered && isGarbage(rep.err) && len(rep.h.refs) == 0 && !sawAnswer:
					sawAnswer = true
				case rep.h.xid == xid && tc.want == succeeds && rep.err == nil && !sawAnswer:
					sawAnswer = true
					// The echoed data, a chunk of the reply.
					if len(rep.h.refs) != 1 {
						t.Fatalf("echo reply: refs %+v", rep.h.refs)
					}
					ref := rep.h.refs[0]
					data := make([]byte, ref.len)
					if err := r.conn.Read(testCtx(t), ref.key, ref.addr, data); err != nil || !bytes.Equal(data, pattern(len(data), len(data))) {
						t.Errorf("echo reply data: %v", err)
					}
					if err := r.send(doneMsg(xid)); err != nil {
						t.Fatal(err)
					}
				case rep.h.xid == xid && tc.want == rejected && errors.As(rep.err, new(*oncrpc.RejectError)) && !sawAnswer:
					sawAnswer = true
				default:
					t.Errorf("unexpected reply: xid %#x, %v, refs %+v", rep.h.xid, rep.err, rep.h.refs)
				}
			}
			if !sawNull {
				t.Error("no answer to the null call after it")
			}
			if tc.want != dropped && !sawAnswer {
				t.Errorf("no %s answer", map[outcome]string{answered: "GARBAGE_ARGS", succeeds: "successful", rejected: "denied"}[tc.want])
			}
			if r.conn.Err() != nil {
				t.Errorf("connection closed: %v", r.conn.Err())
			}
		})
	}
	if st := s.Stats(); st.DoneTimeouts != 0 {
		t.Errorf("%d DONE timeouts", st.DoneTimeouts)
	}
}
