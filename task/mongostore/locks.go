package mongostore

// Resource locks: one document per lock key in `locks`, taken key by key
// in sorted order; when one is held elsewhere the call frees the keys it
// took. Callers giving a task.LockLine are served in line order: places in
// `lock_lines`, read before each key is taken (one query, in rank order
// down to the caller's own place). A key is stored under its name in its
// namespace (lockName), so namespaces never share a document or a line.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// lockName is a lock key in its namespace, the _id of its lock document
// and the lock_key of its line's places: the key itself in task.LockTask
// (as stored before namespaces), and otherwise the namespace, a NUL byte
// and the key (task.LockParams.Validate refuses NUL in either), so two
// namespaces never share a name.
func lockName(ns task.LockNamespace, key string) string {
	if ns == task.LockTask {
		return key
	}
	return string(ns) + "\x00" + key
}

// lockNames names keys in ns.
func lockNames(ns task.LockNamespace, keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = lockName(ns, k)
	}
	return out
}

// lockDoc is one lock in the locks collection. A missing document is a
// free lock; one whose until is not after the caller's now is free too.
type lockDoc struct {
	Name     string    `bson:"_id"` // lockName
	NS       *string   `bson:"ns"`  // nil in a document written before namespaces
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
	if err := p.Validate(); err != nil {
		return fmt.Errorf("acquire locks for %s: %w", p.Holder.TaskKey, err)
	}
	var taken, placed []string
	for _, key := range sortedKeys(p.Keys) {
		renewed, err := s.acquireInLine(ctx, key, p, &placed)
		var stopped *task.LockedError
		if errors.As(err, &stopped) && p.Line != nil && len(p.Keys) > 1 {
			// Keep the task's rank on its other keys too.
			for _, other := range sortedKeys(p.Keys) {
				if other == key {
					continue
				}
				if lerr := s.enterLine(ctx, other, p); lerr != nil {
					err = errors.Join(err, lerr)
				}
			}
		}
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
	if len(placed) > 0 {
		filter := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: placeIDs(p.Namespace, placed, p.Holder.TaskKey)}}}}
		if _, err := s.lines.DeleteMany(ctx, filter); err != nil {
			return fmt.Errorf("leave lock lines: %w", mapErr(err))
		}
	}
	return nil
}

// placeDoc is a task's place in the waiting line of a lock key.
type placeDoc struct {
	ID       string    `bson:"_id"`      // lock_key NUL task key
	LockKey  string    `bson:"lock_key"` // lockName
	TaskKey  string    `bson:"task_key"`
	Priority int64     `bson:"priority"`
	Seq      int64     `bson:"seq"`
	Until    time.Time `bson:"until"`
}

func placeIDs(ns task.LockNamespace, lockKeys []string, taskKey string) bson.A {
	ids := make(bson.A, len(lockKeys))
	for i, k := range lockKeys {
		ids[i] = lockName(ns, k) + "\x00" + taskKey
	}
	return ids
}

// acquireInLine takes key for p.Holder unless, with p.Line, an unfinished
// task's live place ranks ahead in key's line and p.Holder does not hold
// key already; then it enters p's place and fails with an Ahead
// *task.LockedError. It appends key to placed when p's own task has a
// live place in the line, to be left once every key is taken.
func (s *Store) acquireInLine(ctx context.Context, key string, p task.LockParams, placed *[]string) (bool, error) {
	if p.Line == nil {
		return s.acquire(ctx, key, p)
	}
	ahead, mine, err := s.firstAhead(ctx, key, p)
	if err != nil {
		return false, err
	}
	if mine {
		*placed = append(*placed, key)
	}
	if ahead != nil {
		var cur lockDoc
		err := s.locks.FindOne(ctx, bson.D{{Key: "_id", Value: lockName(p.Namespace, key)}}).Decode(&cur)
		if err == nil && cur.holder() == p.Holder && cur.Until.After(p.Now) {
			return true, nil // a renewal: the holder is past the line
		}
		if err := s.enterLine(ctx, key, p); err != nil {
			return false, err
		}
		if err == nil && cur.Until.After(p.Now) {
			// Held as well: the holder's lease says when to look again.
			return false, &task.LockedError{Namespace: p.Namespace, Key: key, Holder: cur.holder(), Until: cur.Until.UTC()}
		}
		return false, &task.LockedError{Namespace: p.Namespace, Key: key, Holder: task.Holder{TaskKey: ahead.TaskKey}, Until: ahead.Until.UTC(), Ahead: true}
	}
	renewed, err := s.acquire(ctx, key, p)
	var held *task.LockedError
	if errors.As(err, &held) {
		if lerr := s.enterLine(ctx, key, p); lerr != nil {
			return false, errors.Join(err, lerr)
		}
	}
	return renewed, err
}

