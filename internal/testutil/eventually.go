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
