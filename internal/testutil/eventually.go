package testutil

import (
	"testing"
	"time"
)

// Pace is how often Eventually checks its condition: short, as the
// conditions tests wait on are mostly cheap reads of memory or a store,
// and a wait should end soon after the fact holds.
const Pace = 10 * time.Millisecond

// Eventually checks cond every Pace until it holds, failing t with
// "timed out after WITHIN waiting for WHAT" if within passes first. cond
// is checked once more after the last pause, so a fact that holds at the
// deadline is not missed.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyEvery(t, within, Pace, what, cond)
}

// EventuallyEvery is Eventually at another pace, for a condition too
// costly to check every Pace (one that reads many documents of a store
// other processes share, say).
func EventuallyEvery(t testing.TB, within, every time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(every)
	}
}

// Consistently checks cond every Pace for d, failing t with "WHAT stopped
// holding after ELAPSED" the first time it does not hold. It is for a
// fact that must not change: nothing runs while paused, nothing more is
// written while idle. It spends all of d when the fact holds, so d is the
// window the test is about, not a guess at how long something takes.
func Consistently(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ConsistentlyEvery(t, d, Pace, what, cond)
}

// ConsistentlyEvery is Consistently at another pace, for a costly
// condition.
func ConsistentlyEvery(t testing.TB, d, every time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	end := start.Add(d)
	for {
		if !cond() {
			t.Fatalf("%s stopped holding after %s", what, time.Since(start).Round(time.Millisecond))
		}
		if !time.Now().Before(end) {
			return
		}
		time.Sleep(min(every, time.Until(end)))
	}
}

// Settles waits until value has stayed the same for still, failing t if
// that has not happened within within. It is for activity that should
// come to rest (reads that stop once a backlog is known) where no one
// fact says it has: the test then checks it stays at rest.
func Settles(t testing.TB, within, still time.Duration, what string, value func() int64) {
	t.Helper()
	SettlesEvery(t, within, still, Pace, what, value)
}

// SettlesEvery is Settles at another pace, for a costly value.
func SettlesEvery(t testing.TB, within, still, every time.Duration, what string, value func() int64) {
	t.Helper()
	last, since := value(), time.Now()
	EventuallyEvery(t, within, every, what, func() bool {
		if v := value(); v != last {
			last, since = v, time.Now()
		}
		return time.Since(since) >= still
	})
}

// Within checks cond every Pace until it holds or within passes, and
// reports whether it held: for a test that says more than Eventually
// would when the wait fails (a process's output, say), or for which a
// wait that ends without the fact is an answer, not a failure.
func Within(within time.Duration, cond func() bool) bool {
	return WithinEvery(within, Pace, cond)
}

// WithinEvery is Within at another pace, for a costly condition.
func WithinEvery(within, every time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(every)
	}
	return true
}

// EventuallyTook is Eventually that returns how long cond took to hold,
// for tests that measure it (a takeover within a lease, say).
func EventuallyTook(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	Eventually(t, within, what, cond)
	return time.Since(start)
}
