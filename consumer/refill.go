package consumer

// refill.go is how the scheduler fills its heap from the store: full
// queries page by page, and the next page of a long backlog read aside
// while the scheduler goes on dispatching.

import (
	"context"
	"errors"
	"log/slog"
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
	at, ok := s.heap.Next()
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

// query loads candidates page by page: ready tasks in priority order, then
// upcoming ones by claim time, until the heap is full.
func (s *scheduler) query(ctx context.Context) { s.queryFrom(ctx, nil) }

// queryFrom is query continuing the ready tasks after resume (when the last
// query filled the heap there), so that a worker draining a long queue does
// not re-read what it already holds.
func (s *scheduler) queryFrom(ctx context.Context, resume *task.Task) {
	s.lastQuery = time.Now()
	s.overflow = false
	s.resume = nil
	s.queryFailed = false
	now := s.store.Now()
	for _, ready := range []bool{true, false} {
		after := resume
		resume = nil
		for {
			if s.full() {
				s.overflow = true
				if ready {
					s.resume = after
				}
				return
			}
			page, err := s.store.Candidates(ctx, task.CandidateQuery{
				Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: now, Ready: ready, After: after, Limit: s.cfg.PageSize,
			})
			if err != nil {
				if ctx.Err() == nil {
					s.logger.Warn("candidate query", slog.Any("err", err))
					s.overflow = true // try again when the heap drains
					s.queryFailed = true
				}
				return
			}
			for i, t := range page {
				s.offer(t, now)
				if s.full() && i < len(page)-1 {
					page = page[:i+1] // resume after the last one kept
					break
				}
			}
			if len(page) > 0 {
				after = page[len(page)-1]
			}
			if len(page) < s.cfg.PageSize && !s.full() {
				break
			}
		}
	}
}

// fetch reads the next page of ready tasks after the resume point in its
// own goroutine; onPage takes it.
func (s *scheduler) fetch(ctx context.Context) {
	s.tab.beginPage()
	s.lastQuery = time.Now()
	q := task.CandidateQuery{
		Kinds: s.cfg.Kinds, WorkerID: s.cfg.WorkerID, Now: s.store.Now(), Ready: true, After: s.resume, Limit: s.cfg.PageSize,
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
	defer s.tab.endPage()
	if s.resume != p.after {
		return // a full query ran meanwhile and moved the cursor
	}
	if p.err != nil {
		if !errors.Is(p.err, context.Canceled) {
			s.logger.Warn("candidate query", slog.Any("err", p.err))
			s.queryFailed = true
		}
		s.resume = nil // the next refill queries everything, no sooner than queryDue
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
		s.resume = nil
		return
	}
	s.resume = p.tasks[len(p.tasks)-1]
}
