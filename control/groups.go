package control

// Groups' weights and the concurrency limits: what State answers about
// them without store trips.

import (
	"strconv"

	"github.com/leasepool/leasepool/task"
)

// Weight is group's weight: its share of the workers against the other
// groups with ready tasks (DefaultWeight when none is set).
func (s *State) Weight(group string) int {
	if s != nil {
		if l, ok := s.groupLimits[group]; ok && l.Weight > 0 {
			return l.Weight
		}
	}
	return DefaultWeight
}

// Slots is one concurrency limit applied to one task: while it runs, the
// task holds one of the N slot locks of Key in task.LockConcurrency.
type Slots struct {
	// Key names the counted resource: "kind:NAME", "group:NAME" or
	// "lock:KEY" (for a pattern, the task's own lock key: each matching
	// key has N of its own).
	Key string
	N   int
}

// SlotKey is the lock key of slot i.
func (c Slots) SlotKey(i int) string { return c.Key + "#" + strconv.Itoa(i) }

// Concurrency returns the concurrency limits t's run counts against: its
// kind's, its group's, and for each lock key the exact limit or else the
// longest matching pattern's.
func (s *State) Concurrency(t *task.Task) []Slots {
	if s == nil || t == nil {
		return nil
	}
	var out []Slots
	if l, ok := s.kindLimits[t.Kind]; ok && l.Concurrency > 0 {
		out = append(out, Slots{Key: Kind(t.Kind).String(), N: l.Concurrency})
	}
	if l, ok := s.groupLimits[t.Group]; ok && t.Group != "" && l.Concurrency > 0 {
		out = append(out, Slots{Key: Group(t.Group).String(), N: l.Concurrency})
	}
	for _, k := range t.LockKeys {
		if _, l, ok := s.lockLimits.match(k); ok && l.Concurrency > 0 {
			out = append(out, Slots{Key: Lock(k).String(), N: l.Concurrency})
		}
	}
	return out
}
