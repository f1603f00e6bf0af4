package mongostore

import (
	"context"
	"fmt"

	"github.com/leasepool/leasepool/task"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Candidates implements task.Store.
func (s *Store) Candidates(ctx context.Context, q task.CandidateQuery) ([]*task.Task, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if q.Limit <= 0 {
		return nil, fmt.Errorf("%w: candidates: Limit (%d) must be positive", task.ErrInvalid, q.Limit)
	}
	and := bson.A{bson.D{{Key: "state", Value: bson.D{{Key: "$in", Value: unfinished}}}}}
	if len(q.Kinds) > 0 {
		and = append(and, bson.D{{Key: "kind", Value: bson.D{{Key: "$in", Value: q.Kinds}}}})
	}
	if q.WorkerID != "" {
		and = append(and, bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "specific_worker_ids", Value: bson.D{{Key: "$exists", Value: false}}}},
			bson.D{{Key: "specific_worker_ids", Value: bson.D{{Key: "$size", Value: 0}}}},
			bson.D{{Key: "specific_worker_ids", Value: q.WorkerID}},
		}}})
	}
	if q.Group != "" {
		and = append(and, bson.D{{Key: "group", Value: q.Group}})
	}
	if len(q.Share) > 0 {
		and = append(and, bson.D{{Key: "$or", Value: bson.A{
			bson.D{{Key: "specific_worker_ids.0", Value: bson.D{{Key: "$exists", Value: true}}}},
			bson.D{{Key: "bucket", Value: bson.D{{Key: "$in", Value: q.Share}}}},
		}}})
	}
	sort := bson.D{{Key: "next_claim_at", Value: 1}, {Key: "seq", Value: 1}}
	if q.Ready {
		and = append(and, bson.D{{Key: "next_claim_at", Value: bson.D{{Key: "$lte", Value: q.Now.UTC()}}}})
		sort = append(bson.D{{Key: "priority", Value: -1}}, sort...)
	} else {
		and = append(and, bson.D{{Key: "next_claim_at", Value: bson.D{{Key: "$gt", Value: q.Now.UTC()}}}})
	}
	if a := q.After; a != nil {
		at := a.NextClaimAt.UTC()
		after := bson.A{
			bson.D{{Key: "next_claim_at", Value: bson.D{{Key: "$gt", Value: at}}}},
			bson.D{{Key: "next_claim_at", Value: at}, {Key: "seq", Value: bson.D{{Key: "$gt", Value: a.Seq}}}},
		}
		if q.Ready {
			prio := int64(a.Priority)
			after = bson.A{
				bson.D{{Key: "priority", Value: bson.D{{Key: "$lt", Value: prio}}}},
				bson.D{{Key: "priority", Value: prio}, {Key: "$or", Value: after}},
			}
		}
		and = append(and, bson.D{{Key: "$or", Value: after}})
	}
	out, err := s.find(ctx, bson.D{{Key: "$and", Value: and}}, options.Find().SetSort(sort).SetLimit(int64(q.Limit)))
	if err != nil {
		return nil, fmt.Errorf("candidates: %w", err)
	}
	return out, nil
}

func (s *Store) find(ctx context.Context, filter any, opts *options.FindOptionsBuilder) ([]*task.Task, error) {
	cur, err := s.tasks.Find(ctx, filter, opts)
	if err != nil {
		return nil, mapErr(err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var out []*task.Task
	for cur.Next(ctx) {
		t, err := decodeTask(cur.Current)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if err := cur.Err(); err != nil {
		return nil, mapErr(err)
	}
	return out, nil
}
