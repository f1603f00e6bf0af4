package flow

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"sync"

	"github.com/leasepool/leasepool/task"
)

// The calls of one process on one flow at the same time are applied
// together: the first caller reads the flow, applies every fn waiting in
// turn, and writes once (a group commit of the flow's transitions), so
// the outcomes of a fan-out's steps recorded at once do not each lose the
// compare-and-set to the others and read and write the flow again.
// Each caller gets the flow as written, with only its own fn's tasks to
// publish and stop.
func modify(ctx context.Context, s task.Store, key string, fn func(f *Flow) error) (*Flow, error) {
	q := queueFor(s, key)
	r := &modReq{ctx: ctx, fn: fn}
	q.mu.Lock()
	q.pending = append(q.pending, r)
	for q.running && !r.answered {
		q.cond.Wait()
	}
	if r.answered {
		q.mu.Unlock()
		return r.f, r.err
	}
	// Lead one batch, the calls waiting now (this one among them), then
	// hand the queue to the next caller: a caller waits for one batch
	// before its own at most, and leads none but its own.
	q.running = true
	batch := q.pending
	q.pending = nil
	q.mu.Unlock()
	modifyBatch(s, key, batch)
	q.mu.Lock()
	for _, b := range batch {
		b.answered = true
	}
	q.running = false
	q.cond.Broadcast()
	q.mu.Unlock()
	releaseQueue(s, key, q)
	return r.f, r.err
}

// modReq is one modify call waiting in its flow's queue.
type modReq struct {
	ctx context.Context
	fn  func(f *Flow) error
	// The answer: the flow and fn's error, and the started runs and
	// stopped tasks of f that are fn's.
	f        *Flow
	err      error
	changed  bool
	started  [2]int
	stops    [2]int
	answered bool
}

// modQueue is the modify calls of one process on one flow.
type modQueue struct {
	mu      sync.Mutex
	cond    *sync.Cond
	pending []*modReq
	running bool
}

var modQueues = struct {
	sync.Mutex
	m map[queueKey]*modQueue
}{m: map[queueKey]*modQueue{}}

type queueKey struct {
	store uintptr
	key   string
}

// storeID tells stores apart for the queues: a pointer's address (stores
// are pointers; anything else gets a queue of its own per call).
func storeID(s task.Store) uintptr {
	v := reflect.ValueOf(s)
	if v.Kind() == reflect.Pointer {
		return v.Pointer()
	}
	return 0
}

func queueFor(s task.Store, key string) *modQueue {
	id := storeID(s)
	if id == 0 {
		q := &modQueue{}
		q.cond = sync.NewCond(&q.mu)
		return q
	}
	modQueues.Lock()
	defer modQueues.Unlock()
	k := queueKey{id, key}
	q := modQueues.m[k]
	if q == nil {
		q = &modQueue{}
		q.cond = sync.NewCond(&q.mu)
		modQueues.m[k] = q
	}
	return q
}

// releaseQueue drops q once idle. A call that found q just before joins
// it anyway and leads it; a second queue for the flow meanwhile only
// means compare-and-set between the two.
func releaseQueue(s task.Store, key string, q *modQueue) {
	id := storeID(s)
	if id == 0 {
		return
	}
	modQueues.Lock()
	defer modQueues.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.running && len(q.pending) == 0 {
		delete(modQueues.m, queueKey{id, key})
	}
}

// modifyBatch applies the fns of batch to the flow of key and writes the
// flow once, again from a fresh read after a lost compare-and-set.
func modifyBatch(s task.Store, key string, batch []*modReq) {
	ctx := batch[0].ctx
	if len(batch) > 1 {
		// Shared by the calls: no one caller's end stops the others'.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
		defer cancel()
	}
	answer := func(f *Flow, err error) {
		for _, r := range batch {
			r.f, r.err = f, err
		}
	}
	for {
		if err := ctx.Err(); err != nil {
			answer(nil, err)
			return
		}
		d, err := load(ctx, s, key)
		if err != nil {
			answer(nil, err)
			return
		}
		before, err := decode(ctx, s, d)
		if errors.Is(err, errPartGone) {
			continue
		}
		if err != nil {
			answer(nil, err)
			return
		}
		f := before
		if before.shared {
			f = before.clone() // before stays as read: the parts a write changes are told from it
		}
		changed := false
		for _, r := range batch {
			r.err, r.changed = nil, false
			r.started = [2]int{len(f.started), len(f.started)}
			r.stops = [2]int{len(f.stops), len(f.stops)}
			if err := r.ctx.Err(); err != nil && len(batch) > 1 {
				r.err = err
				continue
			}
			r.started[0], r.stops[0] = len(f.started), len(f.stops)
			err := r.fn(f)
			r.started[1], r.stops[1] = len(f.started), len(f.stops)
			switch {
			case errors.Is(err, errUnchanged):
			case err != nil:
				r.err = err
			default:
				r.changed, changed = true, true
			}
		}
		if changed {
			f.UpdatedAt = s.Now().UTC()
			f.summarise()
			var stored task.Document
			if f.split != nil {
				stored, err = putSplit(ctx, s, before, f)
			} else {
				var b []byte
				if b, err = json.Marshal(f); err == nil {
					stored, err = s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: key, Version: d.Version, Value: b})
				}
			}
			if errors.Is(err, task.ErrConflict) {
				continue
			}
			if err != nil {
				// Nothing stored: no caller has tasks to publish or stop.
				f.started, f.stops = nil, nil
				for _, r := range batch {
					r.started, r.stops = [2]int{}, [2]int{}
					if r.changed {
						r.err = err
					}
				}
			} else {
				f.Version = stored.Version
			}
		}
		if f.split != nil && changed && f.Version != d.Version {
			// Kept as written, shared: the callers only read it.
			f.shared = true
			cachePut(f)
		}
		for _, r := range batch {
			v := *f
			v.started = f.started[r.started[0]:r.started[1]:r.started[1]]
			v.stops = f.stops[r.stops[0]:r.stops[1]:r.stops[1]]
			if len(batch) == 1 {
				v = *f
			}
			r.f = &v
		}
		return
	}
}
