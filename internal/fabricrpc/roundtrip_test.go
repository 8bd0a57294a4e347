package fabricrpc

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicefs/sluice/internal/oncrpc"
	"github.com/sluicefs/sluice/internal/xdr"
)

func zero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// statsAgree waits until every message byte one side counted as sent the
// other counted as received (DONEs arrive after the call returns).
func statsAgree(t *testing.T, s *Server, c *Client) {
	t.Helper()
	if !waitFor(2*time.Second, func() bool { return s.Stats().InlineBytes == c.Stats().InlineBytes }) {
		t.Errorf("inline bytes: server %d, client %d", s.Stats().InlineBytes, c.Stats().InlineBytes)
	}
}

// TestRoundTrip: opaque data of every size class goes both ways intact,
// inline below ChunkMin and pulled from ChunkMin on; reply data lands in
// the caller's dst when it fits there and in a new buffer when not; the
// counters add up.
func TestRoundTrip(t *testing.T) {
	s, _, addr := startServer(t, nil)
	c := dialClient(t, addr, ClientOptions{})
	ctx := testCtx(t)
	for _, n := range []int{0, 1, DefaultChunkMin - 1, DefaultChunkMin, 64 << 10, 1 << 20} {
		for _, dk := range []string{"fits", "short", "nil"} {
			t.Run(fmt.Sprintf("%d/%s", n, dk), func(t *testing.T) {
				data := pattern(n, n)
				var dst []byte
				switch dk {
				case "fits":
					dst = make([]byte, n+100)
				case "short": // room enough, but not within its length
					dst = make([]byte, n/2, n+100)
				}
				s0, c0 := s.Stats(), c.Stats()
				got, err := echo(ctx, c, data, dst)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("echo of %d bytes came back different", n)
				}
				chunked := n >= DefaultChunkMin
				if chunked && dk == "fits" {
					if &got[0] != &dst[0] {
						t.Errorf("reply data not placed in dst")
					}
				} else if !zero(dst[:cap(dst)]) {
					t.Errorf("dst written though the data was %s", map[bool]string{true: "too long for it", false: "inline"}[chunked])
				}
				s1, c1 := s.Stats(), c.Stats()
				want := int64(0)
				if chunked {
					want = int64(n)
				}
				if d := s1.PulledBytes - s0.PulledBytes; d != want {
					t.Errorf("server pulled %d bytes, want %d", d, want)
				}
				if d := c1.PulledBytes - c0.PulledBytes; d != want {
					t.Errorf("client pulled %d bytes, want %d", d, want)
				}
				if s1.LongMessages != s0.LongMessages || c1.LongMessages != c0.LongMessages {
					t.Errorf("long messages counted: server %+v client %+v", s1, c1)
				}
				if s1.Calls-s0.Calls != 1 || c1.Calls-c0.Calls != 1 {
					t.Errorf("calls counted: server %d, client %d", s1.Calls-s0.Calls, c1.Calls-c0.Calls)
				}
				statsAgree(t, s, c)
			})
		}
	}
	if st := s.Stats(); st.DoneTimeouts != 0 {
		t.Errorf("%d DONE timeouts", st.DoneTimeouts)
	}
}

// TestChunkMinPerSide: each side chunks by its own ChunkMin: a call datum
// below the client's goes inline while the reply's is a chunk, and a
// reply too big for the client's buffer whose data the server does not
// chunk goes as a long message.
func TestChunkMinPerSide(t *testing.T) {
	t.Run("client inline, server chunks", func(t *testing.T) {
		s, _, addr := startServer(t, nil)
		c := dialClient(t, addr, ClientOptions{ChunkMin: 8 << 10})
		data := pattern(1, 3000)
		dst := make([]byte, 4000)
		got, err := echo(testCtx(t), c, data, dst)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("echo: %v", err)
		}
		if &got[0] != &dst[0] {
			t.Error("reply chunk not placed in dst")
		}
		if st := s.Stats(); st.PulledBytes != 0 {
			t.Errorf("server pulled %d bytes of an inline call", st.PulledBytes)
		}
		if st := c.Stats(); st.PulledBytes != 3000 {
			t.Errorf("client pulled %d bytes, want 3000", st.PulledBytes)
		}
	})
	t.Run("server inline, long reply", func(t *testing.T) {
		s, _, addr := startServer(t, func(s *Server) { s.ChunkMin = 4 << 20 })
		c := dialClient(t, addr, ClientOptions{})
		data := pattern(2, 64<<10)
		got, err := echo(testCtx(t), c, data, nil)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("echo: %v", err)
		}
		cs, ss := c.Stats(), s.Stats()
		if cs.LongMessages != 1 || ss.LongMessages != 1 {
			t.Errorf("long messages: client %d, server %d; want 1, 1", cs.LongMessages, ss.LongMessages)
		}
		if want := int64(replyHeaderLen + 4 + len(data)); cs.PulledBytes != want {
			t.Errorf("client pulled %d, want %d", cs.PulledBytes, want)
		}
		if ss.PulledBytes != int64(len(data)) {
			t.Errorf("server pulled %d, want %d", ss.PulledBytes, len(data))
		}
		statsAgree(t, s, c)
	})
}

