package task

// What a handler leaves with its attempt: a JSON result and a few short
// log lines, stored on its worker entry by the write that finishes the
// attempt (Record, then Succeed, Fail, Snooze or Release in the same
// compare-and-set). Both are bounded here, so every path that writes them
// agrees and a handler cannot grow a task document without limit.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on what one attempt records, so that a handler cannot grow a
// task document without limit (see also MaxHistoryOutput).
const (
	// MaxResultSize is the largest result, in bytes of JSON.
	MaxResultSize = 16 << 10
	// MaxLogLines is how many log lines an attempt keeps: the latest ones;
	// LogDropped counts the earlier lines left out.
	MaxLogLines = 20
	// MaxLogLineLen is the longest log line, in bytes; longer lines are
	// cut at a character boundary and end with "…".
	MaxLogLineLen = 256
	// MaxErrorLen is the longest error a failed attempt keeps (a panic's
	// stack fits), in bytes, cut as log lines are.
	MaxErrorLen = 8 << 10
)

// LogLine is one line a handler logged, at store time.
type LogLine struct {
	At  time.Time `json:"at"`
	Msg string    `json:"msg"`
}

// Output is what the handler of one attempt recorded.
type Output struct {
	Result     json.RawMessage
	Log        []LogLine
	LogDropped int // lines logged before Log's first, left out
}

// ValidateResult checks a handler's result: valid JSON and UTF-8 of at
// most MaxResultSize bytes, nested at most MaxJSONDepth levels (a result
// no backend could store would keep its attempt's outcome unwritten). Its
// errors wrap ErrInvalid and name the field.
func ValidateResult(b json.RawMessage) error {
	if len(b) > MaxResultSize {
		return invalid("result", fmt.Sprintf("is %d bytes, more than the limit of %d", len(b), MaxResultSize))
	}
	return ValidateJSON("result", b, MaxJSONDepth)
}

// jsonDepthOver reports whether b nests arrays and objects deeper than
// limit, reading no further than the first level past it.
func jsonDepthOver(b []byte, limit int) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			if depth++; depth > limit {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// LogText cleans one log line for storage: control characters (newlines
// included) become spaces, invalid UTF-8 becomes U+FFFD, and the line is
// cut to MaxLogLineLen bytes.
func LogText(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return cut(s, MaxLogLineLen)
}

// cut cuts s to at most n bytes at a character boundary, ending it with
// "…" when it was longer.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	i := n - len(ellipsis)
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + ellipsis
}

// Record stores out on h's entry, for the finishing mutation that follows
// in the same write (which refuses the write if h no longer holds the
// lease, so Record does nothing when h has no entry). It never fails: a
// result over the limits is left out and says so in the log, so a bad
// result cannot keep the attempt's outcome from being written.
func (t *Task) Record(h Holder, out Output) {
	i := t.Entry(h)
	if i < 0 {
		return
	}
	w := &t.Attempts[i]
	lines, dropped := make([]LogLine, 0, len(out.Log)+1), out.LogDropped
	for _, l := range out.Log {
		lines = append(lines, LogLine{At: l.At.UTC(), Msg: LogText(l.Msg)})
	}
	w.Result = nil
	if r := bytes.TrimSpace(out.Result); len(r) > 0 && !bytes.Equal(r, []byte("null")) {
		if err := ValidateResult(r); err != nil {
			lines = append(lines, LogLine{At: t.UpdatedAt.UTC(), Msg: LogText("result left out: " + err.Error())})
		} else {
			w.Result = bytes.Clone(r)
		}
	}
	if n := len(lines) - MaxLogLines; n > 0 {
		lines, dropped = lines[n:], dropped+n
	}
	if len(lines) == 0 {
		lines = nil
	}
	if fresh := newLines(w.Log, w.LogDropped, lines, dropped); len(fresh) > 0 {
		t.note(Change{Op: ChangeLogged, WorkerID: w.WorkerID, Instance: w.Instance, Attempt: w.Attempt, Log: fresh})
	}
	w.Log, w.LogDropped = lines, dropped
}

// newLines returns the lines of (lines, dropped) that (old, oldDropped)
// did not have yet: the log only grows, keeping its latest MaxLogLines.
func newLines(old []LogLine, oldDropped int, lines []LogLine, dropped int) []LogLine {
	n := (dropped + len(lines)) - (oldDropped + len(old))
	if n <= 0 {
		return nil
	}
	return slices.Clone(lines[max(len(lines)-n, 0):])
}

// Result returns the result of t's latest succeeded attempt that
// recorded one (in History too, so a task rerun since keeps its last
// one), or nil.
func (t *Task) Result() json.RawMessage {
	var best *Attempt
	for _, ws := range [][]Attempt{t.Attempts, t.History} {
		for i := range ws {
			if w := &ws[i]; w.State == AttemptSuccess && len(w.Result) > 0 && (best == nil || w.Attempt > best.Attempt) {
				best = w
			}
		}
	}
	if best == nil {
		return nil
	}
	return best.Result
}
