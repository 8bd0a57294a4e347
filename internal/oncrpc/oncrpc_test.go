package oncrpc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicefs/sluice/internal/xdr"
)

// nullCall is a NULL call to NFS version 3 with xid 0x12345678, AUTH_NONE,
// as record-marked bytes on the wire, written out by hand from RFC 5531.
var nullCall = []byte{
	0x80, 0x00, 0x00, 0x28, // last fragment, 40 bytes
	0x12, 0x34, 0x56, 0x78, // xid
	0, 0, 0, 0, // CALL
	0, 0, 0, 2, // rpcvers
	0x00, 0x01, 0x86, 0xa3, // prog 100003
	0, 0, 0, 3, // vers
	0, 0, 0, 0, // proc NULL
	0, 0, 0, 0, 0, 0, 0, 0, // cred AUTH_NONE, empty
	0, 0, 0, 0, 0, 0, 0, 0, // verf AUTH_NONE, empty
}

func TestNullCallBytes(t *testing.T) {
	var w xdr.Writer
	AppendCall(&w, 0x12345678, 100003, 3, 0, nil)
	var wire bytes.Buffer
	if err := WriteRecord(&wire, w.B); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(wire.Bytes(), nullCall) {
		t.Fatalf("NULL call\n% x\nwant\n% x", wire.Bytes(), nullCall)
	}

	rec, err := ReadRecord(bytes.NewReader(nullCall), nil, 100)
	if err != nil {
		t.Fatal(err)
	}
	r := xdr.NewReader(rec)
	var c Call
	if err := ParseCall(r, &c); err != nil {
		t.Fatal(err)
	}
	want := Call{XID: 0x12345678, Prog: 100003, Vers: 3, Proc: 0, CredFlavor: AuthNone}
	if !reflect.DeepEqual(c, want) || r.Len() != 0 {
		t.Fatalf("parsed %+v (%d bytes left), want %+v", c, r.Len(), want)
	}
}

// TestClientWire checks what the Client itself puts on the wire, and that
// it decodes a hand-written reply.
func TestClientWire(t *testing.T) {
	cc, sc := net.Pipe()
	c := NewClient(cc)
	defer c.Close()
	c.mu.Lock()
	c.next = 0x12345678
	c.mu.Unlock()

	type result struct {
		res []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Call(context.Background(), 100003, 3, 0, nil, nil)
		done <- result{res, err}
	}()
	rec, err := ReadRecord(sc, nil, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec, nullCall[4:]) {
		t.Fatalf("client sent\n% x\nwant\n% x", rec, nullCall[4:])
	}
	reply := []byte{
		0x80, 0, 0, 0x1c,
		0x12, 0x34, 0x56, 0x78, // xid
		0, 0, 0, 1, // REPLY
		0, 0, 0, 0, // MSG_ACCEPTED
		0, 0, 0, 0, 0, 0, 0, 0, // verf AUTH_NONE, empty
		0, 0, 0, 0, // SUCCESS
		0xca, 0xfe, 0xba, 0xbe, // results
	}
	if _, err := sc.Write(reply); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !bytes.Equal(r.res, []byte{0xca, 0xfe, 0xba, 0xbe}) {
		t.Fatalf("Call = % x, %v", r.res, r.err)
	}
}

