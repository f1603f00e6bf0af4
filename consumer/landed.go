package consumer

import "sync"

// landings are the notices of claims landed that the scheduler has not
// taken yet. An attempt posts one as its handler starts, without waiting
// for the scheduler's goroutine (a lock held for an append, a send that
// never blocks), so nothing comes between a claim and its run; the
// scheduler takes them at each turn of its loop, and before it applies
// any attempt's result, and moves those keys to running
// (claimtab.Running).
type landings struct {
	mu   sync.Mutex
	list []landing
	// wake has room for one signal: the loop wakes to take the notices.
	wake chan struct{}
}

// landing names a key and its attempt (claimtab.Table.Claim), so that a
// notice of one attempt never moves another.
type landing struct {
	key     string
	attempt uint64
}

func newLandings() *landings { return &landings{wake: make(chan struct{}, 1)} }

// post notes that attempt's claim of key landed.
func (l *landings) post(key string, attempt uint64) {
	l.mu.Lock()
	l.list = append(l.list, landing{key, attempt})
	l.mu.Unlock()
	signal(l.wake)
}

// take returns the notices posted so far and keeps spare, emptied, for
// the next ones: the scheduler hands back each list once it has applied
// it, so the two lists take turns and posting allocates nothing.
func (l *landings) take(spare []landing) []landing {
	select {
	case <-l.wake: // taken now: a notice posted from here on signals again
	default:
	}
	clear(spare)
	l.mu.Lock()
	list := l.list
	l.list = spare[:0]
	l.mu.Unlock()
	return list
}

// has reports whether a notice of attempt's claim of key waits to be
// taken.
func (l *landings) has(key string, attempt uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.list {
		if n.key == key && n.attempt == attempt {
			return true
		}
	}
	return false
}
