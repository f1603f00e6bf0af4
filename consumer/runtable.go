// runtable.go: the attempts this worker is running, by task key.

package consumer

import "sync"

// runTable is the attempts running here, by task key.
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
