package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestDisplayName: a name that is not printable UTF-8 is printed so that
// bash reads it back as exactly its bytes, with nothing that is not
// printable reaching the terminal; others print as they are.
func TestDisplayName(t *testing.T) {
	plain := []string{"a", "café.txt", "日本語", "a b", "x'y", `back\slash`, "\ufffd", "-", "$x", "'$'", `\xe9`}
	quoted := []string{
		"caf\xe9.txt", "\xff", "\x80", "\xc0\xaf", "\xed\xa0\x80", "a\nb", "\t", "\x1b[31mred", "\x7f",
		"it's\xe9", "\\\xe9", "$'x'", "$'", "\u202egnp.exe", "\xe9a", "\xe9" + "ab", "\u00e9\xe9", "\r",
		strings.Repeat("\xff", 255),
	}
	for b := 1; b < 256; b++ {
		if b != '/' {
			quoted = append(quoted, string([]byte{byte(b)})+"\xff")
		}
	}
	for _, n := range plain {
		if got := displayName(n); got != n {
			t.Errorf("displayName(%q) = %q, want it as it is", n, got)
		}
	}
	var shown []string
	for _, n := range quoted {
		d := displayName(n)
		if !strings.HasPrefix(d, "$'") || !strings.HasSuffix(d, "'") || !utf8.ValidString(d) {
			t.Fatalf("displayName(%q) = %q: not $'...' quoting", n, d)
		}
		for _, c := range []byte(d) {
			if c < 0x20 || c == 0x7f {
				t.Fatalf("displayName(%q) = %q holds control byte %#x", n, d, c)
			}
		}
		shown = append(shown, d)
	}
	// bash reads each back as the name.
	out, err := exec.Command("bash", "-c", "printf '%s\\0' "+strings.Join(shown, " ")).Output()
	if err != nil {
		t.Fatalf("bash: %v", err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(got) != len(quoted) {
		t.Fatalf("bash read %d names, want %d", len(got), len(quoted))
	}
	for i := range got {
		if got[i] != quoted[i] {
			t.Errorf("bash reads %s as %q, want %q", shown[i], got[i], quoted[i])
		}
	}
}

// TestPrintEntriesRaw: ls -0 prints names as they are, each line ending
// in NUL, also in the long form (whose columns a name's tabs and
// newlines do not disturb).
func TestPrintEntriesRaw(t *testing.T) {
	ents := []entry{{name: "a\tb\nc\xe9"}, {name: "d"}}
	var short, long bytes.Buffer
	printEntries(&short, false, true, ents)
	if got := short.String(); got != "a\tb\nc\xe9\x00d\x00" {
		t.Fatalf("ls -0: %q", got)
	}
	printEntries(&long, true, true, ents)
	lines := strings.Split(strings.TrimSuffix(long.String(), "\x00"), "\x00")
	if len(lines) != 2 || !strings.HasSuffix(lines[0], " a\tb\nc\xe9") || !strings.HasSuffix(lines[1], " d") ||
		len(lines[0])-len(ents[0].name) != len(lines[1])-len(ents[1].name) {
		t.Fatalf("ls -l -0: %q", lines)
	}
}
