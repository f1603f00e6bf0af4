package task

import (
	"context"
	"sync"
)

// PublishOutcome is what PublishMany did with one item: Result and the
// task as stored, or Err (wrapping ErrInvalid for a refused item, naming
// the field; a store error otherwise), with nothing written for it.
type PublishOutcome struct {
	Result PublishResult
	Task   *Task
	Err    error
}

// publishManyWorkers is how many publishes PublishMany has in flight. The
// embedded store commits the writes queued at once in one transaction (up
// to 128), so enough callers must queue to fill a commit while the last
// one runs; MongoDB gets as many concurrent upserts, within the driver's
// connection pool.
const publishManyWorkers = 256

// PublishMany publishes every item of ps as Publish does, and answers each
// in order: outcomes[i] is ps[i]'s. A refused item (invalid, wrapping
// ErrInvalid) or one that met a store error never stops the others.
//
// Items of one key are published one after another in their order, as
// separate Publish calls would be: the first inserts it, the later ones
// find it (Existing) without another write unless they ask to rerun or
// debounce.
// Items of different keys are published concurrently, so that the
// embedded store commits many in one transaction. The error is ctx's when
// it ended before every item was tried; the items not tried carry it too.
func PublishMany(ctx context.Context, s Store, ps []PublishParams) ([]PublishOutcome, error) {
	out := make([]PublishOutcome, len(ps))
	// Each key's items, in order, as one job: one key never has two
	// publishes in flight, so which of its items inserts is decided by
	// the order given, not by a race.
	groups := make(map[string][]int, len(ps))
	var order []string
	for i, p := range ps {
		if _, ok := groups[p.Key]; !ok {
			order = append(order, p.Key)
		}
		groups[p.Key] = append(groups[p.Key], i)
	}
	jobs := make(chan []int)
	var wg sync.WaitGroup
	for range min(publishManyWorkers, len(order)) {
		wg.Go(func() {
			for idx := range jobs {
				publishGroup(ctx, s, ps, idx, out)
			}
		})
	}
	var err error
feed:
	for _, k := range order {
		select {
		case jobs <- groups[k]:
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err != nil {
		for i := range out {
			if out[i].Result == "" && out[i].Err == nil {
				out[i].Err = err
			}
		}
	}
	return out, err
}

// publishGroup publishes the items idx of ps (one key's, in order) into
// out. A later item that is valid and does not ask to rerun finds the task
// an earlier one of the batch stored: it is answered Existing without a
// store round trip, as Publish would answer it.
func publishGroup(ctx context.Context, s Store, ps []PublishParams, idx []int, out []PublishOutcome) {
	internal := isInternalWrite(ctx)
	var last *Task
	for _, i := range idx {
		p := ps[i]
		if last != nil && !p.Rerun && p.Debounce == 0 {
			if err := p.validate(internal); err != nil {
				out[i] = PublishOutcome{Err: err}
			} else {
				out[i] = PublishOutcome{Result: Existing, Task: last}
			}
			continue
		}
		if err := ctx.Err(); err != nil {
			out[i] = PublishOutcome{Err: err}
			continue
		}
		t, res, err := Publish(ctx, s, p)
		out[i] = PublishOutcome{Result: res, Task: t, Err: err}
		if err == nil {
			last = t
		}
	}
}
