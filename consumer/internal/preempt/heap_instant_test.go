package preempt_test

import (
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// TestHeapInstantLane: entries of the instant kinds are popped with the
// others in one order by Pop, alone by PopInstant; NextInstant, Remove,
// Len and EvictLater see them.
func TestHeapInstantLane(t *testing.T) {
	now := time.Unix(1000, 0)
	of := func(key, kind string, at time.Time, prio int, seq int64) preempt.Entry {
		e := entry(key, at, prio, seq)
		e.Task = &task.Task{Key: key, Kind: kind}
		return e
	}
	h := preempt.NewHeap(10)
	h.SetInstant([]string{"timer"})
	h.Put(of("a", "work", now, 0, 1))
	h.Put(of("t1", "timer", now, 0, 2))
	h.Put(of("b", "work", now, 5, 3))
	h.Put(of("t2", "timer", now.Add(time.Second), 0, 4))
	h.Put(of("t3", "timer", now.Add(2*time.Second), 0, 5))
	if at, ok := h.NextInstant(); !ok || !at.Equal(now) {
		t.Fatalf("NextInstant = %s, %v: want t1's time", at, ok)
	}
	if e, ok := h.PopInstant(now); !ok || e.Key != "t1" {
		t.Fatalf("PopInstant = %q, %v: want t1, the only instant entry due", e.Key, ok)
	}
	if e, ok := h.PopInstant(now); ok {
		t.Fatalf("PopInstant = %q: want none due", e.Key)
	}
	if at, ok := h.NextInstant(); !ok || !at.Equal(now.Add(time.Second)) {
		t.Fatalf("NextInstant = %s, %v: want t2's time", at, ok)
	}
	h.Remove("t2")
	if h.Has("t2") || h.Len() != 3 {
		t.Fatalf("after Remove(t2): Has %v, Len %d", h.Has("t2"), h.Len())
	}
	if e, ok := h.EvictLater(0, now); !ok || e.Key != "t3" {
		t.Fatalf("EvictLater = %q, %v: want t3, the latest entry", e.Key, ok)
	}
	h.Put(of("t4", "timer", now, 9, 6))
	if got := popAll(h, now); !slices.Equal(got, []string{"t4", "b", "a"}) {
		t.Fatalf("Pop order %v: want by priority across both lanes", got)
	}
	if _, ok := h.Next(); ok {
		t.Fatal("Next reports an entry in an empty heap")
	}
}
