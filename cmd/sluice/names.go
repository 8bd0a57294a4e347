package main

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// displayName is how the CLI prints a file name or symlink target. Names
// are bytes, not text: one that is not printable UTF-8 (or that starts
// with "$'", and so would look quoted) is printed in bash's $'...'
// quoting, each byte that is not part of a printable character as \xHH,
// so that pasting it into bash gives back exactly those bytes and no
// control character reaches the terminal. Every other name prints as is.
// (ls -0 prints names raw, for scripts.)
func displayName(s string) string {
	if !needsQuoting(s) {
		return s
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.WriteString("$'")
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteByte(byte(r))
		case (r == utf8.RuneError && n <= 1) || !unicode.IsPrint(r):
			for _, c := range []byte(s[i : i+n]) {
				b.WriteString(`\x`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&15])
			}
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	b.WriteByte('\'')
	return b.String()
}

func needsQuoting(s string) bool {
	if strings.HasPrefix(s, "$'") || !utf8.ValidString(s) {
		return true
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return true
		}
	}
	return false
}