func TestAuthSysRoundTrip(t *testing.T) {
	cred := &AuthSysCred{Stamp: 7, Machine: "host1", UID: 1000, GID: 100, GIDs: []uint32{100, 4, 27}}
	var w xdr.Writer
	AppendAuthSys(&w, cred)
	want := []byte{
		0, 0, 0, 1, // AUTH_SYS
		0, 0, 0, 40, // body length
		0, 0, 0, 7, // stamp
		0, 0, 0, 5, 'h', 'o', 's', 't', '1', 0, 0, 0, // machine name, padded
		0, 0, 0x03, 0xe8, // uid
		0, 0, 0, 100, // gid
		0, 0, 0, 3, 0, 0, 0, 100, 0, 0, 0, 4, 0, 0, 0, 27, // gids
	}
	if !bytes.Equal(w.B, want) {
		t.Fatalf("AUTH_SYS\n% x\nwant\n% x", w.B, want)
	}

	args := []byte{0, 0, 0, 9, 1, 2, 3, 4}
	w.B = nil
	AppendCall(&w, 42, 100005, 3, 1, cred)
	w.B = append(w.B, args...)
	r := xdr.NewReader(w.B)
	c := Call{Remote: "kept"}
	if err := ParseCall(r, &c); err != nil {
		t.Fatal(err)
	}
	wantCall := Call{XID: 42, Prog: 100005, Vers: 3, Proc: 1, CredFlavor: AuthSys, Cred: *cred, Remote: "kept"}
	if !reflect.DeepEqual(c, wantCall) {
		t.Fatalf("parsed %+v\nwant %+v", c, wantCall)
	}
	if rest := r.Rest(); !bytes.Equal(rest, args) {
		t.Fatalf("arguments % x, want % x", rest, args)
	}

	// A credential without gids decodes to nil gids, and a parse over a
	// used Call leaves nothing of the old one.
	w.B = nil
	AppendCall(&w, 43, 1, 1, 1, &AuthSysCred{Machine: "m"})
	if err := ParseCall(xdr.NewReader(w.B), &c); err != nil {
		t.Fatal(err)
	}
	if c.Cred.GIDs != nil || c.Cred.UID != 0 || c.Cred.Machine != "m" || c.XID != 43 {
		t.Fatalf("reparsed %+v", c)
	}
}

// words encodes a message word by word, for malformed ones.
func words(ws ...uint32) []byte {
	var w xdr.Writer
	for _, v := range ws {
		w.Uint32(v)
	}
	return w.B
}

func authSysBody(machine int, gids int, extra int) []byte {
	var w xdr.Writer
	w.Uint32(1)
	w.String(strings.Repeat("m", machine))
	w.Uint32(0)
	w.Uint32(0)
	w.Uint32(uint32(gids))
	for range gids {
		w.Uint32(5)
	}
	w.B = append(w.B, make([]byte, extra)...)
	return w.B
}

func withCred(flavor uint32, body []byte, verf []byte) []byte {
	var w xdr.Writer
	w.B = words(9, 0, 2, 100003, 3, 1)
	w.Uint32(flavor)
	w.Opaque(body)
	w.Uint32(AuthNone)
	w.Opaque(verf)
	return w.B
}

func TestParseCallErrors(t *testing.T) {
	cases := []struct {
		name string
		msg  []byte
		want error // nil: an error that is none of the sentinels
		xid  uint32
	}{
		{"empty", nil, nil, 0},
		{"xid only", words(9), nil, 9},
		{"truncated header", words(9, 0, 2, 100003), nil, 9},
		{"reply", words(9, 1, 0, 0, 0, 0), ErrNotCall, 9},
		{"garbage type", words(9, 7), ErrNotCall, 9},
		{"rpc version 3", words(9, 0, 3, 100003, 3, 0), ErrRPCVersion, 9},
		{"rpc version 3, no more", words(9, 0, 3), ErrRPCVersion, 9},
		{"no credential", words(9, 0, 2, 100003, 3, 0), ErrBadCred, 9},
		{"flavor 6", withCred(6, nil, nil), ErrBadCred, 9},
		{"AUTH_DH", withCred(3, nil, nil), ErrBadCred, 9},
		{"credential over 400", withCred(AuthNone, make([]byte, 404), nil), ErrBadCred, 9},
		{"verifier over 400", withCred(AuthNone, nil, make([]byte, 404)), ErrBadCred, 9},
		{"17 gids", withCred(AuthSys, authSysBody(4, 17, 0), nil), ErrBadCred, 9},
		{"machine 256", withCred(AuthSys, authSysBody(256, 0, 0), nil), ErrBadCred, 9},
		{"AUTH_SYS trailing bytes", withCred(AuthSys, authSysBody(4, 2, 4), nil), ErrBadCred, 9},
		{"AUTH_SYS truncated", withCred(AuthSys, authSysBody(4, 2, 0)[:20], nil), ErrBadCred, 9},
		{"credential past the end", words(9, 0, 2, 100003, 3, 0, 0, 8, 0), ErrBadCred, 9},
	}
	sentinels := []error{ErrNotCall, ErrRPCVersion, ErrBadCred}
	for _, tc := range cases {
		var c Call
		err := ParseCall(xdr.NewReader(tc.msg), &c)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if tc.want == nil {
			for _, s := range sentinels {
				if errors.Is(err, s) {
					t.Errorf("%s: %v, want a short-message error", tc.name, err)
				}
			}
		}
		if c.XID != tc.xid {
			t.Errorf("%s: xid %d, want %d", tc.name, c.XID, tc.xid)
		}
	}

	// The limits themselves are accepted.
	for _, msg := range [][]byte{
		withCred(AuthSys, authSysBody(255, 16, 0), nil),
		withCred(AuthNone, make([]byte, 400), make([]byte, 400)),
	} {
		if err := ParseCall(xdr.NewReader(msg), new(Call)); err != nil {
			t.Errorf("a credential at the limits: %v", err)
		}
	}
}

