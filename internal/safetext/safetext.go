// Package safetext escapes, in text leasepool shows but did not write (a
// handler's error, a device id or attribute read back from the store), the
// characters that would drive a terminal or reorder what is displayed
// around them: control characters (ESC, CR, newline...), format
// characters (Unicode category Cf: the bidirectional overrides and
// isolates U+202A to U+202E and U+2066 to U+2069, U+200E and U+200F,
// zero-width characters) and the line and paragraph separators.
package safetext

import (
	"strconv"
	"strings"
	"unicode"
)

// Escape returns s with each such character written as Go writes it in a
// quoted string ("\x1b", "\n", "\u202e"); other text, right-to-left
// letters included, is left as it is.
func Escape(s string) string {
	if !strings.ContainsFunc(s, Unsafe) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !Unsafe(r) {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRune(r)
		b.WriteString(q[1 : len(q)-1]) // without the quotes
	}
	return b.String()
}

// Unsafe reports whether Escape escapes r.
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}
