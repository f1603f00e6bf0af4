package mongostore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leasepool/leasepool/task"
)

// leaseReads shares reads of every lock of a namespace between the
// LockHolder calls of one process: the singletons standing by in a worker
// look at their leases at the same instants, and one read answers them
// all.
type leaseReads struct {
	mu   sync.Mutex
	last map[task.LockNamespace]*leaseRead
}

// leaseRead is one read of every lock of a namespace.
type leaseRead struct {
	started time.Time     // local clock, before the read was sent
	done    chan struct{} // closed once locks and err are set
	locks   map[string]lockDoc
	err     error
}

// LockHolder returns who holds key in ns and until when; a zero until
// when no one does. It may answer from a read of every lock of ns that
// this Store sent at or after since (local clock), made for another call,
// so that the leases a process stands by on cost one round trip between
// them; a read sent after since sees every change made before it. Keys
// in task.LockTask, which may be many, are read one at a time.
//
// A lease's standby looks with it before trying to take the lease: while
// the lease stays held, a look costs at most one round trip instead of
// AcquireLocks' two (its take, then the read saying by whom).
func (s *Store) LockHolder(ctx context.Context, ns task.LockNamespace, key string, since time.Time) (task.Holder, time.Time, error) {
	if err := s.check(); err != nil {
		return task.Holder{}, time.Time{}, err
	}
	if ns == task.LockTask {
		var cur lockDoc
		err := s.locks.FindOne(ctx, bson.D{{Key: "_id", Value: lockName(ns, key)}}).Decode(&cur)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			return task.Holder{}, time.Time{}, nil
		case err != nil:
			return task.Holder{}, time.Time{}, fmt.Errorf("lock %s: %w", key, mapErr(err))
		}
		return cur.holder(), cur.Until.UTC(), nil
	}
	r := s.leases.read(ctx, ns, since, s.readLocks)
	select {
	case <-r.done:
	case <-ctx.Done():
		return task.Holder{}, time.Time{}, fmt.Errorf("lock %s: %w", key, ctx.Err())
	}
	if r.err != nil {
		return task.Holder{}, time.Time{}, fmt.Errorf("lock %s: %w", key, r.err)
	}
	cur, ok := r.locks[lockName(ns, key)]
	if !ok {
		return task.Holder{}, time.Time{}, nil
	}
	return cur.holder(), cur.Until.UTC(), nil
}

// read returns a read of every lock of ns sent at or after since: the
// last one, done or under way, when it qualifies and did not fail, else a
// new one that it sends itself with ctx.
func (l *leaseReads) read(ctx context.Context, ns task.LockNamespace, since time.Time,
	send func(context.Context, task.LockNamespace) (map[string]lockDoc, error)) *leaseRead {
	l.mu.Lock()
	if r := l.last[ns]; r != nil && !r.started.Before(since) && !r.failed() {
		l.mu.Unlock()
		return r
	}
	r := &leaseRead{started: time.Now(), done: make(chan struct{})}
	if l.last == nil {
		l.last = map[task.LockNamespace]*leaseRead{}
	}
	l.last[ns] = r
	l.mu.Unlock()
	r.locks, r.err = send(ctx, ns)
	close(r.done)
	return r
}

// failed reports whether r is done and failed.
func (r *leaseRead) failed() bool {
	select {
	case <-r.done:
		return r.err != nil
	default:
		return false
	}
}

// readLocks reads every lock of ns (not task.LockTask) by its names'
// prefix, on the _id index.
func (s *Store) readLocks(ctx context.Context, ns task.LockNamespace) (map[string]lockDoc, error) {
	prefix := lockName(ns, "")
	filter := bson.D{{Key: "_id", Value: bson.D{{Key: "$gte", Value: prefix}, {Key: "$lt", Value: prefix[:len(prefix)-1] + "\x01"}}}}
	cur, err := s.locks.Find(ctx, filter)
	if err != nil {
		return nil, mapErr(err)
	}
	var docs []lockDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, mapErr(err)
	}
	out := make(map[string]lockDoc, len(docs))
	for _, d := range docs {
		out[d.Name] = d
	}
	return out, nil
}
