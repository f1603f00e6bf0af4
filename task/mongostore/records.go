package mongostore

// Shared records (task.RecordStore): one document per kind and id in
// `records`, a write ignored when a later one is stored.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// RecordsCollection holds task.Record documents: {_id: {kind, id}, kind,
// id, value, at}.
const RecordsCollection = "records"

type recordDoc struct {
	Kind  string        `bson:"kind"`
	ID    string        `bson:"id"`
	Value bson.RawValue `bson:"value"`
	At    time.Time     `bson:"at"`
}

func recordID(kind, id string) bson.D {
	return bson.D{{Key: "kind", Value: kind}, {Key: "id", Value: id}}
}

// PutRecord implements task.RecordStore: an upsert guarded by at <= r.At;
// when a later record is there the upsert's insert fails on _id and the
// put is ignored.
func (s *Store) PutRecord(ctx context.Context, r task.Record) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := task.ValidateName("kind", r.Kind); err != nil {
		return err
	}
	if err := task.ValidateName("id", r.ID); err != nil {
		return err
	}
	if len(r.Value) > 0 && !json.Valid(r.Value) {
		return fmt.Errorf("%w: value: is not valid JSON", task.ErrInvalid)
	}
	value, err := jsonToBSON(r.Value)
	if err != nil {
		return fmt.Errorf("%w: value: %w", task.ErrInvalid, err)
	}
	coll := s.db.Collection(RecordsCollection)
	_, err = coll.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: recordID(r.Kind, r.ID)}, {Key: "at", Value: bson.D{{Key: "$lte", Value: r.At.UTC()}}}},
		bson.D{{Key: "$set", Value: bson.D{
			{Key: "kind", Value: r.Kind}, {Key: "id", Value: r.ID},
			{Key: "value", Value: value}, {Key: "at", Value: r.At.UTC()},
		}}},
		options.UpdateOne().SetUpsert(true))
	if mongo.IsDuplicateKeyError(err) {
		return nil // a later record is stored
	}
	if err != nil {
		return fmt.Errorf("put record %s/%s: %w", r.Kind, r.ID, mapErr(err))
	}
	return nil
}

// Records implements task.RecordStore.
func (s *Store) Records(ctx context.Context, kind string) ([]task.Record, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	cur, err := s.db.Collection(RecordsCollection).Find(ctx, bson.D{{Key: "kind", Value: kind}},
		options.Find().SetSort(bson.D{{Key: "id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("records %s: %w", kind, mapErr(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var out []task.Record
	for cur.Next(ctx) {
		var d recordDoc
		if err := cur.Decode(&d); err != nil {
			return nil, fmt.Errorf("records %s: %w", kind, err)
		}
		v, err := bsonToJSON(d.Value)
		if err != nil {
			return nil, fmt.Errorf("records %s/%s: %w", kind, d.ID, err)
		}
		out = append(out, task.Record{Kind: d.Kind, ID: d.ID, Value: v, At: utc(d.At)})
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("records %s: %w", kind, mapErr(err))
	}
	return out, nil
}
