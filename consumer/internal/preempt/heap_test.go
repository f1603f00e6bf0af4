package preempt_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
)

func entry(key string, at time.Time, prio int, seq int64) preempt.Entry {
	return preempt.Entry{Key: key, At: at, Priority: prio, Seq: seq}
}

func popAll(h *preempt.Heap, now time.Time) []string {
	var keys []string
	for {
		e, ok := h.Pop(now)
		if !ok {
			return keys
		}
		keys = append(keys, e.Key)
	}
}

func TestHeapPopOrder(t *testing.T) {
	t.Parallel()
	h := preempt.NewHeap(10)
	h.Put(entry("late-high", t0.Add(time.Minute), 9, 1))
	h.Put(entry("low-old", t0.Add(-time.Second), 0, 2))
	h.Put(entry("high-new", t0, 5, 9))
	h.Put(entry("high-old", t0.Add(-time.Hour), 5, 3))
	h.Put(entry("mid", t0.Add(-2*time.Second), 1, 4))

	if got, want := popAll(h, t0), []string{"high-old", "high-new", "mid", "low-old"}; !slices.Equal(got, want) {
		t.Errorf("Pop order = %v, want %v", got, want)
	}
	if h.Len() != 1 || !h.Has("late-high") {
		t.Fatalf("not-due entry popped: len %d", h.Len())
	}
	if at, ok := h.Next(); !ok || !at.Equal(t0.Add(time.Minute)) {
		t.Errorf("Next = %s %v", at, ok)
	}
	if _, ok := h.Pop(t0.Add(time.Minute - 1)); ok {
		t.Error("popped before due")
	}
	if e, ok := h.Pop(t0.Add(time.Minute)); !ok || e.Key != "late-high" {
		t.Errorf("Pop at due = %v %v", e, ok)
	}
	if _, ok := h.Next(); ok {
		t.Error("Next on empty heap ok")
	}
}

func TestHeapBounded(t *testing.T) {
	t.Parallel()
	h := preempt.NewHeap(2)
	if !h.Put(entry("a", t0, 0, 1)) || !h.Put(entry("b", t0, 0, 2)) {
		t.Fatal("Put refused below bound")
	}
	if !h.Full() {
		t.Error("Full false at bound")
	}
	if h.Put(entry("c", t0, 9, 3)) {
		t.Error("Put of a new key accepted when full")
	}
	if h.Has("c") || h.Len() != 2 {
		t.Error("refused entry kept")
	}
	if !h.Put(entry("a", t0.Add(time.Hour), 7, 1)) {
		t.Error("replacing an existing key refused when full")
	}
	if e, ok := h.Entry("a"); !ok || e.Priority != 7 || !e.At.Equal(t0.Add(time.Hour)) {
		t.Errorf("Entry(a) = %+v %v", e, ok)
	}
	if got := popAll(h, t0); !slices.Equal(got, []string{"b"}) {
		t.Errorf("Pop = %v, want [b] (a moved later)", got)
	}
	if h.Full() || !h.Put(entry("c", t0, 0, 3)) {
		t.Error("room not freed by Pop")
	}
}

func TestHeapEvictBelow(t *testing.T) {
	t.Parallel()
	now := time.Now()
	h := preempt.NewHeap(4)
	for i, p := range []int{5, 1, 1, 3} {
		h.Put(entry(fmt.Sprintf("k%d", i), now, p, int64(i)))
	}
	if _, ok := h.EvictBelow(1); ok {
		t.Fatal("evicted for a priority no higher than any held")
	}
	// The lowest priority goes, the latest published among equals.
	if e, ok := h.EvictBelow(2); !ok || e.Key != "k2" {
		t.Fatalf("EvictBelow(2) = %v, %v; want k2", e.Key, ok)
	}
	if !h.Put(entry("urgent", now, 2, 9)) {
		t.Fatal("no room after an eviction")
	}
	h.Remove("k1")
	h.Put(entry("k4", now, 4, 10))
	// The floor lags (k1 gone); the scan finds the real lowest: urgent.
	if e, ok := h.EvictBelow(3); !ok || e.Key != "urgent" {
		t.Fatalf("EvictBelow(3) = %v, %v; want urgent", e.Key, ok)
	}
	if _, ok := h.EvictBelow(3); ok {
		t.Fatal("evicted an entry of priority 3 for priority 3")
	}
	if got, want := popAll(h, now), []string{"k0", "k4", "k3"}; !slices.Equal(got, want) {
		t.Fatalf("left %v, want %v", got, want)
	}
}

// TestHeapEvictLater: a full heap of entries due later makes room for a
// task claimable sooner, by the latest entry of its priority or lower;
// never by an entry due sooner or of a higher priority.
func TestHeapEvictLater(t *testing.T) {
	t.Parallel()
	now := time.Now()
	h := preempt.NewHeap(4)
	h.Put(entry("soon", now.Add(time.Minute), 1, 1))
	h.Put(entry("hour", now.Add(time.Hour), 1, 2))
	h.Put(entry("day", now.Add(24*time.Hour), 1, 3))
	h.Put(entry("urgent-later", now.Add(48*time.Hour), 5, 4))
	if _, ok := h.EvictLater(1, now.Add(72*time.Hour)); ok {
		t.Fatal("evicted for a task due after every entry of its priority")
	}
	if e, ok := h.EvictLater(1, now); !ok || e.Key != "day" {
		t.Fatalf("EvictLater(1, now) = %v, %v; want day (not the higher priority's urgent-later)", e.Key, ok)
	}
	if !h.Put(entry("ready", now, 1, 5)) {
		t.Fatal("no room after an eviction")
	}
	if e, ok := h.EvictLater(1, now.Add(30*time.Minute)); !ok || e.Key != "hour" {
		t.Fatalf("EvictLater(1, +30m) = %v, %v; want hour", e.Key, ok)
	}
	if _, ok := h.EvictLater(1, now.Add(2*time.Minute)); ok {
		t.Fatal("evicted an entry due before the task")
	}
}

