package metaapi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// hostileNames are byte strings encoding/json would not carry intact:
// lone bytes that are not UTF-8, truncated and overlong sequences,
// surrogates and code points past U+10FFFF encoded as bytes — and, for
// contrast, valid names holding U+FFFD, which must stay distinct from
// them.
func hostileNames() []string {
	var names []string
	for b := 0; b < 256; b++ {
		names = append(names, string([]byte{byte(b)}), "caf"+string([]byte{byte(b)})+".txt")
	}
	return append(names,
		"caf\xe9.txt", "caf\xe8.txt", "caf\xc3\xa9.txt", "caf\ufffd.txt", "\xef\xbf\xbd",
		"\xc0\xaf", "\xe0\x80\xaf", "\xf0\x80\x80\xaf", "\xc1\xbf", // overlong
		"\xed\xa0\x80", "\xed\xbf\xbf", "\xed\xa0\xbd\xed\xb8\x80", // surrogates as bytes
		"\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "\xfe\xff", // beyond U+10FFFF, old 5-byte form, BOM bytes
		"\xe2\x82", "\xf0\x9f\x98", "a\x80b", "\x80\x80\x80", // truncated, stray continuations
		`\udce9`, `"quoted"`, "{\"base64\":\"YQ==\"}", "\u2028\u2029", "<&>", "", // JSON's own specials
		strings.Repeat("\xff", 255), strings.Repeat("é\xe9", 100),
	)
}

func TestByteStringRoundTrip(t *testing.T) {
	seen := map[string]string{}
	for _, name := range hostileNames() {
		js, err := json.Marshal(ByteString(name))
		if err != nil {
			t.Fatalf("marshal %q: %v", name, err)
		}
		if !utf8.Valid(js) || !json.Valid(js) {
			t.Fatalf("marshal %q: %s is not valid UTF-8 JSON", name, js)
		}
		var back ByteString
		if err := json.Unmarshal(js, &back); err != nil {
			t.Fatalf("unmarshal %s (from %q): %v", js, name, err)
		}
		if string(back) != name {
			t.Fatalf("%q became %s and came back as %q", name, js, back)
		}
		if other, dup := seen[string(js)]; dup && other != name {
			t.Fatalf("%q and %q both encode as %s", other, name, js)
		}
		seen[string(js)] = name
	}
}

// TestByteStringInStructs checks the fields that carry names: a request
// and a reply survive the wire with every byte, as the front ends send
// them.
func TestByteStringInStructs(t *testing.T) {
	for _, name := range hostileNames() {
		req := RenameReq{OldName: ByteString(name), NewName: ByteString(name + "\xe8")}
		var gotReq RenameReq
		roundTrip(t, req, &gotReq)
		if gotReq.OldName != req.OldName || gotReq.NewName != req.NewName {
			t.Fatalf("rename request %+v came back as %+v", req, gotReq)
		}
		resp := ReaddirResp{Entries: []Dirent{{Name: ByteString(name), Ino: 7, Type: TypeFile}}}
		var gotResp ReaddirResp
		roundTrip(t, resp, &gotResp)
		if len(gotResp.Entries) != 1 || gotResp.Entries[0] != resp.Entries[0] {
			t.Fatalf("readdir reply %+v came back as %+v", resp, gotResp)
		}
		attr := Attr{Type: TypeSymlink, Target: ByteString("/x/" + name)}
		var gotAttr Attr
		roundTrip(t, attr, &gotAttr)
		if gotAttr.Target != attr.Target {
			t.Fatalf("target %q came back as %q", attr.Target, gotAttr.Target)
		}
	}
}

func roundTrip(t *testing.T, in, out any) {
	t.Helper()
	js, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, out); err != nil {
		t.Fatalf("unmarshal %s: %v", js, err)
	}
}

// TestByteStringCompatible: valid UTF-8 is written as the plain string
// earlier versions wrote, and what they wrote reads back unchanged.
func TestByteStringCompatible(t *testing.T) {
	for _, name := range []string{"café.txt", "a b", "\ufffd", "日本語", "x\ty\n", `back\slash "q"`} {
		old, _ := json.Marshal(name)
		now, _ := json.Marshal(ByteString(name))
		if !bytes.Equal(old, now) {
			t.Errorf("%q encodes as %s, a plain string encodes as %s", name, now, old)
		}
	}
	type oldAttr struct {
		Type   FileType `json:"type"`
		Target string   `json:"target,omitempty"`
	}
	old, _ := json.Marshal(oldAttr{Type: TypeSymlink, Target: "../café"})
	var a Attr
	if err := json.Unmarshal(old, &a); err != nil || a.Target != "../café" {
		t.Fatalf("old record %s read as %+v, %v", old, a, err)
	}
	if js, _ := json.Marshal(Attr{Type: TypeFile}); bytes.Contains(js, []byte("target")) {
		t.Errorf("an empty target is written: %s", js)
	}
}

