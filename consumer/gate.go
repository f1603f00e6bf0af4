// gate.go: tasks held before their claim, with no store write, while
// something outside the store says they cannot run yet (a device that is
// offline). Every worker judges alone, from what it knows: the claim is
// the store's, the hold is not.

package consumer

import (
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// A Gate is implemented by a Handler whose tasks may have to wait for
// something outside the store before a claim is worth a write: a device
// command whose device is offline would only be claimed to be given back.
// The scheduler asks Ready before each claim of such a task; while the
// answer is no, the task is held in this worker (the claim table's gated
// state), no store write made, until Hold.Wake is closed or Hold.Recheck
// has passed, and then asked again. A Mux is a Gate for the handlers
// registered on it that are.
//
// Ready runs on the scheduler's goroutine: it must answer from memory, at
// once. A gate that errs towards "ready" costs a claim; one that errs
// towards "not ready" delays the task until its next recheck.
type Gate interface {
	Ready(t *task.Task) (hold Hold, ready bool)
}

// Hold is how a task a Gate keeps back waits.
type Hold struct {
	// Wake is closed when the task may be ready (a device's state
	// changed); nil waits for Recheck alone.
	Wake <-chan struct{}
	// Recheck is the longest the task is held before Ready is asked again;
	// zero or less means DefaultGateRecheck.
	Recheck time.Duration
}

// DefaultGateRecheck is Hold.Recheck's default.
const DefaultGateRecheck = 30 * time.Second

// Ready asks the Gate registered for t's kind, if its handler is one.
func (m *Mux) Ready(t *task.Task) (Hold, bool) {
	m.mu.RLock()
	h := m.handlers[t.Kind]
	m.mu.RUnlock()
	if g, ok := h.(Gate); ok {
		return g.Ready(t)
	}
	return Hold{}, true
}

// gated holds e aside while the gate of its kind says its task cannot
// run yet, and reports whether it did. With the tasks held aside at their
// bound (asideFull) the task is let go instead: the store keeps it, and
// the hold's wake, watched once however many tasks wait on it, reads
// again.
func (s *scheduler) gated(e preempt.Entry) bool {
	hold, held := s.gateHolds(e.Task)
	if !held {
		return false
	}
	if s.asideFull() {
		s.tab.LetGo(e.Key, nil, claimtab.LetGoGated)
		s.watchLetGo(hold)
		return true
	}
	s.tab.Gate(e)
	s.await(gateWake{key: e.Key}, hold)
	return true
}

// gateHolds asks t's gate, if any, whether it keeps t back.
func (s *scheduler) gateHolds(t *task.Task) (Hold, bool) {
	if s.gate == nil || t == nil {
		return Hold{}, false
	}
	hold, ready := s.gate.Ready(t)
	return hold, !ready
}

// watchLetGo watches the wake of a hold whose task was let go, once
// however many tasks wait on it: when it fires, they are read again.
func (s *scheduler) watchLetGo(hold Hold) {
	if !s.letGoWakes[hold.Wake] {
		s.letGoWakes[hold.Wake] = true
		s.await(gateWake{wake: hold.Wake}, hold)
	}
}

// gateWake is a hold that ended: that of key, held here, or, with key
// empty, the wake that tasks let go wait on.
type gateWake struct {
	key  string
	wake <-chan struct{}
}

// await sends w to the scheduler when hold's wake closes or its recheck
// passes.
func (s *scheduler) await(w gateWake, hold Hold) {
	recheck := hold.Recheck
	if recheck <= 0 {
		recheck = DefaultGateRecheck
	}
	go func() {
		t := time.NewTimer(recheck)
		defer t.Stop()
		select {
		case <-hold.Wake:
		case <-t.C:
		case <-s.done:
			return
		}
		select {
		case s.gateWakes <- w:
		case <-s.done:
		}
	}()
}

// onGateWake puts a held key back in the heap, due, when it is still held
// by a gate (dispatch asks the gate again; a wake of a key since moved on
// is ignored), and reads again the tasks let go on a wake.
func (s *scheduler) onGateWake(w gateWake) {
	if w.key != "" {
		s.tab.Ungate(w.key)
		return
	}
	delete(s.letGoWakes, w.wake)
	s.tab.FreeLine(claimtab.LetGoGated)
	s.dropped()
}