func TestHeapRemoveAndEntry(t *testing.T) {
	t.Parallel()
	h := preempt.NewHeap(5)
	h.Put(entry("a", t0, 1, 1))
	h.Put(entry("b", t0.Add(time.Hour), 1, 2))
	h.Put(entry("c", t0, 2, 3))
	// Move a and c into the ready queue, then remove one from each queue.
	if e, ok := h.Pop(t0); !ok || e.Key != "c" {
		t.Fatalf("Pop = %v", e)
	}
	if at, ok := h.Next(); !ok || !at.IsZero() {
		t.Errorf("Next with a ready entry = %s %v, want zero (now)", at, ok)
	}
	h.Remove("a")
	h.Remove("b")
	h.Remove("missing")
	if h.Len() != 0 {
		t.Errorf("Len = %d after removals", h.Len())
	}
	if _, ok := h.Entry("a"); ok {
		t.Error("Entry of removed key")
	}
	if _, ok := h.Pop(t0.Add(2 * time.Hour)); ok {
		t.Error("Pop after removals")
	}
	// Replacing a ready entry with a later one takes it out of the ready queue.
	h.Put(entry("d", t0, 1, 4))
	h.Pop(t0.Add(-time.Hour)) // nothing due, d stays a timer
	h.Put(entry("e", t0, 0, 5))
	if e, ok := h.Pop(t0); !ok || e.Key != "d" {
		t.Fatalf("Pop = %v", e)
	}
	h.Put(entry("e", t0.Add(time.Hour), 0, 5))
	if _, ok := h.Pop(t0); ok {
		t.Error("replaced entry popped at its old time")
	}
	n := 0
	h.Each(func(e preempt.Entry) { n++ })
	if n != 1 {
		t.Errorf("Each saw %d entries", n)
	}
}

// TestHeapModel runs random operations on a Heap and on a plain slice kept
// sorted on demand, and checks they agree.
func TestHeapModel(t *testing.T) {
	t.Parallel()
	for seed := range uint64(200) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 1))
			const max = 8
			h := preempt.NewHeap(max)
			var model []preempt.Entry
			find := func(key string) int {
				return slices.IndexFunc(model, func(e preempt.Entry) bool { return e.Key == key })
			}
			now, lastPop := t0, time.Time{}
			var seq int64
			for step := range 300 {
				key := fmt.Sprintf("k%d", rng.IntN(14))
				switch op := rng.IntN(10); {
				case op < 4:
					seq++
					e := entry(key, now.Add(time.Duration(rng.IntN(20)-5)*time.Second), rng.IntN(4), seq)
					i := find(key)
					wantOK := i >= 0 || len(model) < max
					if got := h.Put(e); got != wantOK {
						t.Fatalf("step %d: Put(%s) = %v, want %v", step, key, got, wantOK)
					}
					switch {
					case i >= 0:
						model[i] = e
					case wantOK:
						model = append(model, e)
					}
				case op < 5:
					h.Remove(key)
					if i := find(key); i >= 0 {
						model = slices.Delete(model, i, i+1)
					}
				case op < 8:
					now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
					lastPop = now
					got, ok := h.Pop(now)
					best := -1
					for i, e := range model {
						if e.At.After(now) {
							continue
						}
						if best < 0 || e.Priority > model[best].Priority ||
							(e.Priority == model[best].Priority && e.Seq < model[best].Seq) {
							best = i
						}
					}
					if ok != (best >= 0) {
						t.Fatalf("step %d: Pop ok = %v, model has due %v", step, ok, best >= 0)
					}
					if ok {
						if got.Key != model[best].Key || got.Seq != model[best].Seq {
							t.Fatalf("step %d: Pop = %s/%d, want %s/%d", step, got.Key, got.Seq, model[best].Key, model[best].Seq)
						}
						model = slices.Delete(model, best, best+1)
					}
				default:
					e, ok := h.Entry(key)
					i := find(key)
					if ok != (i >= 0) || (ok && e != model[i]) {
						t.Fatalf("step %d: Entry(%s) = %+v %v, model %d", step, key, e, ok, i)
					}
				}
				if h.Len() != len(model) || h.Full() != (len(model) >= max) {
					t.Fatalf("step %d: Len %d Full %v, model %d", step, h.Len(), h.Full(), len(model))
				}
				at, ok := h.Next()
				if ok != (len(model) > 0) {
					t.Fatalf("step %d: Next ok %v with %d entries", step, ok, len(model))
				}
				if ok {
					earliest := slices.MinFunc(model, func(a, b preempt.Entry) int { return a.At.Compare(b.At) }).At
					if at.IsZero() {
						// Something was found due at the last Pop.
						if lastPop.IsZero() || earliest.After(lastPop) {
							t.Fatalf("step %d: Next says ready, earliest %s, last pop %s", step, earliest, lastPop)
						}
					} else if !at.Equal(earliest) {
						t.Fatalf("step %d: Next = %s, want earliest %s", step, at, earliest)
					}
				}
			}
		})
	}
}
