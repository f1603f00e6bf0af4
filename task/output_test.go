package task_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/leasepool/leasepool/task"
)

func TestLogText(t *testing.T) {
	t.Parallel()
	if got := task.LogText("a\nb\x00c\xffd"); got != "a b c\uFFFDd" {
		t.Errorf("LogText cleans to %q", got)
	}
	long := strings.Repeat("é", task.MaxLogLineLen) // 2 bytes each
	got := task.LogText(long)
	if len(got) > task.MaxLogLineLen || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("LogText of %d bytes: %d bytes, valid UTF-8 %v, %q…", len(long), len(got), utf8.ValidString(got), got[len(got)-8:])
	}
}

func TestRecord(t *testing.T) {
	t.Parallel()
	h := task.Holder{WorkerID: "a", Attempt: 1}
	now := t0.Add(time.Second)
	t.Run("stored on the entry, bounded", func(t *testing.T) {
		tk := runningDoc(t, nil)
		var lines []task.LogLine
		for i := range task.MaxLogLines + 3 {
			lines = append(lines, task.LogLine{At: now.In(time.FixedZone("x", 3600)), Msg: "l\n" + string(rune('a'+i))})
		}
		tk.Record(h, task.Output{Result: json.RawMessage(` {"n":1} `), Log: lines, LogDropped: 2})
		if err := tk.Succeed(h, now); err != nil {
			t.Fatal(err)
		}
		w := tk.Attempts[0]
		if string(w.Result) != `{"n":1}` || string(tk.Result()) != `{"n":1}` {
			t.Errorf("result %s, Result() %s; want {\"n\":1}", w.Result, tk.Result())
		}
		if len(w.Log) != task.MaxLogLines || w.LogDropped != 5 || w.Log[0].Msg != "l d" || w.Log[0].At.Location() != time.UTC {
			t.Errorf("log: %d lines, %d dropped, first %+v; want %d, 5 dropped, first \"l d\" in UTC", len(w.Log), w.LogDropped, w.Log[0], task.MaxLogLines)
		}
	})
	t.Run("an oversized result is left out, and said so", func(t *testing.T) {
		tk := runningDoc(t, nil)
		big := json.RawMessage(`"` + strings.Repeat("x", task.MaxResultSize) + `"`)
		tk.Record(h, task.Output{Result: big})
		w := tk.Attempts[0]
		if w.Result != nil || len(w.Log) != 1 || !strings.Contains(w.Log[0].Msg, "result") {
			t.Errorf("entry %+v; want no result and a line saying why", w)
		}
	})
	t.Run("null is no result; no entry, no change", func(t *testing.T) {
		tk := runningDoc(t, nil)
		tk.Record(h, task.Output{Result: json.RawMessage("null")})
		tk.Record(task.Holder{WorkerID: "b", Attempt: 1}, task.Output{Result: json.RawMessage("1")})
		if tk.Attempts[0].Result != nil || tk.Result() != nil {
			t.Errorf("entry %+v", tk.Attempts[0])
		}
	})
}

func TestResultIsLatestSucceeded(t *testing.T) {
	t.Parallel()
	s1, s2, f := ended("a", 1, task.AttemptSuccess), ended("b", 3, task.AttemptSuccess), ended("c", 4, task.AttemptFail)
	s1.Result, s2.Result, f.Result = json.RawMessage("1"), json.RawMessage("3"), json.RawMessage("4")
	tk := doc(t, nil, s2, s1, f)
	if got := string(tk.Result()); got != "3" {
		t.Errorf("Result() = %s; want 3, the latest succeeded attempt's", got)
	}
}

func TestValidateResult(t *testing.T) {
	t.Parallel()
	deep := strings.Repeat("[", task.MaxJSONDepth+1) + strings.Repeat("]", task.MaxJSONDepth+1)
	ok := `[{"s":"[[[[\"{{{{"},` + strings.Repeat("[", task.MaxJSONDepth-1) + strings.Repeat("]", task.MaxJSONDepth-1) + `]`
	if err := task.ValidateResult(json.RawMessage(ok)); err != nil {
		t.Errorf("ValidateResult at the depth limit, brackets in strings: %v", err)
	}
	for _, b := range []string{"{", strings.Repeat(" ", task.MaxResultSize+1), deep} {
		if err := task.ValidateResult(json.RawMessage(b)); err == nil || !strings.Contains(err.Error(), "result") {
			t.Errorf("ValidateResult(%.10q): %v; want an error naming result", b, err)
		}
	}
}

func TestFailKeepsABoundedValidError(t *testing.T) {
	t.Parallel()
	tk := runningDoc(t, nil)
	h := task.Holder{WorkerID: "a", Attempt: 1}
	if err := tk.Fail(h, "bad \xff"+strings.Repeat("é", task.MaxErrorLen), time.Time{}, t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	e := tk.Attempts[0].Error
	if len(e) > task.MaxErrorLen || !utf8.ValidString(e) || !strings.HasPrefix(e, "bad \uFFFD") || tk.Changes[0].Error != e {
		t.Errorf("error kept: %d bytes, valid UTF-8 %v, starts %q; noted %d bytes", len(e), utf8.ValidString(e), e[:8], len(tk.Changes[0].Error))
	}
}

// TestRecordNotesNewLines: a write that carries lines the attempt logged
// since its previous write notes exactly those (ChangeLogged), the kept
// ones when more came than the window holds; one with nothing new notes
// nothing.
func TestRecordNotesNewLines(t *testing.T) {
	now := time.Now()
	tk := &task.Task{Key: "k", Version: 3}
	h := tk.Claim(task.Holder{WorkerID: "w", Instance: "i"}, now)
	line := func(i int) task.LogLine { return task.LogLine{At: now, Msg: fmt.Sprintf("line %d", i)} }
	logged := func() []string {
		var out []string
		for _, c := range tk.WriteChanges() {
			if c.Op == task.ChangeLogged {
				for _, l := range c.Log {
					out = append(out, l.Msg)
				}
			}
		}
		return out
	}
	write := func() { tk.Version++ } // as the store's Update does, after the mutations
	write()
	tk.Record(h, task.Output{Log: []task.LogLine{line(1), line(2)}})
	write()
	if got := logged(); !slices.Equal(got, []string{"line 1", "line 2"}) {
		t.Fatalf("first write noted %v", got)
	}
	tk.Record(h, task.Output{Log: []task.LogLine{line(1), line(2)}})
	write()
	if got := logged(); got != nil {
		t.Fatalf("a write with nothing new noted %v", got)
	}
	var many []task.LogLine
	for i := 1; i <= task.MaxLogLines+5; i++ {
		many = append(many, line(i))
	}
	tk.Record(h, task.Output{Log: many[5:], LogDropped: 5})
	write()
	got := logged()
	// Lines 3 to 5 were left out before this write reached the store: the
	// new lines it can note are the kept ones, 6 on.
	if len(got) != task.MaxLogLines || got[0] != "line 6" || got[len(got)-1] != fmt.Sprintf("line %d", task.MaxLogLines+5) {
		t.Fatalf("past the window, noted %d lines %v, want lines 6..%d", len(got), got, task.MaxLogLines+5)
	}
}
