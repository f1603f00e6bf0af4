package consumer

// Groups (tenants) share the workers by weight; concurrency limits,
// which bound how many tasks of a kind, a group or a lock key run at
// once, are in concurrency.go.
//
// Fair order: among due tasks of one priority, a worker orders the tasks
// of groups by start-time fair queueing. Each grouped task it admits gets
// a start tag, max(the worker's virtual time, its group's last tag) plus
// fairStep/weight, and the virtual time is the tag of the last task
// dispatched; the tag is the entry's Order, which ranks due entries of a
// priority. So a group's backlog admitted ahead does not stand before a
// group that publishes later (its first tag is about the virtual time),
// two backlogged groups are dispatched in the ratio of their weights, and
// a group with nothing ready costs nothing and builds no credit. A full
// heap lets a grouped task in by evicting the entry ordered last
// (preempt.Heap.EvictOrderAfter). Tasks with no group keep their publish
// time as Order. Among several workers the cluster's order is the sum of
// theirs: only the tasks a worker is preferred for (and those it takes
// over, adoptTails) move its groups' tags, which are given again when the
// workers' ranking moves (retag). See
// docs/decisions/0016-groups-by-start-time-fair-queueing.md.

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/claimtab"
	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// fairStep is the virtual time a task of weight 1 takes; one of weight w
// takes fairStep/w (control.MaxWeight divides it).
const fairStep = time.Millisecond

// fairClock is a worker's start-time fair queueing state. Only the
// scheduler's goroutine uses it.
type fairClock struct {
	vclock time.Time
	last   map[string]time.Time // group → its last start tag
	tags   map[string]time.Time // task key → its start tag, while held here
	bound  int
	// seen is the groups heard of lately (offers), for topUp; drained
	// holds those whose head read came back short until then.
	seen      map[string]time.Time
	drained   map[string]time.Time
	lastTopUp time.Time
	// maxTag is the latest tag given: a task tagged after it finds no
	// grouped entry to take the place of.
	maxTag time.Time
	// rankedOf is the live workers the held entries were tagged under
	// (retag).
	rankedOf *preempt.Peers
	// adopted is the tasks of its peers' shares this worker took over
	// (adoptTails), lastAdopt when it last looked for some.
	adopted   map[string]bool
	lastAdopt time.Time
}

// maxTopUpGroups bounds the groups a worker tops its heap up with at
// once: the ones heard of last.
const maxTopUpGroups = 64

// topUpInterval is how often topUp looks at the groups' shares of the heap.
const topUpInterval = 20 * time.Millisecond

// adoptInterval is how often topUp reads a group's backlog whole for
// tasks to take over (adoptTails), once this worker's share of it is
// drained: at most once for all groups, so that many small groups do not
// cost a read each.
const adoptInterval = 100 * time.Millisecond

// order is t's Order before any stand-by: its start tag when it has a
// group (the same for the same key while known), else its publish time.
// charge is whether this worker is t's preferred worker (see tag).
func (f *fairClock) order(t *task.Task, weight int, now time.Time, charge bool) time.Time {
	tag, _ := f.tag(t, weight, now, true, charge)
	return tag
}

// tag is t's start tag and whether it is new; kept only when keep is set
// (a task the heap may have no room for must not move its group's clock).
// A kept tag moves the group's clock only when charge is set: for the
// tasks this worker is preferred for (its share, rank 0), which it runs.
// Those it stands by for (the head of the queue every worker reads) are
// its peers' to run: charged here as well, each worker would count its
// peers' share of a group as its own, and the group at the head of the
// queue (the one drained slowest, so the one whose tasks lie oldest)
// would find its own tasks here tagged behind the ones its peers take,
// far past the other groups'. Not charged, such a task is tagged at the
// group's clock (its place in the fair order, the stand-by after it),
// and one a peer leaves to this worker is served once, uncounted here
// and counted by the peer that did not run it: the sum stays fair.
func (f *fairClock) tag(t *task.Task, weight int, now time.Time, keep, charge bool) (time.Time, bool) {
	if t.Group == "" {
		if t.CreatedAt.IsZero() {
			return now, false
		}
		return t.CreatedAt, false
	}
	if f.seen == nil || len(f.seen) > 4*maxTopUpGroups {
		f.seen, f.drained = map[string]time.Time{}, map[string]time.Time{}
	}
	f.seen[t.Group] = now
	if tag, ok := f.tags[t.Key]; ok {
		return tag, false
	}
	delete(f.drained, t.Group) // a new task: its head may be longer now
	if f.last == nil {
		f.last, f.tags = map[string]time.Time{}, map[string]time.Time{}
	}
	if f.vclock.IsZero() {
		f.vclock = now
	}
	tag := f.vclock
	if l := f.last[t.Group]; l.After(tag) {
		tag = l
	}
	tag = tag.Add(fairStep / time.Duration(max(weight, 1)))
	if keep {
		f.tags[t.Key] = tag
		if charge {
			f.last[t.Group] = tag
		}
		if tag.After(f.maxTag) {
			f.maxTag = tag
		}
	}
	return tag, true
}

