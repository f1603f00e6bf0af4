package runtab

import (
	"slices"
	"sync"
	"testing"
)

type run struct{ attempt int }

// TestRemoveKeepsALaterRun: an attempt's end removes its own run, not
// the run of a later attempt of the same key that replaced it.
func TestRemoveKeepsALaterRun(t *testing.T) {
	tab := New[*run]()
	first, second := &run{1}, &run{2}
	tab.Set("k", first)
	tab.Set("k", second)
	tab.Remove("k", first)
	if got := tab.Get("k"); got != second {
		t.Fatalf("after the first attempt's removal the key runs %+v; want the second", got)
	}
	tab.Remove("k", second)
	if got := tab.Get("k"); got != nil || tab.Len() != 0 {
		t.Fatalf("after both removals: %+v, %d runs", got, tab.Len())
	}
}

// TestConcurrentAttempts: attempts set and remove their runs from their
// own goroutines while the scheduler reads (run with -race).
func TestConcurrentAttempts(t *testing.T) {
	tab := New[*run]()
	var wg sync.WaitGroup
	keys := []string{"a", "b", "c", "d"}
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				r := &run{i}
				tab.Set(k, r)
				_ = tab.Keys()
				tab.Remove(k, r)
			}
			tab.Set(k, &run{-1})
		}()
	}
	wg.Wait()
	got := tab.Keys()
	slices.Sort(got)
	if !slices.Equal(got, keys) || tab.Len() != len(keys) {
		t.Fatalf("keys %v, len %d; want %v", got, tab.Len(), keys)
	}
}