func TestReplies(t *testing.T) {
	var w xdr.Writer
	AppendAccepted(&w, 5, ProcUnavail)
	want := words(5, 1, 0, 0, 0, 3)
	if !bytes.Equal(w.B, want) {
		t.Fatalf("PROC_UNAVAIL\n% x\nwant\n% x", w.B, want)
	}
	w.B = nil
	AppendRPCMismatch(&w, 5)
	if want := words(5, 1, 1, 0, 2, 2); !bytes.Equal(w.B, want) {
		t.Fatalf("RPC_MISMATCH\n% x\nwant\n% x", w.B, want)
	}

	cases := []struct {
		build func(w *xdr.Writer)
		res   []byte
		err   error
	}{
		{func(w *xdr.Writer) { AppendAccepted(w, 1, Success); w.Uint32(77) }, words(77), nil},
		{func(w *xdr.Writer) { AppendAccepted(w, 1, Success) }, []byte{}, nil},
		{func(w *xdr.Writer) { AppendAccepted(w, 1, GarbageArgs) }, nil, &AcceptError{Stat: GarbageArgs}},
		{func(w *xdr.Writer) { AppendAccepted(w, 1, SystemErr) }, nil, &AcceptError{Stat: SystemErr}},
		{func(w *xdr.Writer) { AppendProgMismatch(w, 1, 2, 3) }, nil, &AcceptError{Stat: ProgMismatch, Low: 2, High: 3}},
		{func(w *xdr.Writer) { AppendRPCMismatch(w, 1) }, nil, &RejectError{RPCMismatch: true, Low: 2, High: 2}},
		{func(w *xdr.Writer) { AppendAuthError(w, 1, 5) }, nil, &RejectError{AuthStat: 5}},
	}
	for i, tc := range cases {
		var w xdr.Writer
		tc.build(&w)
		res, err := parseReply(w.B)
		if !reflect.DeepEqual(err, tc.err) || !bytes.Equal(res, tc.res) || (tc.err == nil) != (res != nil) {
			t.Errorf("case %d: % x, %v; want % x, %v", i, res, err, tc.res, tc.err)
		}
		// Every truncation of a reply header is an error, not a panic.
		for n := range len(w.B) - len(tc.res) {
			if _, err := parseReply(w.B[:n]); err == nil || !errors.Is(err, errBadReply) {
				t.Errorf("case %d cut at %d: %v", i, n, err)
			}
		}
	}
	if _, err := parseReply(words(1, 0, 0)); !errors.Is(err, errBadReply) {
		t.Errorf("a call as a reply: %v", err)
	}
}

func TestErrorStrings(t *testing.T) {
	for _, e := range []error{&AcceptError{Stat: ProgMismatch, Low: 2, High: 3}, &AcceptError{Stat: 9},
		&RejectError{RPCMismatch: true, Low: 2, High: 2}, &RejectError{AuthStat: 1}} {
		if !strings.HasPrefix(e.Error(), "oncrpc: ") {
			t.Errorf("%q", e.Error())
		}
	}
	if ProcUnavail.String() != "procedure unavailable" || AcceptStat(9).String() != "accept_stat(9)" {
		t.Errorf("AcceptStat strings %q %q", ProcUnavail, AcceptStat(9))
	}
}
