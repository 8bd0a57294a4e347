package jointoken

import (
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	pin := "sha256:" + strings.Repeat("ab", 32)
	tok, err := New(pin)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(" " + tok.String() + "\n")
	if err != nil || got != tok {
		t.Fatalf("parse %q: %+v %v", tok.String(), got, err)
	}
	other, _ := New(pin)
	if other.ID == tok.ID || other.Secret == tok.Secret || other.Hash() == tok.Hash() {
		t.Fatal("two tokens alike")
	}
	if _, err := New("md5:00"); err == nil {
		t.Fatal("a bad pin was accepted")
	}
}

func TestParseRefuses(t *testing.T) {
	good, _ := New("sha256:" + strings.Repeat("0", 64))
	s := good.String()
	for _, bad := range []string{
		"", "SJ1-", s[:len(s)-1], s + "0", "SJ2" + s[3:], strings.Replace(s, "-", ".", 1),
		"SJ1-" + strings.Repeat("g", 16) + s[20:], s[:25] + "zz" + s[27:], s[:len(s)-2] + "zz",
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
