package mongostore

// The admin queries: List with its filters and seq paging, and Stats.

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// List implements task.Store. Everything but q.Text and the reserved keys
// is filtered by the server on the seq-ordered indexes; those two are
// checked here while reading the cursor in batches, because the payload is
// stored as BSON (so no server-side substring of its JSON) and excluding a
// key range in the query would steer the planner off seq order.
func (s *Store) List(ctx context.Context, q task.ListQuery) ([]*task.Task, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := q.Validate(); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	order := 1
	if q.Desc {
		order = -1
	}
	opts := options.Find().SetSort(bson.D{{Key: "seq", Value: order}})
	if q.Limit > 0 {
		// A few more than the page, so that a skipped reserved document
		// rarely costs a second batch.
		opts.SetBatchSize(int32(min(q.Limit+4, 1000)))
		if q.Text == "" {
			opts.SetLimit(int64(q.Limit + 4))
		}
	}
	cur, err := s.tasks.Find(ctx, listFilter(q), opts)
	if err != nil {
		return nil, fmt.Errorf("list: %w", mapErr(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var out []*task.Task
	for (q.Limit <= 0 || len(out) < q.Limit) && cur.Next(ctx) {
		t, err := decodeTask(cur.Current)
		if err != nil {
			return nil, fmt.Errorf("list: %w", err)
		}
		if task.Reserved(t.Key) != q.Reserved || (q.Text != "" && !task.PayloadContains(t.Payload, q.Text)) {
			continue
		}
		out = append(out, t)
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("list: %w", mapErr(err))
	}
	return out, nil
}

func listFilter(q task.ListQuery) bson.D {
	f := bson.D{}
	if q.Reserved && q.KeyPrefix == "" { // a prefix filters key below; List checks the rest
		lo, hi := task.ReservedRange()
		f = append(f, bson.E{Key: "key", Value: bson.D{{Key: "$gte", Value: lo}, {Key: "$lt", Value: hi}}})
	}
	if q.State != "" {
		f = append(f, bson.E{Key: "state", Value: string(q.State)})
	}
	if q.Kind != "" {
		f = append(f, bson.E{Key: "kind", Value: q.Kind})
	}
	seq := bson.D{{Key: "$gt", Value: q.AfterSeq}}
	if q.BeforeSeq > 0 {
		seq = append(seq, bson.E{Key: "$lt", Value: q.BeforeSeq})
	}
	f = append(f, bson.E{Key: "seq", Value: seq})
	if q.KeyPrefix != "" {
		f = append(f, bson.E{Key: "key", Value: bson.Regex{Pattern: "^" + regexp.QuoteMeta(q.KeyPrefix)}})
	}
	if q.WorkerID != "" {
		f = append(f, bson.E{Key: "workers.worker_id", Value: q.WorkerID})
	}
	f = appendRange(f, "created_at", q.CreatedAfter, q.CreatedBefore)
	return appendRange(f, "updated_at", q.UpdatedAfter, q.UpdatedBefore)
}

// appendRange bounds field strictly by after and before (zero: open), in
// whole milliseconds as the BSON dates are stored.
func appendRange(f bson.D, field string, after, before time.Time) bson.D {
	var r bson.D
	if !after.IsZero() {
		r = append(r, bson.E{Key: "$gt", Value: bson.DateTime(after.UnixMilli())})
	}
	if !before.IsZero() {
		r = append(r, bson.E{Key: "$lt", Value: bson.DateTime(before.UnixMilli())})
	}
	if r == nil {
		return f
	}
	return append(f, bson.E{Key: field, Value: r})
}

// Stats implements task.Store: one $group over state and kind (served by
// the kind_state_seq index on a real server), minus the reserved
// documents, and the oldest ready pending task on state_next_claim_at.
func (s *Store) Stats(ctx context.Context) (task.Stats, error) {
	if err := s.check(); err != nil {
		return task.Stats{}, err
	}
	cur, err := s.tasks.Aggregate(ctx, bson.A{
		bson.D{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "state", Value: "$state"}, {Key: "kind", Value: "$kind"}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
		}}},
	})
	if err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", mapErr(err))
	}
	var groups []struct {
		ID struct {
			State string `bson:"state"`
			Kind  string `bson:"kind"`
		} `bson:"_id"`
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", mapErr(err))
	}
	lo, hi := task.ReservedRange()
	reserved, err := s.find(ctx, bson.D{{Key: "key", Value: bson.D{{Key: "$gte", Value: lo}, {Key: "$lt", Value: hi}}}}, options.Find())
	if err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", err)
	}
	var st task.Stats
	for _, g := range groups {
		c := task.StateCount{State: task.State(g.ID.State), Kind: g.ID.Kind, N: g.N}
		for _, r := range reserved {
			if r.State == c.State && r.Kind == c.Kind {
				c.N--
			}
		}
		if c.N > 0 {
			st.Counts = append(st.Counts, c)
		}
	}
	st.OldestReadyAt, err = s.oldestReady(ctx)
	if err != nil {
		return task.Stats{}, fmt.Errorf("stats: %w", err)
	}
	return st, nil
}

// oldestReady is the next_claim_at of the longest-waiting ready pending
// task, or zero.
func (s *Store) oldestReady(ctx context.Context) (time.Time, error) {
	filter := bson.D{
		{Key: "state", Value: string(task.StatePending)},
		{Key: "next_claim_at", Value: bson.D{{Key: "$lte", Value: s.Now().UTC()}}},
	}
	// A few, in case reserved documents come first.
	ts, err := s.find(ctx, filter, options.Find().SetSort(bson.D{{Key: "next_claim_at", Value: 1}}).SetLimit(4))
	if err != nil {
		return time.Time{}, err
	}
	for _, t := range ts {
		if !task.Reserved(t.Key) {
			return t.NextClaimAt, nil
		}
	}
	return time.Time{}, nil
}
