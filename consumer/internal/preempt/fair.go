package preempt

import "time"

// EvictOrderAfter makes room for a task of priority p ordered at order
// (Entry.Order) in a full heap that EvictBelow and EvictLater found no
// room in: it removes the entry of priority p ordered latest, when that is
// after order, and returns it. A group's tasks, ordered by their fair
// share, then enter a heap full of another group's backlog, so that the
// backlog does not stand before them.
func (h *Heap) EvictOrderAfter(p int, order time.Time) (Entry, bool) {
	var worst *item
	for _, it := range h.byKey {
		if it.lane == 0 && it.Priority == p && it.Order.After(order) && (worst == nil || it.Order.After(worst.Order)) {
			worst = it
		}
	}
	if worst == nil {
		return Entry{}, false
	}
	h.remove(worst)
	return worst.Entry, true
}