// mixArgs builds procMix's arguments.
func mixArgs(chunkMin, items, m int, data []byte) (*xdr.Writer, uint32) {
	w := &xdr.Writer{ChunkMin: chunkMin}
	w.Uint32(uint32(items))
	var sum uint32
	for i := range items {
		w.Uint32(uint32(i))
		sum += uint32(i)
	}
	w.Uint32(uint32(m))
	w.Opaque(data)
	return w, sum
}

// TestLongMessages: calls and replies too big for the peer's receive
// buffer go as long messages, with data chunks after the long chunk,
// and the data still lands in dst.
func TestLongMessages(t *testing.T) {
	for _, bufSize := range []int{DefaultBufSize, 1024} {
		s, _, addr := startServer(t, func(s *Server) { s.BufSize = bufSize })
		c := dialClient(t, addr, ClientOptions{})
		ctx := testCtx(t)
		for _, tc := range []struct{ items, m, data int }{
			{2000, 2000, 64 << 10}, // both long, each with a data chunk
			{2000, 0, 100},         // long call, inline data
			{0, 2000, 1 << 20},     // long reply with a data chunk
			{3000, 3000, 0},
			{bufSize / 4, 10, 5000}, // just over the server's buffer
		} {
			t.Run(fmt.Sprintf("buf%d/%d-%d-%d", bufSize, tc.items, tc.m, tc.data), func(t *testing.T) {
				data := pattern(tc.items+tc.data, tc.data)
				w, sum := mixArgs(c.ChunkMin(), tc.items, tc.m, data)
				dst := make([]byte, tc.data)
				s0, c0 := s.Stats(), c.Stats()
				r, err := c.Call(ctx, testProg, testVers, procMix, nil, w, dst)
				if err != nil {
					t.Fatal(err)
				}
				if n, sm, m := r.Uint32(), r.Uint32(), r.Uint32(); n != uint32(tc.items) || sm != sum || m != uint32(tc.m) {
					t.Fatalf("reply says %d items summing %d, %d back; want %d, %d, %d", n, sm, m, tc.items, sum, tc.m)
				}
				for i := range uint32(tc.m) {
					if v := r.Uint32(); v != i*3+1 {
						t.Fatalf("item %d: %d", i, v)
					}
				}
				got := r.Opaque(maxEcho)
				if r.Err() != nil || r.Len() != 0 || !bytes.Equal(got, data) {
					t.Fatalf("reply data: %v, %d bytes left, equal %v", r.Err(), r.Len(), bytes.Equal(got, data))
				}
				dataChunk := tc.data >= DefaultChunkMin
				if dataChunk && &got[0] != &dst[0] {
					t.Error("reply data not placed in dst")
				}
				// What went long and what was pulled.
				callLen := callHeaderLen + len(w.B)
				replyLen := replyHeaderLen + 4*(3+tc.m+1)
				if !dataChunk {
					replyLen += len(data) + xdr.Pad(len(data))
				}
				callLong := headerSize(len(w.Chunks))+callLen > min(bufSize, DefaultBufSize)
				replyLong := headerSize(len(w.Chunks))+replyLen > min(bufSize, DefaultBufSize)
				var wantLong, wantSrv, wantCli int64
				if callLong {
					wantLong++
					wantSrv += int64(callLen)
				}
				if replyLong {
					wantLong++
					wantCli += int64(replyLen)
				}
				if dataChunk {
					wantSrv += int64(len(data))
					wantCli += int64(len(data))
				}
				s1, c1 := s.Stats(), c.Stats()
				if d := s1.LongMessages - s0.LongMessages; d != wantLong {
					t.Errorf("server counted %d long messages, want %d", d, wantLong)
				}
				if d := c1.LongMessages - c0.LongMessages; d != wantLong {
					t.Errorf("client counted %d long messages, want %d", d, wantLong)
				}
				if d := s1.PulledBytes - s0.PulledBytes; d != wantSrv {
					t.Errorf("server pulled %d, want %d", d, wantSrv)
				}
				if d := c1.PulledBytes - c0.PulledBytes; d != wantCli {
					t.Errorf("client pulled %d, want %d", d, wantCli)
				}
				statsAgree(t, s, c)
			})
		}
	}
}

