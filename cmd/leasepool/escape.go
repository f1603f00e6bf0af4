// Escaping of what leasepool prints but did not write: text handlers,
// devices and stores hold.

package main

import (
	"bytes"
	"fmt"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/leasepool/leasepool/internal/safetext"
)

// printable escapes control and format characters (safetext.Escape), so
// that text a handler wrote or a device announced cannot drive the
// terminal nor reorder the line it is printed on.
func printable(s string) string { return safetext.Escape(s) }

// escapeFormatChars writes the format characters of encoded JSON (the
// bidirectional overrides U+202E and kin, which encoding/json leaves raw)
// as \u escapes: the same JSON, which a terminal shows as it is. They can
// only be inside strings: JSON's own syntax is ASCII.
func escapeFormatChars(b []byte) []byte {
	isFormat := func(r rune) bool { return unicode.Is(unicode.Cf, r) }
	if !bytes.ContainsFunc(b, isFormat) {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if isFormat(r) {
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		} else {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}
