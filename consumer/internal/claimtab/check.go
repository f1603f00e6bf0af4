// check.go: the claim table's consistency with its indexes, checked by
// consumer's tests after every turn of a scheduler's loop.

package claimtab

import (
	"fmt"
	"slices"
)

// Check reports the first way the table disagrees with itself or with the
// heap and the lock queue's indexes: a key in two places, an index entry
// no state accounts for, or an index holding a newer document than the
// table's.
func (c *Table) Check() error {
	var counts [NumStates]int
	inHeap := 0
	for key, k := range c.keys {
		counts[k.state]++
		switch {
		case k.state == Absent || k.state >= NumStates:
			return fmt.Errorf("%s: a row in state %s", key, k.state)
		case k.state.InHeap() != c.heap.Has(key):
			return fmt.Errorf("%s: %s, and in the heap: %v", key, k.state, c.heap.Has(key))
		case k.state == Dispatching:
			return fmt.Errorf("%s: dispatching outside dispatch", key)
		case k.state == Idle && (!c.paging || !slices.Contains(c.idle, key)):
			return fmt.Errorf("%s: idle while no page is read, or not listed for endPage", key)
		case !k.state.InFlight() && k.heard:
			return fmt.Errorf("%s: %s with a document heard", key, k.state)
		case k.state.InFlight() != (k.attempt != 0):
			return fmt.Errorf("%s: %s with attempt number %d", key, k.state, k.attempt)
		}
		if k.state.InHeap() {
			inHeap++
			if e, _ := c.heap.Entry(key); Newer(e.Task, k.doc) {
				return fmt.Errorf("%s: the heap's document (seq %d v%d) is newer than the table's", key, e.Task.Seq, e.Task.Version)
			}
		}
		if k.state.Aside() && (k.entry.Key != key || Newer(k.entry.Task, k.doc)) {
			return fmt.Errorf("%s: %s entry %q or its document out of step", key, k.state, k.entry.Key)
		}
		if (k.state == LockWaiting) != (len(k.waitKeys) > 0) {
			return fmt.Errorf("%s: %s waiting on %v", key, k.state, k.waitKeys)
		}
		if k.state == RateParked && (!c.rateParked[k.lockKey][key] || k.entry.Key != key || Newer(k.entry.Task, k.doc)) {
			return fmt.Errorf("%s: rate-parked on %q, unindexed, or its entry %q or document out of step", key, k.lockKey, k.entry.Key)
		}
		if (k.state == LockParked || k.state == RateParked) != (k.lockKey != "") {
			return fmt.Errorf("%s: %s parked on %q", key, k.state, k.lockKey)
		}
		if (k.state == LetGo) != (k.line != "") || (k.state == LetGo && !c.letGo[k.line][key]) {
			return fmt.Errorf("%s: %s let go on %q, which the lines index: %v", key, k.state, k.line, c.letGo[k.line][key])
		}
	}
	rateParked := 0
	for qk, keys := range c.rateParked {
		for key := range keys {
			rateParked++
			if k := c.keys[key]; k == nil || k.state != RateParked || k.lockKey != qk {
				return fmt.Errorf("%s: rate-parked on %q, but %s in the table", key, qk, c.State(key))
			}
		}
	}
	if rateParked != counts[RateParked] {
		return fmt.Errorf("%d tasks rate-parked, %d in the table", rateParked, counts[RateParked])
	}
	letGo := 0
	for line, keys := range c.letGo {
		for key := range keys {
			letGo++
			if k := c.keys[key]; k == nil || k.state != LetGo || k.line != line {
				return fmt.Errorf("%s: let go on %q, but %s in the table", key, line, c.State(key))
			}
		}
	}
	if letGo != counts[LetGo] || (c.letGoRoom > 0 && letGo > c.letGoRoom) {
		return fmt.Errorf("%d tasks on let-go lines, %d let go in the table (room %d)", letGo, counts[LetGo], c.letGoRoom)
	}
	if counts != c.counts {
		return fmt.Errorf("state counts %v, rows %v", c.counts, counts)
	}
	if c.heap.Len() != inHeap {
		return fmt.Errorf("the heap holds %d entries, the table %d keys in it", c.heap.Len(), inHeap)
	}
	q := c.locks
	q.mu.Lock()
	defer q.mu.Unlock()
	parked := 0
	for lk, m := range q.parked {
		for key, e := range m {
			parked++
			k := c.keys[key]
			if k == nil || k.state != LockParked || k.lockKey != lk || e.Key != key {
				return fmt.Errorf("%s: parked on %q, but %s in the table", key, lk, c.State(key))
			}
			if Newer(e.Task, k.doc) {
				return fmt.Errorf("%s: the parked document is newer than the table's", key)
			}
		}
	}
	if parked != counts[LockParked] {
		return fmt.Errorf("%d tasks parked, %d lock-parked in the table", parked, counts[LockParked])
	}
	for lk, m := range q.waiting {
		if len(m) == 0 {
			return fmt.Errorf("an empty waiting set for %q", lk)
		}
		for key := range m {
			if k := c.keys[key]; k == nil || k.state != LockWaiting || !slices.Contains(k.waitKeys, lk) {
				return fmt.Errorf("%s: waiting for %q, but %s in the table", key, lk, c.State(key))
			}
		}
	}
	for key, k := range c.keys {
		for _, lk := range k.waitKeys {
			if !q.waiting[lk][key] {
				return fmt.Errorf("%s: lock-waiting on %q, which the index lacks", key, lk)
			}
		}
	}
	return nil
}