// TestConcurrentEchoIntegrity: many calls at once whose replies send back
// the calls' own data (pulled into server buffers, or inline in the
// receive buffer) each get their own data back, even though the server
// reuses those buffers for later calls while the client still pulls; and
// no reply is released before its DONE.
func TestConcurrentEchoIntegrity(t *testing.T) {
	for _, tc := range []struct {
		name     string
		chunkMin int // the client's
		size     int
	}{
		{"pulled", 0, 64 << 10},
		{"inline", 1 << 20, 3000}, // inline in the call, a chunk in the reply
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, _, addr := startServer(t, func(s *Server) { s.BufCount = 4 })
			ctx := testCtx(t)
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for ci := range 2 {
				c := dialClient(t, addr, ClientOptions{ChunkMin: tc.chunkMin})
				for g := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						dst := make([]byte, tc.size)
						for i := range 50 {
							data := pattern(ci*10000+g*100+i, tc.size)
							got, err := echo(ctx, c, data, dst)
							if err == nil && !bytes.Equal(got, data) {
								err = errors.New("reply carries another call's data")
							}
							if err != nil {
								errs <- err
								return
							}
						}
					}()
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// A well-behaved client's DONEs reach the server before the
			// calls its credits let through: no reply is evicted early.
			if st := srv.Stats(); st.DoneTimeouts != 0 {
				t.Errorf("%d replies released without DONE", st.DoneTimeouts)
			}
		})
	}
}

// TestChunkLimits: a reply or call with more chunks than a message may
// list, and a call chunk over MaxChunk, fail that call only.
func TestChunkLimits(t *testing.T) {
	_, _, addr := startServer(t, nil)
	c := dialClient(t, addr, ClientOptions{})
	ctx := testCtx(t)

	get := func(k int) error {
		w := &xdr.Writer{}
		w.Uint32(uint32(k))
		r, err := c.Call(ctx, testProg, testVers, procChunks, nil, w, nil)
		if err != nil {
			return err
		}
		svc := newService()
		for i := range k {
			if p := r.Opaque(2048); !bytes.Equal(p, svc.static[i:i+1024]) {
				return fmt.Errorf("opaque %d differs (%v)", i, r.Err())
			}
		}
		return r.Err()
	}
	if err := get(maxChunks); err != nil {
		t.Fatalf("reply of %d chunks: %v", maxChunks, err)
	}
	var ae *oncrpc.AcceptError
	if err := get(maxChunks + 1); !errors.As(err, &ae) || ae.Stat != oncrpc.SystemErr {
		t.Fatalf("reply of %d chunks: %v, want SYSTEM_ERR", maxChunks+1, err)
	}

	w := &xdr.Writer{ChunkMin: c.ChunkMin()}
	for range maxChunks + 1 {
		w.Opaque(make([]byte, 1024))
	}
	if _, err := c.Call(ctx, testProg, testVers, procEcho, nil, w, nil); err == nil {
		t.Fatalf("call of %d chunks sent", maxChunks+1)
	}
	if _, err := echo(ctx, c, make([]byte, MaxChunk+4), nil); !isGarbage(err) {
		t.Fatalf("call chunk over MaxChunk: %v, want GARBAGE_ARGS", err)
	}
	data := pattern(9, 5000)
	if got, err := echo(ctx, c, data, nil); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("connection unusable after the refused calls: %v", err)
	}
	if n := c.Credits(); len(c.cur.credits) != 0 {
		t.Errorf("%d of %d credits still taken", len(c.cur.credits), n)
	}
}
