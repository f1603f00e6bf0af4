package sqlitestore

import (
	"testing"
	"time"
)

// TestCachedBootMatchesKernel compares the cached boot clock with
// CLOCK_BOOTTIME read by system call.
func TestCachedBootMatchesKernel(t *testing.T) {
	c := &cachedBoot{clocks: wallAndMono, raw: rawBoottime}
	for i := range 2000 {
		before, _ := rawBoottime()
		got, err := c.read()
		if err != nil {
			t.Fatal(err)
		}
		after, _ := rawBoottime()
		// Between the two raw readings, give or take the dating error.
		if got < before-bootPair/2 || got > after+bootPair/2 {
			t.Fatalf("reading %d: cached boot clock %v outside the raw readings around it [%v, %v]", i, got, before, after)
		}
		if i%100 == 0 {
			time.Sleep(time.Millisecond) // readings spread over time: the clock is what is tested
		}
	}
}
