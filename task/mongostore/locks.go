package mongostore

// Resource locks: one document per lock key in `locks`, taken key by key
// in sorted order; when one is held elsewhere the call frees the keys it
// took.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// lockDoc is one lock in the locks collection. A missing document is a
// free lock; one whose until is not after the caller's now is free too.
type lockDoc struct {
	Key      string    `bson:"_id"`
	TaskKey  string    `bson:"task_key"`
	WorkerID string    `bson:"worker_id"`
	Attempt  int64     `bson:"attempt"`
	Instance string    `bson:"instance"`
	Until    time.Time `bson:"until"`
}

func (d lockDoc) holder() task.Holder {
	return task.Holder{TaskKey: d.TaskKey, WorkerID: d.WorkerID, Attempt: int(d.Attempt), Instance: d.Instance}
}

func holderFilter(h task.Holder) bson.D {
	return bson.D{{Key: "task_key", Value: h.TaskKey}, {Key: "worker_id", Value: h.WorkerID}, {Key: "attempt", Value: int64(h.Attempt)}, {Key: "instance", Value: h.Instance}}
}

// sortedKeys returns keys sorted and without duplicates, so that callers
// taking overlapping sets always take them in one order.
func sortedKeys(keys []string) []string {
	k := slices.Clone(keys)
	slices.Sort(k)
	return slices.Compact(k)
}

// AcquireLocks implements task.Store: per key, an upsert guarded by (free
// or expired or same holder), in sorted key order; on failure the keys this
// call newly took are released again.
func (s *Store) AcquireLocks(ctx context.Context, p task.LockParams) error {
	if err := s.check(); err != nil {
		return err
	}
	var taken []string
	for _, key := range sortedKeys(p.Keys) {
		renewed, err := s.acquire(ctx, key, p)
		if err != nil {
			if len(taken) > 0 {
				rel := p
				rel.Keys = taken
				if rerr := s.ReleaseLocks(context.WithoutCancel(ctx), rel); rerr != nil {
					err = errors.Join(err, fmt.Errorf("release after failed acquire: %w", rerr))
				}
			}
			return err
		}
		if !renewed {
			taken = append(taken, key)
		}
	}
	return nil
}

// acquire takes one key. renewed reports that p.Holder held it already.
func (s *Store) acquire(ctx context.Context, key string, p task.LockParams) (renewed bool, err error) {
	filter := bson.D{
		{Key: "_id", Value: key},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: "until", Value: bson.D{{Key: "$lte", Value: p.Now.UTC()}}}},
			holderFilter(p.Holder),
		}},
	}
	update := bson.D{{Key: "$set", Value: bson.D{
		{Key: "task_key", Value: p.Holder.TaskKey},
		{Key: "worker_id", Value: p.Holder.WorkerID},
		{Key: "attempt", Value: int64(p.Holder.Attempt)},
		{Key: "instance", Value: p.Holder.Instance},
		{Key: "until", Value: p.Until.UTC()},
	}}}
	opts := options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.Before)
	for range 5 {
		var before lockDoc
		err := s.locks.FindOneAndUpdate(ctx, filter, update, opts).Decode(&before)
		switch {
		case err == nil:
			return before.holder() == p.Holder, nil
		case errors.Is(err, mongo.ErrNoDocuments):
			return false, nil // inserted
		case !mongo.IsDuplicateKeyError(err):
			return false, fmt.Errorf("lock %s: %w", key, mapErr(err))
		}
		// Held by someone else: say by whom, unless it was freed meanwhile.
		var cur lockDoc
		err = s.locks.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&cur)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("lock %s: %w", key, mapErr(err))
		}
		if cur.Until.After(p.Now) && cur.holder() != p.Holder {
			return false, &task.LockedError{Key: key, Holder: cur.holder(), Until: cur.Until.UTC()}
		}
	}
	return false, fmt.Errorf("lock %s: %w: contended", key, task.ErrConflict)
}

// ReleaseLocks implements task.Store: it deletes the keys still held by
// p.Holder.
func (s *Store) ReleaseLocks(ctx context.Context, p task.LockParams) error {
	if err := s.check(); err != nil {
		return err
	}
	if len(p.Keys) == 0 {
		return nil
	}
	filter := append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: sortedKeys(p.Keys)}}}}, holderFilter(p.Holder)...)
	if _, err := s.locks.DeleteMany(ctx, filter); err != nil {
		return fmt.Errorf("release locks: %w", mapErr(err))
	}
	return nil
}
