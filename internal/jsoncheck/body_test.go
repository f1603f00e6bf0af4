package jsoncheck_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/jsoncheck"
	"github.com/leasepool/leasepool/task"
)

func deep(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// TestBody: a request body's invalid UTF-8 and deep nesting are
// refused before encoding/json reads it, naming the top-level field.
func TestBody(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ body, want string }{
		{"{\"key\":\"a\xffb\",\"kind\":\"k\"}", "invalid: key: is not valid UTF-8"},
		{"{\"key\":\"a\",\"kind\":\"\xc3\"}", "invalid: kind: is not valid UTF-8"},
		{"{\"key\":\"a\",\"payload\":{\"x\":[\"\xed\xa0\x80\"]}}", "invalid: payload: is not valid UTF-8"},
		{"{\"k\xff\":1}", "invalid: body: a field name is not valid UTF-8"},
		{"[\"\xff\"]", "invalid: body: is not valid UTF-8"},
		{"\"\xff", "invalid: body: is not valid UTF-8"},
		{`{"key":"a","payload":` + deep(1001) + `}`, "invalid: payload: nested deeper than 64 levels"},
		{deep(1001), "invalid: body: nested deeper than 64 levels"},
		// A string's brackets and escaped quotes are not nesting.
		{`{"key":"\"[[[","payload":` + deep(69) + `}`, "invalid: payload: nested deeper than 64 levels"},
		// Escaped surrogates without their pair decode to U+FFFD: "a\ud800"
		// and "a\udfff" would be one key.
		{`{"key":"a\ud800","kind":"k"}`, "invalid: key: is not valid UTF-8"},
		{`{"key":"a\uDFFF"}`, "invalid: key: is not valid UTF-8"},
		{`{"key":"a\ud800\u0041"}`, "invalid: key: is not valid UTF-8"},
		{`{"key":"a\ud800\ud800"}`, "invalid: key: is not valid UTF-8"},
		{`{"key":"a","payload":{"s":"\\\ud800"}}`, "invalid: payload: is not valid UTF-8"},
		{`{"k\udc00":1}`, "invalid: body: a field name is not valid UTF-8"},
	} {
		err := jsoncheck.Body([]byte(tt.body))
		if !errors.Is(err, task.ErrInvalid) || err.Error() != tt.want {
			t.Errorf("Body(%.40q) = %v; want %q", tt.body, err, tt.want)
		}
	}
	for _, ok := range []string{
		`{"key":"é\u00ff","payload":` + deep(68) + `}`,
		`{"s":"` + strings.Repeat("[", 2000) + `"}`,
		`{"a":"\\\"}"}`,
		`{"key":"\ud83d\ude00 \u00e9 \\ud800 \"\\"}`, // a pair, a plain escape, an escaped backslash
		``,
	} {
		if err := jsoncheck.Body([]byte(ok)); err != nil {
			t.Errorf("Body(%.40q) = %v; want accepted", ok, err)
		}
	}
}
