package consumer

// refill.go is how the scheduler fills its heap from the store: full
// queries page by page, and the next page of a long backlog read aside
// while the scheduler goes on dispatching.

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/leasepool/leasepool/task"
)

// fetchedPage is a refill page and the query's cursor.
type fetchedPage struct {
	after *task.Task
	tasks []*task.Task
	err   error
}

// anyDue reports whether an entry in the heap is due: a heap holding only
// later entries (delayed tasks, leases held elsewhere) must not keep a
// ready backlog in the store waiting.
func (s *scheduler) anyDue() bool {
	at, ok := s.tab.Next()
	return ok && !at.After(s.store.Now())
}

// queryDue rate-limits the empty-heap query: soon after an overflow (more
// tasks wait in the store), else once a second.
func (s *scheduler) queryDue() bool {
	since := time.Since(s.lastQuery)
	return since > time.Second || (s.overflow && since > 20*time.Millisecond)
}

// untilQueryDue is how long until queryDue holds, or, after a failed
// query, until a second has passed: a store that is down is not asked
// again fifty times a second.
func (s *scheduler) untilQueryDue() time.Duration {
	gap := time.Second
	if s.overflow && !s.queryFailed {
		gap = 20 * time.Millisecond
	}
	return max(time.Until(s.lastQuery.Add(gap))+time.Millisecond, 0)
}

// A worker among several reads the head of the ready queue (its first
// page, in priority order) whole, so that the most urgent tasks are known
// to every worker able to run them, and past the head only its share: the
// tasks it ranks first for (preempt.Peers.Share), so that W workers
// draining a long queue read each task about once between them, not W
// times. Once its share is drained and nothing of its own is due, it
// reads past the head unfiltered, to run what the shares of busy workers
// still hold (tasks it ranks after their preferred worker, so it stands
// by before claiming); when the live workers change it starts again from
// the top (shareMoved), so a dead worker's share is taken up at once.

// query loads candidates page by page until the heap is full: ready tasks
// in priority order (the head, this worker's share, then the rest), then
// upcoming ones by claim time.
func (s *scheduler) query(ctx context.Context) {
	s.lastQuery = time.Now()
	s.overflow, s.resume, s.resumeShare, s.queryFailed = false, nil, nil, false
	now := s.store.Now()
	q := task.CandidateQuery{Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: now, Ready: true, Limit: s.cfg.PageSize}
	share := s.share()
	s.queriedShare = share
	pages := 0
	if share != nil {
		pages = 1
	}
	after, end := s.readPages(ctx, q, pages, now)
	if end == endPages {
		head := after
		q.After, q.Share = head, share
		if after, end = s.readPages(ctx, q, 0, now); end == endShort {
			if s.anyDue() {
				// Its own work first: the rest is read when that is done.
				s.overflow = true
				return
			}
			q.After, q.Share = head, nil
			after, end = s.readPages(ctx, q, 0, now)
		}
	}
	switch end {
	case endFull:
		s.resume, s.resumeShare = after, q.Share
		return
	case endFailed:
		return
	}
	q = task.CandidateQuery{Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: now, Limit: s.cfg.PageSize}
	s.readPages(ctx, q, 0, now)
}

// pagesEnd is why readPages stopped.
type pagesEnd int

const (
	endShort  pagesEnd = iota // a short page: nothing more matches
	endFull                   // the heap is full (overflow)
	endPages                  // the pages asked for were read, all full
	endFailed                 // a query failed (overflow, queryFailed)
)

// readPages offers q's pages (at most maxPages, 0 for no bound) until the
// heap is full or a page is short, and returns the last task kept (where
// the next page would start) and why it stopped.
func (s *scheduler) readPages(ctx context.Context, q task.CandidateQuery, maxPages int, now time.Time) (*task.Task, pagesEnd) {
	for n := 0; maxPages == 0 || n < maxPages; n++ {
		if s.full() {
			s.overflow = true
			return q.After, endFull
		}
		page, err := s.store.Candidates(ctx, q)
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("candidate query", slog.Any("err", err))
				s.overflow = true // try again when the heap drains
				s.queryFailed = true
			}
			return q.After, endFailed
		}
		for i, t := range page {
			s.offer(t, now)
			if s.full() && i < len(page)-1 {
				page = page[:i+1] // resume after the last one kept
				break
			}
		}
		if len(page) > 0 {
			q.After = page[len(page)-1]
		}
		if len(page) < q.Limit && !s.full() {
			return q.After, endShort
		}
	}
	return q.After, endPages
}

// share is this worker's share buckets among the live workers as last
// read from the registry, nil when it is alone (or does not spread).
func (s *scheduler) share() []int {
	p := s.peers.Load()
	if p == s.shareOf {
		return s.shareBuckets
	}
	if !p.SameRanking(s.shareOf) {
		s.shareBuckets = nil
		if p.Len() > 1 && s.standBy.Spreading() {
			s.shareBuckets = p.Share(s.cfg.WorkerID, s.cfg.Kinds)
		}
	}
	s.shareOf = p
	return s.shareBuckets
}

// shareMoved reports whether this worker's share is no longer the one of
// the query whose backlog it is reading (workers came or went): the tasks
// of buckets it gained lie behind the resume point too, so the next
// refill must start from the top.
func (s *scheduler) shareMoved() bool {
	return s.resume != nil && !slices.Equal(s.share(), s.queriedShare)
}

// fetch reads the next page of ready tasks after the resume point in its
// own goroutine; onPage takes it.
func (s *scheduler) fetch(ctx context.Context) {
	s.tab.BeginPage()
	s.lastQuery = time.Now()
	q := task.CandidateQuery{
		Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: s.store.Now(), Ready: true, After: s.resume, Share: s.resumeShare, Limit: s.cfg.PageSize,
	}
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		page, err := s.store.Candidates(ctx, q)
		select {
		case s.pages <- fetchedPage{after: q.After, tasks: page, err: err}:
		case <-s.done:
		}
	}()
}

// onPage offers a fetched page's tasks, but not where an event or an
// attempt brought a newer document meanwhile (the claim table refuses the
// older), and moves the resume point. A short page ends the backlog: the
// next refill queries everything.
func (s *scheduler) onPage(p fetchedPage) {
	defer s.tab.EndPage()
	if s.resume != p.after {
		return // a full query ran meanwhile and moved the cursor
	}
	if p.err != nil {
		if !errors.Is(p.err, context.Canceled) {
			s.logger.Warn("candidate query", slog.Any("err", p.err))
			s.queryFailed = true
		}
		s.resume, s.resumeShare = nil, nil // the next refill queries everything, no sooner than queryDue
		return
	}
	now := s.store.Now()
	for i, t := range p.tasks {
		s.offer(t, now)
		if s.full() && i < len(p.tasks)-1 {
			s.resume = t
			return
		}
	}
	s.overflow = true
	if len(p.tasks) < s.cfg.PageSize {
		s.resume, s.resumeShare = nil, nil
		return
	}
	s.resume = p.tasks[len(p.tasks)-1]
}
