package metaapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// ByteString is a string of arbitrary bytes that crosses JSON intact: a
// file name, a path, a symbolic link's target, an attribute name. Linux
// names are bytes, not text, but encoding/json writes each byte that is
// not valid UTF-8 as U+FFFD, so "caf\xe9" and "caf\xe8" would reach meta
// as one name. Every field holding such bytes, on the wire and in meta's
// records, has this type.
//
// Valid UTF-8 encodes as a plain JSON string (readable with curl, and what
// earlier versions wrote, so their records still load); anything else as
// {"base64": "<standard base64>"}. Decoding accepts both forms, and
// refuses a JSON string that cannot stand for its bytes exactly — raw
// invalid UTF-8 or an unpaired surrogate escape ("\udce9", which a
// Python client's surrogateescape produces), both of which encoding/json
// would quietly turn into U+FFFD.
type ByteString string

// byteStringObject is the JSON form of a ByteString that is not UTF-8.
type byteStringObject struct {
	Base64 *string `json:"base64"`
}

// MarshalJSON implements json.Marshaler.
func (s ByteString) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(s)) {
		return json.Marshal(string(s))
	}
	return json.Marshal(byteStringObject{Base64: ptr(base64.StdEncoding.EncodeToString([]byte(s)))})
}

func ptr[T any](v T) *T { return &v }

// UnmarshalJSON implements json.Unmarshaler.
func (s *ByteString) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	switch {
	case string(data) == "null":
		return nil // as for a plain string: left alone
	case len(data) > 0 && data[0] == '"':
		if err := exactJSONString(data); err != nil {
			return fmt.Errorf("decoding a name: %w", err)
		}
		return json.Unmarshal(data, (*string)(s))
	case len(data) > 0 && data[0] == '{':
		var o byteStringObject
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&o); err != nil {
			return fmt.Errorf("decoding a name: %w", err)
		}
		if o.Base64 == nil {
			return errors.New(`decoding a name: an object without "base64"`)
		}
		b, err := base64.StdEncoding.Strict().DecodeString(*o.Base64)
		if err != nil {
			return fmt.Errorf("decoding a name: base64: %w", err)
		}
		*s = ByteString(b)
		return nil
	}
	return fmt.Errorf(`decoding a name: want a JSON string or {"base64": ...}, got %.20q`, data)
}

// exactJSONString checks that the JSON string literal q decodes to
// exactly the bytes it appears to hold: it is valid UTF-8 and every
// \u escape of a surrogate is one half of a pair. (The literal's syntax
// is left to encoding/json.)
func exactJSONString(q []byte) error {
	if !utf8.Valid(q) {
		return errors.New(`a JSON string holding bytes that are not UTF-8 (send {"base64": ...})`)
	}
	for i := 0; i < len(q); i++ {
		if q[i] != '\\' || i+1 >= len(q) {
			continue
		}
		i++ // the escaped character
		if q[i] != 'u' {
			continue
		}
		u, ok := hex4(q[i+1:])
		if !ok {
			continue // bad syntax: encoding/json reports it
		}
		i += 4
		switch {
		case u >= 0xdc00 && u <= 0xdfff:
			return fmt.Errorf(`a JSON string holding an unpaired surrogate \u%04x (send {"base64": ...})`, u)
		case u >= 0xd800 && u <= 0xdbff:
			rest := q[i+1:]
			lo, ok := hex4(rest[min(2, len(rest)):])
			if len(rest) < 6 || rest[0] != '\\' || rest[1] != 'u' || !ok || lo < 0xdc00 || lo > 0xdfff {
				return fmt.Errorf(`a JSON string holding an unpaired surrogate \u%04x (send {"base64": ...})`, u)
			}
			i += 6
		}
	}
	return nil
}

// hex4 parses the four hex digits at the start of b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
