package mongostore

// Deletes: finished tasks past their retention.

import (
	"context"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// DeleteFinished deletes old finished tasks; see task.Store. It finds up to
// p.Limit ids, then deletes those ids under the same filter again, so a
// task rerun (or written at all) in between is left alone.
func (s *Store) DeleteFinished(ctx context.Context, p task.DeleteParams) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if err := p.Validate(); err != nil {
		return 0, err
	}
	filter := bson.D{{Key: "state", Value: string(p.State)}, {Key: "updated_at", Value: bson.D{{Key: "$lt", Value: p.Before.UTC()}}}}
	cur, err := s.tasks.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(p.Limit)))
	if err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, mapErr(err))
	}
	var ids []struct {
		ID bson.ObjectID `bson:"_id"`
	}
	if err := cur.All(ctx, &ids); err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, mapErr(err))
	}
	if len(ids) == 0 {
		return 0, nil
	}
	in := make(bson.A, len(ids))
	for i, d := range ids {
		in[i] = d.ID
	}
	res, err := s.tasks.DeleteMany(ctx, append(filter, bson.E{Key: "_id", Value: bson.D{{Key: "$in", Value: in}}}))
	if err != nil {
		return 0, fmt.Errorf("delete %s tasks: %w", p.State, mapErr(err))
	}
	return int(res.DeletedCount), nil
}