// firstAhead returns the first live place in key's line that ranks ahead
// of p.Line and whose task is still to run, and whether p's own task has a
// live place there. Places are read in rank order up to p's own.
func (s *Store) firstAhead(ctx context.Context, key string, p task.LockParams) (*placeDoc, bool, error) {
	l := p.Line
	filter := bson.D{{Key: "lock_key", Value: lockName(p.Namespace, key)}, {Key: "until", Value: bson.D{{Key: "$gt", Value: p.Now.UTC()}}}}
	opts := options.Find().SetSort(bson.D{{Key: "priority", Value: -1}, {Key: "seq", Value: 1}}).SetLimit(50)
	cur, err := s.lines.Find(ctx, filter, opts)
	if err != nil {
		return nil, false, fmt.Errorf("lock line %s: %w", key, mapErr(err))
	}
	var places []placeDoc
	if err := cur.All(ctx, &places); err != nil {
		return nil, false, fmt.Errorf("lock line %s: %w", key, mapErr(err))
	}
	for _, pl := range places {
		if pl.TaskKey == p.Holder.TaskKey {
			return nil, true, nil
		}
		if !l.Ahead(int(pl.Priority), pl.Seq) {
			return nil, false, nil
		}
		n, err := s.tasks.CountDocuments(ctx, bson.D{{Key: "key", Value: pl.TaskKey}, {Key: "state", Value: bson.D{{Key: "$in", Value: unfinished}}}})
		if err != nil {
			return nil, false, fmt.Errorf("lock line %s: %w", key, mapErr(err))
		}
		if n > 0 {
			return &pl, false, nil
		}
	}
	return nil, false, nil
}

// enterLine enters or renews p's place in key's line, dropping places that
// have lapsed.
func (s *Store) enterLine(ctx context.Context, key string, p task.LockParams) error {
	name := lockName(p.Namespace, key)
	if _, err := s.lines.DeleteMany(ctx, bson.D{{Key: "lock_key", Value: name}, {Key: "until", Value: bson.D{{Key: "$lte", Value: p.Now.UTC()}}}}); err != nil {
		return fmt.Errorf("lock line %s: %w", key, mapErr(err))
	}
	pl := placeDoc{LockKey: name, TaskKey: p.Holder.TaskKey, Priority: int64(p.Line.Priority), Seq: p.Line.Seq, Until: p.Line.Until.UTC()}
	id := placeIDs(p.Namespace, []string{key}, pl.TaskKey)[0]
	_, err := s.lines.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{
		{Key: "lock_key", Value: pl.LockKey}, {Key: "task_key", Value: pl.TaskKey}, {Key: "priority", Value: pl.Priority},
		{Key: "seq", Value: pl.Seq}, {Key: "until", Value: pl.Until}}}}, options.UpdateOne().SetUpsert(true))
	if err != nil {
		return fmt.Errorf("lock line %s: %w", key, mapErr(err))
	}
	return nil
}