// TestByteStringHostileJSON: what cannot stand for exact bytes is
// refused, not turned into U+FFFD.
func TestByteStringHostileJSON(t *testing.T) {
	for _, js := range []string{
		"\"caf\xe9\"",          // raw bytes that are not UTF-8
		`"caf\udce9"`,          // Python's surrogateescape
		`"\ud800"`, `"\udfff"`, // lone surrogates
		`"\ud800x"`, `"\ud800\u0041"`, `"\ud800\\u0041"`, `"\ud800\ud800"`, `"a\ud83d"`,
		`{}`, `{"b64":"YQ=="}`, `{"base64":"YQ==","x":1}`, `{"base64":1}`, `{"base64":null}`,
		`{"base64":"!!!!"}`, `{"base64":"YR=="}`, `{"base64":"YQ"}`, `{"base64":"Y Q=="}`,
		`1`, `true`, `[]`, `["a"]`, `"unterminated`, `{"base64":`,
	} {
		var s ByteString
		if err := json.Unmarshal([]byte(js), &s); err == nil {
			t.Errorf("%s decoded as %q, want an error", js, s)
		}
	}
	for js, want := range map[string]string{
		`"\ud83d\ude00"`:        "\U0001F600",
		`"\\udce9"`:             `\udce9`,
		`"\\\ud83d\ude00"`:      "\\\U0001F600",
		`"\u00e9"`:              "é",
		`"\ufffd"`:              "\ufffd",
		`{"base64":"6Q=="}`:     "\xe9",
		`{"base64":"YQ=="}`:     "a", // not canonical, but exact
		` {"base64" : ""} `:     "",
		`"caf\u00E9\u002f"`:     "café/",
		"\"\xef\xbf\xbd\"":      "\ufffd",
		`{"base64":"/w=="}`:     "\xff",
		`{"base64":"AA=="}`:     "\x00",
		`"\\"`:                  `\`,
		`"\\\\ud800"`:           `\\ud800`,
		`"\"\\u\""`:             `"\u"`,
		`{"base64":"AP8A"}`:     "\x00\xff\x00",
		`{"base64":"Y2Fm"}`:     "caf",
		`{"base64":"w6k="}`:     "é",
		`{"base64":"7aCA"}`:     "\xed\xa0\x80",
		`{"base64":"wK8="}`:     "\xc0\xaf",
		`{"base64":"LwA="}`:     "/\x00",
		`{"base64":"4oKs"}`:     "€",
		`{"base64":"8J+YgA=="}`: "\U0001F600",
	} {
		var s ByteString
		if err := json.Unmarshal([]byte(js), &s); err != nil || string(s) != want {
			t.Errorf("%s decoded as %q, %v; want %q", js, s, err, want)
		}
	}
	s := ByteString("kept")
	if err := json.Unmarshal([]byte("null"), &s); err != nil || s != "kept" {
		t.Errorf("null decoded as %q, %v; want it left alone", s, err)
	}
}

func FuzzByteStringRoundTrip(f *testing.F) {
	for _, name := range hostileNames() {
		f.Add([]byte(name))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		js, err := json.Marshal(ByteString(b))
		if err != nil {
			t.Fatalf("marshal %q: %v", b, err)
		}
		var back ByteString
		if err := json.Unmarshal(js, &back); err != nil {
			t.Fatalf("unmarshal %s (from %q): %v", js, b, err)
		}
		if string(back) != string(b) {
			t.Fatalf("%q came back as %q (via %s)", b, back, js)
		}
	})
}

// FuzzByteStringDecode feeds hostile JSON: an error or a value that
// encodes and decodes to itself, never a panic.
func FuzzByteStringDecode(f *testing.F) {
	for _, s := range []string{`"a"`, `"\ud83d\ude00"`, `"\udce9"`, `{"base64":"6Q=="}`, `{"base64":"YQ"}`, `null`, "\"\xe9\"", `"\\u"`, `"\u12"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var s ByteString
		if err := s.UnmarshalJSON(data); err != nil {
			return
		}
		if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '"' {
			// No U+FFFD the input did not spell out.
			spelt := bytes.Count(trimmed, []byte("\ufffd")) + bytes.Count(bytes.ToLower(trimmed), []byte(`\ufffd`))
			if n := strings.Count(string(s), "\ufffd"); n > spelt {
				t.Fatalf("%q decoded as %q: %d U+FFFD from %d in the input", data, s, n, spelt)
			}
		}
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("%q decoded as %q, which does not encode: %v", data, s, err)
		}
		var back ByteString
		if err := json.Unmarshal(js, &back); err != nil || back != s {
			t.Fatalf("%q decoded as %q, re-encoded as %s, which decodes as %q, %v", data, s, js, back, err)
		}
	})
}
