package claimtab

import (
	"testing"
	"time"
)

// TestWakeDuringClaimIsKept: the holder's finish event that comes while a
// claim it will stop is in flight finds no waiter; landed reports it, so
// that the stopped claim tries again at once instead of at the lease end.
func TestWakeDuringClaimIsKept(t *testing.T) {
	q := NewLocks()
	tab := New(Config{HeapSize: 8, Locks: q})
	quiet := q.Depart([]string{"dev"})
	if q.Landed([]string{"dev"}, quiet) {
		t.Fatal("landed reports a wake that never came")
	}
	woken := q.Depart([]string{"dev", "other"})
	tab.WakeOne("dev", time.Now())
	if tab.heap.Len() != 0 {
		t.Fatal("a wake found a waiter in an empty queue")
	}
	if !q.Landed([]string{"dev", "other"}, woken) {
		t.Fatal("a wake of dev during the claim was lost")
	}
	if len(q.flights) != 0 {
		t.Fatalf("%d flights left after every claim landed", len(q.flights))
	}
}
