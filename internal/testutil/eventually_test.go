package testutil

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestEventuallyWaitsForTheFact: cond is checked until it holds, and
// Eventually returns then without failing.
func TestEventuallyWaitsForTheFact(t *testing.T) {
	n := 0
	Eventually(t, 5*time.Second, "the third check", func() bool { n++; return n == 3 })
	if n != 3 {
		t.Errorf("cond checked %d times, want 3", n)
	}
}

// fatalTB records a Fatalf and ends its goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestEventuallyTimesOut: a fact that never holds fails the test after
// within, naming the wait and the time waited; cond was checked past the
// deadline.
func TestEventuallyTimesOut(t *testing.T) {
	f := &fatalTB{TB: t}
	var last time.Time
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		EventuallyEvery(f, 50*time.Millisecond, 5*time.Millisecond, "the impossible", func() bool { last = time.Now(); return false })
	}()
	<-done
	if want := "timed out after 50ms waiting for the impossible"; f.msg != want {
		t.Errorf("failed with %q, want %q", f.msg, want)
	}
	if last.Sub(start) < 50*time.Millisecond {
		t.Errorf("last check %s after the start, before the deadline", last.Sub(start))
	}
}

// TestConsistentlyHoldsForTheWindow: a fact that holds is checked until
// the window ends, the last check at or after its end.
func TestConsistentlyHoldsForTheWindow(t *testing.T) {
	var last time.Time
	start := time.Now()
	Consistently(t, 50*time.Millisecond, "the fact", func() bool { last = time.Now(); return true })
	if last.Sub(start) < 50*time.Millisecond {
		t.Errorf("last check %s after the start, before the window ended", last.Sub(start))
	}
}

// TestConsistentlyFailsAtTheChange: a fact that stops holding fails the
// test at once, naming it, without waiting out the window.
func TestConsistentlyFailsAtTheChange(t *testing.T) {
	f := &fatalTB{TB: t}
	n := 0
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		Consistently(f, time.Minute, "the fact", func() bool { n++; return n < 3 })
	}()
	<-done
	if !strings.HasPrefix(f.msg, "the fact stopped holding after ") {
		t.Errorf("failed with %q, want it to name the fact", f.msg)
	}
	if n != 3 || time.Since(start) > 10*time.Second {
		t.Errorf("checked %d times over %s; want a failure at the third check", n, time.Since(start))
	}
}

// TestSettlesWaitsForRest: a value that changes for a while, then stays,
// settles once it has stayed for the still period.
func TestSettlesWaitsForRest(t *testing.T) {
	start := time.Now()
	Settles(t, 5*time.Second, 50*time.Millisecond, "the value", func() int64 {
		return min(int64(time.Since(start)/(10*time.Millisecond)), 10) // changes for 100 ms
	})
	if took := time.Since(start); took < 150*time.Millisecond {
		t.Errorf("settled after %s, before 100 ms of changes and 50 ms still", took)
	}
}

// TestWithinReports: Within says whether the fact came in time.
func TestWithinReports(t *testing.T) {
	n := 0
	if !Within(5*time.Second, func() bool { n++; return n == 3 }) {
		t.Error("Within reported false for a fact that held at the third check")
	}
	if Within(30*time.Millisecond, func() bool { return false }) {
		t.Error("Within reported true for a fact that never held")
	}
}
