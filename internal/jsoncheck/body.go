// Package jsoncheck checks a JSON document a caller sends (an API request
// body, a flow file, a signal's payload) before encoding/json decodes it:
// the checks the decoder does not make, with errors that wrap
// task.ErrInvalid and name the field, as task's own validation does. It
// is shared by the packages that read callers' JSON (web, flow), not a
// part of the task model.
package jsoncheck

import (
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/leasepool/leasepool/task"
)

// bodySlack is how much deeper than task.MaxJSONDepth a top-level field of
// a request body may nest before Body refuses it: a flow file's rollback
// payload sits in three containers of its "steps" field (the array, the
// step, its rollback), so a payload one level too deep there still
// reaches its own check (such as task.ValidatePayload), which names it
// exactly.
const bodySlack = 4

// Body checks a JSON document a caller sends (an API request body, a flow
// file) before encoding/json decodes it, which would rewrite invalid
// UTF-8 in a string to U+FFFD and follow nesting 10,000 levels deep:
// every string must be valid UTF-8 (an escaped UTF-16 surrogate without
// its pair, "\ud800", is not: it decodes to U+FFFD too), and no top-level
// field nest much deeper than task.MaxJSONDepth. Its errors wrap
// task.ErrInvalid and name the top-level field ("body" when there is
// none). It does not check that b is JSON: the decoder that follows does.
func Body(b []byte) error {
	var (
		depth    int
		top      byte   // the outermost container: '{' or '['
		expect   = true // at depth 1 in an object: the next string is a field name
		field    string // the top-level field being read
		inString bool
		escaped  bool
		isName   bool
		start    int
	)
	name := func() string {
		if field == "" {
			return "body"
		}
		return field
	}
	for i, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case inString && c == '"':
			inString = false
			s := b[start+1 : i]
			if !utf8.Valid(s) || loneSurrogate(s) {
				if isName {
					return invalid("body", "a field name is not valid UTF-8")
				}
				return invalid(name(), "is not valid UTF-8")
			}
			if isName {
				field = string(s)
			}
		case inString:
		case c == '"':
			inString, start = true, i
			isName = depth == 1 && top == '{' && expect
		case c == '{' || c == '[':
			depth++
			if depth == 1 {
				top, expect = c, c == '{'
			}
			if depth-1 > task.MaxJSONDepth+bodySlack {
				return invalid(name(), fmt.Sprintf("nested deeper than %d levels", task.MaxJSONDepth))
			}
		case c == '}' || c == ']':
			depth--
		case depth == 1 && c == ',':
			expect = top == '{'
		case depth == 1 && c == ':':
			expect = false
		}
	}
	if inString && !utf8.Valid(b[start:]) {
		return invalid(name(), "is not valid UTF-8")
	}
	return nil
}

// loneSurrogate reports whether the body of a JSON string (without its
// quotes) holds a \u escape of a UTF-16 surrogate that is not the first
// of a high-low pair: encoding/json decodes one to U+FFFD, so two keys
// differing only there would become one.
func loneSurrogate(s []byte) bool {
	escape := func(i int) (rune, bool) { // the \uXXXX at s[i:], if any
		if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(s[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		r, ok := escape(i)
		if !ok {
			i++ // a two-byte escape such as \\ or \"
			continue
		}
		if utf16.IsSurrogate(r) {
			low, ok := escape(i + 6)
			if !ok || utf16.DecodeRune(r, low) == utf8.RuneError {
				return true
			}
			i += 6
		}
		i += 5
	}
	return false
}

// invalid is task's error for a field: "invalid: field: msg", wrapping
// task.ErrInvalid, so a body refused here reads as one task refuses.
func invalid(field, msg string) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, msg)
}