// prune forgets the tags of the tasks no longer held here (kept tells
// which are) and the groups' last tags the virtual time has passed (the
// next tag starts from the virtual time anyway), once more than bound
// tags are kept. The tags of held tasks and the groups' clocks must
// outlive it: forgotten while their entries keep their Order, the next
// tasks of a group would be tagged from the virtual time again, before
// the entries of the other groups tagged earlier up to their backlog's
// span ahead, and one group would run alone until the virtual time
// caught up with those.
func (f *fairClock) prune(kept func(key string) bool) {
	if len(f.tags) <= f.bound {
		return
	}
	for k := range f.tags {
		if !kept(k) {
			delete(f.tags, k)
		}
	}
	for k := range f.adopted {
		if !kept(k) {
			delete(f.adopted, k)
		}
	}
	for g, l := range f.last {
		if !l.After(f.vclock) {
			delete(f.last, g)
		}
	}
	if len(f.tags) > f.bound {
		// More held than the bound (it is several heaps' worth): start
		// over rather than grow.
		f.last, f.tags = map[string]time.Time{}, map[string]time.Time{}
	}
}

// popped advances the virtual time to a dispatched entry's tag.
func (f *fairClock) popped(e preempt.Entry) {
	if e.Task == nil {
		return
	}
	tag, ok := f.tags[e.Key]
	if !ok && e.Task.Group == "" {
		tag = e.Task.CreatedAt
	}
	if tag.After(f.vclock) {
		f.vclock = tag
	}
}

// fairOrder is t's Order (see fairClock.order) and delay, its stand-by,
// after it: a task this worker is preferred for (delay 0) moves its
// group's clock; any other stands behind them by its stand-by, but one
// it took over from a peer (adoptTails), which moves the clock as its
// own and takes its place among them (due after its stand-by all the
// same).
func (s *scheduler) fairOrder(t *task.Task, now time.Time, delay time.Duration) time.Time {
	s.fair.bound = 4 * s.cfg.HeapSize
	s.fair.prune(func(key string) bool {
		st := s.tab.State(key)
		return st.Held() || st == claimtab.Claiming
	})
	if s.fair.adopted[t.Key] {
		return s.fair.order(t, s.ctl.Load().Weight(t.Group), now, true)
	}
	return s.fair.order(t, s.ctl.Load().Weight(t.Group), now, delay == 0).Add(delay)
}

// retag tags the grouped entries in the heap again, in their order,
// once the live workers rank tasks otherwise (workers came or went, or
// this one first heard of its peers): the tasks this worker was preferred
// for moved its groups' clocks (fairClock.tag), and those that are now a
// peer's would leave holes in them, the group's own tasks tagged behind
// them, until the heap turned over (at four workers starting together,
// a second's claims at up to 90 % A, weight 3 against 1). Each entry's
// stand-by moves to its new rank too, in its claim time and its Order.
func (s *scheduler) retag(now time.Time) {
	f := &s.fair
	p := s.peers.Load()
	if p == f.rankedOf || p.SameRanking(f.rankedOf) {
		f.rankedOf = p
		return
	}
	f.rankedOf = p
	type held struct {
		e     preempt.Entry
		tag   time.Time
		delay time.Duration // the stand-by its entry was placed with
	}
	var hs []held
	s.tab.EachQueued(func(e preempt.Entry) {
		if e.Task == nil || e.Task.Group == "" {
			return
		}
		tag, ok := f.tags[e.Key]
		if !ok {
			tag = e.Order
		}
		delay := e.Order.Sub(tag)
		if f.adopted[e.Key] {
			delay = 0 // none in its Order, and its claim time stays
		}
		hs = append(hs, held{e, tag, delay})
	})
	if len(hs) == 0 {
		return
	}
	slices.SortFunc(hs, func(a, b held) int {
		if c := a.tag.Compare(b.tag); c != 0 {
			return c
		}
		return cmp.Compare(a.e.Seq, b.e.Seq)
	})
	for _, h := range hs {
		delete(f.tags, h.e.Key)
	}
	clear(f.last)
	f.maxTag = f.vclock
	for _, h := range hs {
		e := h.e
		delay := s.standBy.Delay(e.Task, now)
		if s.tab.State(e.Key) == claimtab.Queued && !f.adopted[e.Key] {
			e.At = e.At.Add(delay - h.delay)
		}
		e.Order = s.fairOrder(e.Task, now, delay)
		s.tab.Queue(e)
	}
}

