// Package runtab is the attempts a worker is running, by task key.
//
// The attempts' goroutines write it, and the scheduler reads it to pass
// change events to a running attempt's lease. A run is added after its
// attempt posted the notice that its claim landed, and removed before its
// result reaches the scheduler, so the claim table
// (consumer/internal/claimtab) shows a key here running, or claiming
// with that notice not yet taken, never in another state.
package runtab

import "sync"

// Table is the attempts running here, by task key; R is what an attempt
// keeps of its run. It takes its own lock: it is the one piece of the
// claim path the attempts write.
type Table[R comparable] struct {
	mu sync.Mutex
	m  map[string]R
}

// New returns an empty table.
func New[R comparable]() *Table[R] { return &Table[R]{m: map[string]R{}} }

// Get returns key's run, or R's zero value when none runs here.
func (t *Table[R]) Get(key string) R {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[key]
}

// Set notes r as key's run.
func (t *Table[R]) Set(key string, r R) {
	t.mu.Lock()
	t.m[key] = r
	t.mu.Unlock()
}

// Remove deletes key's run if it is still r (a later attempt here may
// have replaced it).
func (t *Table[R]) Remove(key string, r R) {
	t.mu.Lock()
	if t.m[key] == r {
		delete(t.m, key)
	}
	t.mu.Unlock()
}

// Len is how many attempts run here.
func (t *Table[R]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// Keys returns the task keys running here.
func (t *Table[R]) Keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.m))
	for k := range t.m {
		out = append(out, k)
	}
	return out
}
