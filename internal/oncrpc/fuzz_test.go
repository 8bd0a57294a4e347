package oncrpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/sluicefs/sluice/internal/xdr"
)

// FuzzParseCall: arbitrary bytes never panic; what parses is within the
// protocol's limits and re-encodes to the same call.
func FuzzParseCall(f *testing.F) {
	f.Add(nullCall[4:])
	var w xdr.Writer
	AppendCall(&w, 7, 100003, 3, 4, &AuthSysCred{Stamp: 1, Machine: "m", UID: 2, GID: 3, GIDs: []uint32{4, 5}})
	f.Add(append(w.B, 0, 0, 0, 1, 9, 0, 0, 0))
	f.Add(withCred(AuthSys, authSysBody(3, 17, 0), nil))
	f.Add(words(1, 0, 3))
	f.Add(words(1, 1, 0, 0, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := xdr.NewReader(data)
		var c Call
		if err := ParseCall(r, &c); err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if r.Err() != nil {
			t.Fatalf("parsed with the reader failed: %v", r.Err())
		}
		if c.CredFlavor != AuthNone && c.CredFlavor != AuthSys {
			t.Fatalf("flavor %d accepted", c.CredFlavor)
		}
		if len(c.Cred.Machine) > maxMachineName || len(c.Cred.GIDs) > maxGIDs {
			t.Fatalf("credential over the limits: %d-byte name, %d gids", len(c.Cred.Machine), len(c.Cred.GIDs))
		}
		args := r.Rest()
		var cred *AuthSysCred
		if c.CredFlavor == AuthSys {
			cred = &c.Cred
		}
		var w xdr.Writer
		AppendCall(&w, c.XID, c.Prog, c.Vers, c.Proc, cred)
		w.B = append(w.B, args...)
		r2 := xdr.NewReader(w.B)
		var c2 Call
		if err := ParseCall(r2, &c2); err != nil || !reflect.DeepEqual(c, c2) || !bytes.Equal(r2.Rest(), args) {
			t.Fatalf("re-encoded call parses as %+v, %v; want %+v", c2, err, c)
		}
	})
}

// refRecords splits a stream into records the simple way, for
// FuzzReadRecord to compare with; end is how the stream ends.
func refRecords(data []byte, max int) (recs [][]byte, end error) {
	for len(data) > 0 {
		rec := []byte{}
		for frags := 0; ; frags++ {
			if frags == maxFragments {
				return recs, ErrRecordTooLarge
			}
			if len(data) < 4 {
				return recs, io.ErrUnexpectedEOF
			}
			h := binary.BigEndian.Uint32(data)
			n := int(h &^ lastFragment)
			data = data[4:]
			if len(rec)+n > max {
				return recs, ErrRecordTooLarge
			}
			if len(data) < n {
				return recs, io.ErrUnexpectedEOF
			}
			rec, data = append(rec, data[:n]...), data[n:]
			if h&lastFragment != 0 {
				break
			}
		}
		recs = append(recs, rec)
	}
	return recs, io.EOF
}

// FuzzReadRecord: any stream splits into the records it holds, none over
// the limit, in memory never over the limit, with the right end.
func FuzzReadRecord(f *testing.F) {
	f.Add(nullCall, uint8(64))
	f.Add(fragment(fragment(fragment(nil, []byte("ab"), false), nil, false), []byte("cd"), true), uint8(4))
	f.Add(fragment(nil, make([]byte, 100), true), uint8(99))
	f.Add(binary.BigEndian.AppendUint32(nil, lastFragment|1<<30), uint8(255))
	f.Add([]byte{0, 0, 0}, uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, m uint8) {
		max := int(m)
		want, end := refRecords(data, max)
		r := bytes.NewReader(data)
		var buf []byte
		for i := 0; ; i++ {
			rec, err := ReadRecord(r, buf, max)
			if len(rec) > max || cap(rec) > max {
				t.Fatalf("record %d: %d bytes, capacity %d, over the limit of %d", i, len(rec), cap(rec), max)
			}
			if err != nil {
				if i != len(want) || !errors.Is(err, end) {
					t.Fatalf("after %d records: %v; want %v after %d", i, err, end, len(want))
				}
				return
			}
			if i >= len(want) || !bytes.Equal(rec, want[i]) {
				t.Fatalf("record %d: % x, unexpected", i, rec)
			}
			buf = rec
		}
	})
}