// evictFair makes room for a grouped task ordered before the last entry
// of its priority.
func (s *scheduler) evictFair(t *task.Task, now time.Time) bool {
	if t.Group == "" {
		return false
	}
	tag, _ := s.fair.tag(t, s.ctl.Load().Weight(t.Group), now, false, false)
	if !tag.Before(s.fair.maxTag) {
		return false // a backlog's own next task: nothing held is ordered later
	}
	return s.tab.EvictOrderAfter(t.Priority, tag)
}

// topUp keeps one group's backlog from holding the others out of the
// heap. The refill reads the store in claim-time order, so a heap full of
// a backlog published first holds no task of a group published after it
// (its tasks come in by their publish events, evicting the backlog's
// last: evictFair, but not those published before this worker read).
// While the store holds more than the heap (overflow), every
// topUpInterval, the groups heard of lately that hold less than half
// their share of the heap (HeapSize × weight / the weights' sum) have
// their head read (task.CandidateQuery.Group; this worker's share of it
// when it is one of several), on from the task of theirs held last
// (heldByGroup), into it up to their share, in place of the entries
// ordered last: a group drained faster than the pages bring it (a weight
// of 3 against 1 in batches published alike) is kept in the heap.
func (s *scheduler) topUp(ctx context.Context) {
	f := &s.fair
	if !s.overflow || time.Since(f.lastTopUp) < topUpInterval || s.tab.Paging() {
		return
	}
	ctl := s.ctl.Load()
	if ctl != nil {
		// A group with a limit or weight is known before any of its tasks
		// is heard of: a worker reading another's backlog first looks for
		// it all the same.
		for _, l := range ctl.Limits {
			if _, ok := f.seen[l.Target.Name]; l.Target.Scope == control.ScopeGroup && !ok && len(f.seen) < maxTopUpGroups {
				if f.seen == nil {
					f.seen, f.drained = map[string]time.Time{}, map[string]time.Time{}
				}
				f.seen[l.Target.Name] = time.Time{}
			}
		}
	}
	if len(f.seen) < 2 {
		return
	}
	f.lastTopUp = time.Now()
	now := s.store.Now()
	held, tail := heldByGroup(s.tab.EachQueued, now)
	groups := make([]string, 0, len(f.seen))
	for g, at := range f.seen {
		if !at.IsZero() && now.Sub(at) > time.Minute && held[g] == 0 {
			delete(f.seen, g)
			continue
		}
		groups = append(groups, g)
	}
	slices.SortFunc(groups, func(a, b string) int { return f.seen[b].Compare(f.seen[a]) })
	groups = groups[:min(len(groups), maxTopUpGroups)]
	sum := 0
	for _, g := range groups {
		sum += ctl.Weight(g)
	}
	for _, g := range groups {
		share := s.cfg.HeapSize * ctl.Weight(g) / sum
		if held[g] >= share/2 || now.Before(f.drained[g]) {
			continue
		}
		// This worker's share of the group's head, as past the head of
		// the whole queue (refill.go): tasks it is preferred for.
		q := task.CandidateQuery{Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: now, Ready: true, Group: g, Share: s.share(), After: tail[g], Limit: max(share-held[g], 1)}
		page, err := s.store.Candidates(ctx, q)
		if err != nil {
			return // the next refill tries again
		}
		read, adopted := len(page), 0
		if read < q.Limit && q.Share != nil && time.Since(f.lastAdopt) >= adoptInterval {
			// Its share of the group is drained, perhaps not the group's
			// backlog: see adoptTails.
			f.lastAdopt = time.Now()
			all := task.CandidateQuery{Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: now, Ready: true, Group: g, Limit: s.cfg.HeapSize}
			rest, err := s.store.Candidates(ctx, all)
			if err != nil {
				return
			}
			picked := adoptTails(rest, s.cfg.WorkerID, s.peers.Load().Preferred, func(t *task.Task) bool { return f.adopted[t.Key] }, share-held[g])
			if f.adopted == nil {
				f.adopted = map[string]bool{}
			}
			for _, t := range picked {
				f.adopted[t.Key] = true
			}
			page, read, adopted = append(page, picked...), len(rest), len(picked)
		}
		for _, t := range page {
			if !s.tab.State(t.Key).Held() && s.full() && !s.evictFair(t, now) {
				break
			}
			s.offer(t, now)
		}
		switch {
		case adopted > 0:
			f.drained[g] = now.Add(adoptInterval) // what is left is weighed again
		case read == 0:
			// Nothing ready: not read again before its next publish is
			// heard (or half a minute): on SQLite the read scans the
			// backlog ahead of it.
			f.drained[g] = now.Add(30 * time.Second)
		case read < q.Limit:
			f.drained[g] = now.Add(time.Second) // or until its next publish is heard
		}
	}
}

