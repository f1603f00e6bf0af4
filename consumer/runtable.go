// runtable.go: the attempts this worker is running, by task key.

package consumer

import "sync"

// runTable is the attempts running here, by task key. The attempts'
// goroutines write it, and the scheduler reads it to pass change events
// to a running attempt's lease. Running is a phase of the claim table's
// claiming state: a run is added after its dispatch and removed before
// its result reaches the scheduler.
type runTable struct {
	mu sync.Mutex
	m  map[string]*run
}

func (t *runTable) get(key string) *run {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[key]
}

func (t *runTable) set(key string, r *run) {
	t.mu.Lock()
	t.m[key] = r
	t.mu.Unlock()
}

// remove deletes key's run if it is still r (a later attempt here may
// have replaced it).
func (t *runTable) remove(key string, r *run) {
	t.mu.Lock()
	if t.m[key] == r {
		delete(t.m, key)
	}
	t.mu.Unlock()
}

func (t *runTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// keys returns the task keys running here.
func (t *runTable) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.m))
	for k := range t.m {
		out = append(out, k)
	}
	return out
}
