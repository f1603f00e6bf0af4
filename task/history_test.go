package task_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Each mutation that takes an entry out of the worker list leaves it in
// History with a terminal state, its end time and what it recorded.
func TestHistoryKeepsEntriesTakenOut(t *testing.T) {
	t.Parallel()
	h := task.Holder{WorkerID: "a", Attempt: 1}
	now := t0.Add(time.Second)
	tests := []struct {
		name string
		edit func(p *task.PublishParams)
		do   func(tk *task.Task) error
		want task.AttemptState
	}{
		{"release", nil, func(tk *task.Task) error { return tk.Release(h, now) }, task.WorkerReleased},
		{"snooze", nil, func(tk *task.Task) error { return tk.Snooze(h, now.Add(time.Minute), now) }, task.WorkerSnoozed},
		{"unpin", func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{"a"} }, func(tk *task.Task) error {
			tk.SpecificWorkerIDs = []string{"b"}
			if !tk.Unpin(h, now) {
				t.Error("Unpin changed nothing")
			}
			return nil
		}, task.WorkerUnpinned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := runningDoc(t, tt.edit)
			tk.Record(h, task.Output{Result: json.RawMessage(`"r"`), Log: []task.LogLine{{At: now, Msg: "hi"}}})
			if err := tt.do(tk); err != nil {
				t.Fatal(err)
			}
			if len(tk.Attempts) != 0 || len(tk.History) != 1 {
				t.Fatalf("workers %+v history %+v; want the entry moved to history", tk.Attempts, tk.History)
			}
			w := tk.History[0]
			if w.State != tt.want || w.Attempt != 1 || !w.EndedAt.Equal(now) || string(w.Result) != `"r"` || len(w.Log) != 1 {
				t.Errorf("history entry %+v; want %s ended at %s with its result and log", w, tt.want, now)
			}
			if tk.State != task.StatePending {
				t.Errorf("state %s; want pending (history is not counted)", tk.State)
			}
			// The claim rule reads only Attempts and these counts, so history
			// does not block a claim (consumer/internal/preempt's
			// TestHistoryDoesNotBlockClaim checks the verdict itself).
			if c := tk.CountWorkers(t0.Add(2 * time.Hour)); c != (task.Counts{}) {
				t.Errorf("counts after %s: %+v; want none (history is not counted)", tt.name, c)
			}
		})
	}
}

// A cancel ends the running entries as CANCELLED (none stays RUNNING),
// and a rerun moves every entry to History but still waits for the
// cancelled lease, since its handler stops only at its next ping.
func TestCancelEndsRunningAndResetArchives(t *testing.T) {
	t.Parallel()
	lease := t0.Add(4 * time.Second)
	tk := doc(t, func(p *task.PublishParams) { p.ConcurrentWorkerCnt = 2 },
		ended("x", 1, task.AttemptFail), running("a", 2, lease), running("b", 3, lease))
	now := t0.Add(time.Second)
	if err := tk.Cancel(now); err != nil {
		t.Fatal(err)
	}
	for _, w := range tk.Attempts[1:] {
		if w.State != task.WorkerCancelled || !w.EndedAt.Equal(now) || !w.LeaseUntil.Equal(lease) {
			t.Errorf("entry %+v after Cancel; want CANCELLED at %s, lease kept", w, now)
		}
	}
	if tk.Attempts[0].State != task.AttemptFail {
		t.Errorf("ended entry changed by Cancel: %+v", tk.Attempts[0])
	}
	if err := tk.Reset(now); err != nil {
		t.Fatal(err)
	}
	if !tk.RunAt.Equal(lease) {
		t.Errorf("rerun at %s; want %s, after the cancelled handlers' lease", tk.RunAt, lease)
	}
	if len(tk.Attempts) != 0 || len(tk.History) != 3 || tk.History[1].State != task.WorkerCancelled || tk.History[0].State != task.AttemptFail {
		t.Errorf("workers %+v history %+v; want all three entries in history", tk.Attempts, tk.History)
	}
	all := tk.AttemptHistory()
	if len(all) != 3 || all[0].Attempt != 1 || all[2].Attempt != 3 {
		t.Errorf("AttemptHistory %+v; want attempts 1..3 in order", all)
	}
}

// A rerun of a task another worker finished while one still ran ends
// that entry too: no RUNNING entry in History.
func TestResetEndsRunningEntries(t *testing.T) {
	t.Parallel()
	lease := t0.Add(4 * time.Second)
	tk := doc(t, func(p *task.PublishParams) { p.ConcurrentWorkerCnt = 2 }, ended("a", 1, task.AttemptSuccess), running("b", 2, lease))
	if err := tk.Reset(t0); err != nil {
		t.Fatal(err)
	}
	if w := tk.History[1]; w.State != task.WorkerReleased || !w.EndedAt.Equal(t0) || !tk.RunAt.Equal(lease) {
		t.Errorf("history %+v run_at %s; want b RELEASED, rerun after its lease", tk.History, tk.RunAt)
	}
}

