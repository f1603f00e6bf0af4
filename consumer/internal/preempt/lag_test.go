package preempt_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

const ms = time.Millisecond

// TestStretchedStep: the step is the configured one unless two high lags
// outlast it, and never more than the limit.
func TestStretchedStep(t *testing.T) {
	base := preempt.Spread{Step: 20 * ms, MaxRank: 10}
	for _, c := range []struct {
		high, want time.Duration
	}{
		{0, 20 * ms},                   // no lag
		{preempt.UnknownLag, 100 * ms}, // no stream heard yet: the longest
		{8 * ms, 20 * ms},              // the embedded store: the configured step
		{10 * ms, 20 * ms},             // two lags just fit
		{30 * ms, 60 * ms},             // a slow tail: twice it
		{80 * ms, 100 * ms},            // bounded
		{900 * ms, 100 * ms},           // however slow
	} {
		s := base.Stretched(c.high, 100*ms)
		if s.Step != c.want || s.MaxRank != base.MaxRank {
			t.Errorf("high %s: step %s (max rank %d), want %s", c.high, s.Step, s.MaxRank, c.want)
		}
		if got := s.Delay(3); got != 3*c.want {
			t.Errorf("high %s: rank 3 stands by %s, want %s", c.high, got, 3*c.want)
		}
		if got := s.Delay(0); got != 0 {
			t.Errorf("high %s: the preferred worker stands by %s", c.high, got)
		}
	}
	if s := (preempt.Spread{Step: 150 * ms, MaxRank: 10}).Stretched(10*ms, 100*ms); s.Step != 150*ms {
		t.Errorf("a configured step over the limit became %s", s.Step)
	}
}

// TestEventLagsHigh: the high lag follows the window's slow tail, not
// one outlier, and forgets a slow spell once the window has moved past it.
func TestEventLagsHigh(t *testing.T) {
	var l preempt.EventLags
	if l.High() != preempt.UnknownLag {
		t.Fatalf("no lag yet: high %s", l.High())
	}
	for range preempt.MinLags - 1 {
		l.Note(7 * ms)
	}
	if l.High() != preempt.UnknownLag {
		t.Fatalf("%d lags of 7ms: high %s, want unknown", preempt.MinLags-1, l.High())
	}
	l.Note(7 * ms)
	if l.High() != 7*ms {
		t.Fatalf("%d lags of 7ms: high %s", preempt.MinLags, l.High())
	}
	for range preempt.LagWindow {
		l.Note(5 * ms)
	}
	if l.High() != 5*ms {
		t.Fatalf("steady 5ms: high %s", l.High())
	}
	l.Note(90 * ms) // one outlier in the window: not the tail
	for range 16 {
		l.Note(5 * ms)
	}
	if l.High() != 5*ms {
		t.Fatalf("one 90ms outlier: high %s, want 5ms", l.High())
	}
	for range preempt.LagWindow / 50 { // a slow spell of 2 %: the tail
		l.Note(40 * ms)
	}
	for range 16 {
		l.Note(5 * ms)
	}
	if l.High() != 40*ms {
		t.Fatalf("%d lags of 40ms in %d: high %s, want 40ms", preempt.LagWindow/50, preempt.LagWindow, l.High())
	}
	for range preempt.LagWindow {
		l.Note(6 * ms)
	}
	if l.High() != 6*ms {
		t.Fatalf("after the window moved past the slow spell: high %s, want 6ms", l.High())
	}
}

// TestStandByOutlastsTwoLags is the decision the step serves: the next
// rank tries at Delay(1); the preferred worker's claim reaches it at
// L0 + L1 (the task's event reaching the preferred worker, then its claim
// reaching the next one). With lags shaped as measured on the MongoDB
// wire test server with 8 processes (a 10 ms poll, a few ms of reads, a
// tail of slow polls), a step from the mean lets the next rank try before
// it hears the claim for one task in tens; the step from the tail, for
// about one in a hundred or fewer.
func TestStandByOutlastsTwoLags(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lag := func() time.Duration {
		d := 2*ms + time.Duration(r.Int64N(int64(10*ms)))
		if r.IntN(100) < 3 {
			d += time.Duration(r.Int64N(int64(25 * ms)))
		}
		return d
	}
	var l preempt.EventLags
	var sum time.Duration
	for range preempt.LagWindow {
		d := lag()
		l.Note(d)
		sum += d
	}
	mean := sum / preempt.LagWindow
	tail := preempt.DefaultSpread.Stretched(l.High(), 100*ms)
	fromMean := preempt.DefaultSpread
	fromMean.Step = max(fromMean.Step, 5*mean/2) // the rule before
	early := func(s preempt.Spread) float64 {
		n := 0
		for range 10000 {
			if lag()+lag() >= s.Delay(1) {
				n++
			}
		}
		return float64(n) / 10000
	}
	if e := early(tail); e > 0.01 {
		t.Errorf("step %s (high lag %s): the next rank tries before hearing the claim for %.3f of tasks", tail.Step, l.High(), e)
	}
	if e := early(fromMean); e < 0.03 {
		t.Errorf("the mean's step %s (mean lag %s) already covers all but %.3f: the test no longer tells the rules apart", fromMean.Step, mean, e)
	}
}

// TestWrittenAt: an event's lag runs from its own write, also when the
// document it carries is a later write's.
func TestWrittenAt(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	doc := &task.Task{Key: "k", Version: 4, CreatedAt: t0, UpdatedAt: t0.Add(30 * ms),
		Attempts: []task.Attempt{{WorkerID: "a", StartedAt: t0.Add(10 * ms), ClaimVersion: 2}}}
	for _, c := range []struct {
		version int64
		want    time.Time
		ok      bool
	}{
		{0, t0.Add(30 * ms), true}, // the stream does not say: the document's own
		{4, t0.Add(30 * ms), true}, // the document's own write
		{1, t0, true},              // the publish
		{2, t0.Add(10 * ms), true}, // the claim
		{3, time.Time{}, false},    // some write between: unknown
	} {
		at, ok := preempt.WrittenAt(doc, c.version)
		if ok != c.ok || !at.Equal(c.want) {
			t.Errorf("version %d: %s %v, want %s %v", c.version, at, ok, c.want, c.ok)
		}
	}
}
