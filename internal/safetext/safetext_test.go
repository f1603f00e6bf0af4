package safetext

import "testing"

func TestEscape(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"dev-1":          "dev-1",
		"שלום":           "שלום",
		"a b\u00e9":      "a b\u00e9",
		"dev\u202e1":     `dev\u202e1`,
		"\x1b[2Jx":       `\x1b[2Jx`,
		"a\nb\tc\r":      `a\nb\tc\r`,
		"\u2066x\u2069":  `\u2066x\u2069`,
		"z\u200bw\u200f": `z\u200bw\u200f`,
		"l\u2028p\u2029": `l\u2028p\u2029`,
		"nul\x00del\x7f": `nul\x00del\x7f`,
		"tag\U000E0041":  `tag\U000e0041`,
		"c1\u0085":       `c1\u0085`,
	} {
		if got := Escape(in); got != want {
			t.Errorf("Escape(%q) = %q, want %q", in, got, want)
		}
	}
}