func TestHistoryCapped(t *testing.T) {
	t.Parallel()
	tk := doc(t, nil)
	now := t0
	n := task.MaxHistory + 7
	for i := range n {
		h := tk.Claim(task.Holder{WorkerID: "a", Instance: "i"}, now)
		if h.Attempt != i+1 {
			t.Fatalf("claim %d got attempt %d", i, h.Attempt)
		}
		if err := tk.Snooze(h, now, now); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Millisecond)
	}
	if len(tk.History) != task.MaxHistory || tk.HistoryDropped != 7 {
		t.Fatalf("history %d entries, %d dropped; want %d and 7", len(tk.History), tk.HistoryDropped, task.MaxHistory)
	}
	if first, last := tk.History[0].Attempt, tk.History[task.MaxHistory-1].Attempt; first != 8 || last != n {
		t.Errorf("history keeps attempts %d..%d; want the latest, 8..%d", first, last, n)
	}
	if tk.AttemptsStarted != n || len(tk.Attempts) != 0 {
		t.Errorf("attempts %d workers %+v", tk.AttemptsStarted, tk.Attempts)
	}
}

// Clone copies history deeply: a mutation of the copy leaves the original.
func TestCloneCopiesHistory(t *testing.T) {
	t.Parallel()
	tk := runningDoc(t, nil)
	h := task.Holder{WorkerID: "a", Attempt: 1}
	tk.Record(h, task.Output{Log: []task.LogLine{{At: t0, Msg: "x"}}})
	if err := tk.Release(h, t0); err != nil {
		t.Fatal(err)
	}
	c := tk.Clone()
	c.History[0].Log[0].Msg = "changed"
	c.History[0].State = task.AttemptFail
	if tk.History[0].Log[0].Msg != "x" || tk.History[0].State != task.WorkerReleased {
		t.Errorf("the original changed with its clone: %+v", tk.History[0])
	}
}

func TestRecordCancelled(t *testing.T) {
	t.Parallel()
	h := task.Holder{WorkerID: "a", Attempt: 1}
	out := task.Output{Log: []task.LogLine{{At: t0, Msg: "bye"}}}
	tk := runningDoc(t, nil)
	if err := tk.RecordCancelled(h, out); !errors.Is(err, task.ErrLeaseLost) {
		t.Errorf("RecordCancelled of a running entry: %v; want ErrLeaseLost", err)
	}
	if err := tk.Cancel(t0); err != nil {
		t.Fatal(err)
	}
	before := tk.Clone()
	if err := tk.RecordCancelled(h, out); err != nil {
		t.Fatal(err)
	}
	if len(tk.Attempts[0].Log) != 1 || tk.State != task.StateCancelled || tk.ChangesVersion != before.ChangesVersion || !tk.UpdatedAt.Equal(before.UpdatedAt) {
		t.Errorf("after RecordCancelled: %+v", tk)
	}
}

// History keeps the output of its newest entries within
// MaxHistoryOutput; older ones keep their error's first line and say so.
func TestHistoryOutputBounded(t *testing.T) {
	t.Parallel()
	tk := doc(t, nil)
	big := json.RawMessage(`"` + strings.Repeat("r", task.MaxResultSize-2) + `"`)
	var lines []task.LogLine
	for range task.MaxLogLines {
		lines = append(lines, task.LogLine{At: t0, Msg: strings.Repeat("l", task.MaxLogLineLen)})
	}
	for range task.MaxHistory {
		h := tk.Claim(task.Holder{WorkerID: "a", Instance: "i"}, t0)
		tk.Record(h, task.Output{Result: big, Log: lines})
		if err := tk.Fail(h, "boom\n"+strings.Repeat("stack ", 2*task.MaxErrorLen), time.Time{}, t0); err != nil {
			t.Fatal(err)
		}
		if len(tk.Attempts[len(tk.Attempts)-1].Error) > task.MaxErrorLen {
			t.Fatalf("Fail kept an error of %d bytes; limit %d", len(tk.Attempts[len(tk.Attempts)-1].Error), task.MaxErrorLen)
		}
		if err := tk.Cancel(t0); err != nil {
			t.Fatal(err)
		}
		if err := tk.Reset(t0); err != nil { // archives the failed entry
			t.Fatal(err)
		}
	}
	size, kept := 0, 0
	for _, w := range tk.History {
		size += len(w.Result) + len(w.Error)
		for _, l := range w.Log {
			size += len(l.Msg)
		}
		if !w.OutputDropped {
			kept++
			continue
		}
		if w.Result != nil || w.Log != nil || w.Error != "boom" || w.LogDropped != task.MaxLogLines {
			t.Errorf("a trimmed entry: %+v; want only the error's first line, %d lines counted", w, task.MaxLogLines)
		}
	}
	if size > task.MaxHistoryOutput || kept == 0 || tk.History[len(tk.History)-1].OutputDropped {
		t.Errorf("history keeps %d bytes of output (limit %d), %d entries whole; want the newest kept whole", size, task.MaxHistoryOutput, kept)
	}
}