// adoptTails picks the tasks worker self takes over from its peers'
// shares of a group's backlog, from rest, the group's ready tasks in the
// store's order (preferred names each task's preferred worker and the
// workers able to run it). The shares are of unequal size (rendezvous
// buckets a few per cent apart), so the workers would run out of a
// group 100-200 ms apart, the first then running the other groups alone
// (at four workers, weight 3 against 1, A fell to 68 % of the window).
// Every worker reading the same backlog computes the same split: each
// should hold an equal part of it, and those short of that part (the
// takers, in ID order) share out the tail of each longer share beyond
// its part, one in turn, self at most want of them. The tail is what its
// owner reaches last, and its owner charged it last, so taking it leaves
// no hole in the owner's fair order; the taker charges it as its own
// (fairOrder). The tasks self took over before (taken) count as its own:
// the store does not know them taken, and read again their owner would
// look long still, and self short. Nothing when self is not short.
func adoptTails(rest []*task.Task, self string, preferred func(*task.Task) (string, []string), taken func(*task.Task) bool, want int) []*task.Task {
	byOwner := map[string][]*task.Task{}
	workers := map[string]bool{}
	for _, t := range rest {
		owner, able := preferred(t)
		if taken(t) {
			owner = self // taken over before: self's now, not its owner's
		}
		byOwner[owner] = append(byOwner[owner], t)
		for _, w := range able {
			workers[w] = true
		}
	}
	if len(workers) < 2 || !workers[self] || want <= 0 {
		return nil
	}
	part := (len(rest) + len(workers) - 1) / len(workers)
	var takers, owners []string
	for w := range workers {
		if len(byOwner[w]) < part {
			takers = append(takers, w)
		} else if len(byOwner[w]) > part {
			owners = append(owners, w)
		}
	}
	slices.Sort(takers)
	slices.Sort(owners)
	turn := slices.Index(takers, self)
	if turn < 0 {
		return nil
	}
	want = min(want, part-len(byOwner[self]))
	var picked []*task.Task
	for _, o := range owners {
		for j, t := range byOwner[o][part:] {
			if len(picked) == want {
				return picked
			}
			if j%len(takers) == turn {
				picked = append(picked, t)
			}
		}
	}
	return picked
}

// heldByGroup counts the entries of each group in the heap (each walks
// them), and finds each group's tail: its ready task held last in the
// store's candidate order. topUp reads a group's head on from its tail,
// past what is held: read from the top, the head would be the tasks held
// already, and bring nothing. A task waiting for a later claim time
// stands past every ready one in that order and would skip them.
func heldByGroup(each func(func(preempt.Entry)), now time.Time) (held map[string]int, tail map[string]*task.Task) {
	held, tail = map[string]int{}, map[string]*task.Task{}
	ready := task.CandidateQuery{Ready: true}
	each(func(e preempt.Entry) {
		t := e.Task
		if t == nil {
			return
		}
		held[t.Group]++
		if !t.NextClaimAt.After(now) && (tail[t.Group] == nil || ready.Less(tail[t.Group], t)) {
			tail[t.Group] = t
		}
	})
	return held, tail
}