// acquire takes one key. renewed reports that p.Holder held it already.
func (s *Store) acquire(ctx context.Context, key string, p task.LockParams) (renewed bool, err error) {
	name := lockName(p.Namespace, key)
	filter := bson.D{
		{Key: "_id", Value: name},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: "until", Value: bson.D{{Key: "$lte", Value: p.Now.UTC()}}}},
			holderFilter(p.Holder),
		}},
	}
	update := bson.D{{Key: "$set", Value: bson.D{
		{Key: "ns", Value: string(p.Namespace)},
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
		err = s.locks.FindOne(ctx, bson.D{{Key: "_id", Value: name}}).Decode(&cur)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("lock %s: %w", key, mapErr(err))
		}
		if cur.Until.After(p.Now) && cur.holder() != p.Holder {
			return false, &task.LockedError{Namespace: p.Namespace, Key: key, Holder: cur.holder(), Until: cur.Until.UTC()}
		}
	}
	return false, fmt.Errorf("lock %s: %w: contended", key, task.ErrConflict)
}

// ReleaseLocks implements task.Store: it enters p.Heirs' places, then
// deletes the keys still held by p.Holder.
func (s *Store) ReleaseLocks(ctx context.Context, p task.LockParams) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("release locks for %s: %w", p.Holder.TaskKey, err)
	}
	if len(p.Keys) == 0 {
		return nil
	}
	for _, h := range p.Heirs {
		heir := task.LockParams{Namespace: p.Namespace, Holder: task.Holder{TaskKey: h.TaskKey}, Now: p.Now, Line: &h.LockLine}
		if err := s.enterLine(ctx, h.LockKey, heir); err != nil {
			return fmt.Errorf("release locks: %w", err)
		}
	}
	filter := append(bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: lockNames(p.Namespace, sortedKeys(p.Keys))}}}}, holderFilter(p.Holder)...)
	if _, err := s.locks.DeleteMany(ctx, filter); err != nil {
		return fmt.Errorf("release locks: %w", mapErr(err))
	}
	return nil
}

// legacyLockPrefixes start the keys leasepool held among tasks' keys
// before namespaces, and the namespace each moves to under which key.
var legacyLockPrefixes = []struct {
	prefix string
	ns     task.LockNamespace
	strip  bool // the key in ns is the rest after prefix
}{
	{"rate:", task.LockRate, true},
	{"leasepool.", task.LockSingleton, false},
	{"mqtt-broker:", task.LockSingleton, false},
}

// upgradeLockNamespaces moves the locks leasepool held among tasks' keys,
// written before namespaces (no ns field), to their namespaces, holder
// and lease unchanged: rate-limit slots (rate:BUCKET#i) to task.LockRate
// as BUCKET#i, the singletons' leases (leasepool.…, mqtt-broker:…) to
// task.LockSingleton under the same key. Every write since namespaces sets
// ns, so a task's own key that starts so is never moved, and the upgrade
// may run at every Open. A lock already held under the new name is kept
// and the legacy one dropped.
func (s *Store) upgradeLockNamespaces(ctx context.Context) error {
	for _, l := range legacyLockPrefixes {
		filter := bson.D{
			{Key: "_id", Value: bson.D{{Key: "$regex", Value: "^" + regexp.QuoteMeta(l.prefix)}}},
			{Key: "ns", Value: bson.D{{Key: "$exists", Value: false}}},
		}
		cur, err := s.locks.Find(ctx, filter)
		if err != nil {
			return fmt.Errorf("mongostore: move locks to namespaces: %w", mapErr(err))
		}
		var old []lockDoc
		if err := cur.All(ctx, &old); err != nil {
			return fmt.Errorf("mongostore: move locks to namespaces: %w", mapErr(err))
		}
		for _, d := range old {
			key := d.Name
			if l.strip {
				key = strings.TrimPrefix(key, l.prefix)
			}
			moved := d
			moved.Name, moved.NS = lockName(l.ns, key), ptr(string(l.ns))
			if _, err := s.locks.InsertOne(ctx, moved); err != nil && !mongo.IsDuplicateKeyError(err) {
				return fmt.Errorf("mongostore: move lock %s to namespace %s: %w", d.Name, l.ns, mapErr(err))
			}
			del := bson.D{{Key: "_id", Value: d.Name}, {Key: "ns", Value: bson.D{{Key: "$exists", Value: false}}}}
			if _, err := s.locks.DeleteOne(ctx, del); err != nil {
				return fmt.Errorf("mongostore: move lock %s to namespace %s: %w", d.Name, l.ns, mapErr(err))
			}
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
