package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// hasControl reports whether s has a control character other than the
// newlines that end its lines.
func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r != '\n' && (r < 0x20 || r == 0x7f) })
}

func TestProgressPlainWhenNotATerminal(t *testing.T) {
	t.Parallel()
	var out testutil.SyncBuffer
	p := newProgress(&out) // a buffer is no terminal
	if p.tty {
		t.Fatal("a buffer taken for a terminal")
	}
	p.every = 100 * time.Millisecond
	start := time.Now()
	for i := range 60 {
		p.Status(fmt.Sprintf("\r\033[K  step %d\t  ", i))
		time.Sleep(5 * time.Millisecond) // statuses come faster than every: the test is about which are written
	}
	p.Println("killed\r one")
	p.Status("step 60")
	testutil.Eventually(t, 5*time.Second, "the held status to be written when its turn comes", func() bool { return strings.Contains(out.String(), "step 60\n") })
	p.Status("step 61")
	p.Close()
	p.Status("after close")
	elapsed := time.Since(start)
	got := out.String()
	if hasControl(got) {
		t.Errorf("control characters in %q", got)
	}
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	if limit := int(elapsed/p.every) + 4; len(lines) > limit || len(lines) < 4 {
		t.Errorf("%d lines in %s at one per %s: %q", len(lines), elapsed, p.every, lines)
	}
	if lines[0] != "step 0" {
		t.Errorf("first line %q, want the first status at once", lines[0])
	}
	for _, want := range []string{"killed one", "step 60", "step 61"} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("no line %q in %q", want, lines)
		}
	}
	if strings.Contains(got, "after close") {
		t.Errorf("a status after Close was written: %q", lines)
	}
}

func TestProgressInPlaceOnATerminal(t *testing.T) {
	t.Parallel()
	var out testutil.SyncBuffer
	p := &progress{w: &out, tty: true, every: time.Hour}
	p.Status("one")
	p.Status("two")
	p.Println("note")
	p.Status("three")
	p.Close()
	if got, want := out.String(), "\r\033[Kone\r\033[Ktwo\nnote\n\r\033[Kthree\n"; got != want {
		t.Errorf("terminal output %q, want %q", got, want)
	}
}

// Package bench writes "\r\033[K" before each status and ends with a line.
func TestProgressWriterForBench(t *testing.T) {
	t.Parallel()
	var out testutil.SyncBuffer
	p := newProgress(&out)
	p.every = time.Hour
	w := progressWriter{p}
	for i := range 1000 {
		fmt.Fprintf(w, "\r\033[Klatency: %d/1000 published", i)
	}
	fmt.Fprint(w, "\r\033[Kdone\n")
	if got, want := out.String(), "latency: 0/1000 published\ndone\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}

	var tty testutil.SyncBuffer
	w = progressWriter{&progress{w: &tty, tty: true}}
	fmt.Fprint(w, "\r\033[Kthroughput run 1/3")
	fmt.Fprint(w, "\r\033[Kdone\n")
	if got, want := tty.String(), "\r\033[Kthroughput run 1/3\r\033[Kdone\n"; got != want {
		t.Errorf("terminal output %q, want %q", got, want)
	}
}

func TestStatusTextBounded(t *testing.T) {
	t.Parallel()
	s := statusText(strings.Repeat("é", 500) + "\x1b[31m")
	if n := len([]rune(s)); n != maxStatusLen {
		t.Errorf("%d characters, want %d", n, maxStatusLen)
	}
	if hasControl(s) {
		t.Errorf("control characters in %q", s)
	}
}

func TestWaitSummary(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pending := func(kind string, runAt time.Duration, last task.AttemptState) *task.Task {
		t := &task.Task{Key: fmt.Sprint(runAt, last), Kind: kind, State: task.StatePending, RunAt: now.Add(runAt)}
		if last != "" {
			t.History = []task.Attempt{{WorkerID: "w1", Attempt: 1, State: task.AttemptFail}, {WorkerID: "w2", Attempt: 2, State: last}}
		}
		return t
	}
	var all []*task.Task
	for i := range 9 {
		all = append(all, pending("sleep", time.Duration(2+i)*time.Second-time.Millisecond, ""))
	}
	all = append(all, pending("sleep", 2500*time.Millisecond, task.AttemptFail),
		&task.Task{Key: "done", Kind: "sleep", State: task.StateSucceeded})
	live := []task.WorkerInfo{{ID: "w2", Kinds: []string{"sleep", "noop"}}}
	if got, want := waitSummary(all, live, nil, now), "10 waiting: 9 delayed until +2s..+10s, 1 retry backoff until +3s"; got != want {
		t.Errorf("summary %q\n want %q", got, want)
	}

	locked := &task.Task{Key: "l", Kind: "sleep", State: task.StatePending, RunAt: now, LockKeys: []string{"printer"}}
	holder := &task.Task{Key: "h", Kind: "sleep", State: task.StateRunning, LockKeys: []string{"printer"}}
	command := func(device string) *task.Task {
		t := pending(mqttdev.Kind, 0, task.WorkerSnoozed)
		t.Key, t.Payload = device, []byte(`{"device":"`+device+`","command":"reboot"}`)
		return t
	}
	all = []*task.Task{
		command("dev-1"),
		command("dev-2"),
		command("dev-3"), // online: due now, among the others
		pending("resize", 0, ""),
		{Key: "p", Kind: "sleep", State: task.StatePending, RunAt: now, SpecificWorkerIDs: []string{"w9"}},
		locked, holder,
		{Key: "r", Kind: "sleep", State: task.StatePending, RunAt: now.Add(-time.Second)},
	}
	live = append(live, task.WorkerInfo{ID: "w3", Kinds: []string{mqttdev.Kind}})
	want := `7 waiting: 2 device offline, 2 due now, 1 lock printer, 2 other`
	if got := waitSummary(all, live, map[string]bool{"dev-1": true, "dev-2": true}, now); got != want {
		t.Errorf("summary %q\n want %q", got, want)
	}
	if got := waitSummary([]*task.Task{holder}, live, nil, now); got != "" {
		t.Errorf("nothing pending: %q", got)
	}
}
