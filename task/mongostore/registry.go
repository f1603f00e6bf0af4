package mongostore

// The worker registry: one document per worker id in `workers`, held by
// the process instance whose registration (until) is ahead of store time.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// WorkersCollection holds the worker registry.
const WorkersCollection = "workers"

type registryDoc struct {
	ID          string    `bson:"_id"`
	Instance    string    `bson:"instance"`
	Host        string    `bson:"host"`
	PID         int64     `bson:"pid"`
	StartedAt   time.Time `bson:"started_at"`
	Kinds       []string  `bson:"kinds"`
	Concurrency int64     `bson:"concurrency"`
	Running     int64     `bson:"running"`
	Heartbeat   time.Time `bson:"heartbeat"`
	Until       time.Time `bson:"until"`
}

func (d registryDoc) info() task.WorkerInfo {
	return task.WorkerInfo{
		ID: d.ID, Instance: d.Instance, Host: d.Host, PID: int(d.PID), StartedAt: utc(d.StartedAt),
		Kinds: d.Kinds, Concurrency: int(d.Concurrency), Running: int(d.Running),
		Heartbeat: utc(d.Heartbeat), Until: utc(d.Until),
	}
}

// RegisterWorker implements task.Registry: an upsert guarded by (lapsed or
// held by this or the replaced instance); a live holder makes the upsert's
// insert fail on _id.
func (s *Store) RegisterWorker(ctx context.Context, p task.RegisterParams) error {
	if err := s.check(); err != nil {
		return err
	}
	w := p.Worker
	if err := task.ValidateWorkerInfo(w); err != nil {
		return err
	}
	instances := bson.A{w.Instance}
	if p.Replace != "" {
		instances = append(instances, p.Replace)
	}
	filter := bson.D{
		{Key: "_id", Value: w.ID},
		{Key: "$or", Value: bson.A{
			bson.D{{Key: "until", Value: bson.D{{Key: "$lte", Value: p.Now.UTC()}}}},
			bson.D{{Key: "instance", Value: bson.D{{Key: "$in", Value: instances}}}},
		}},
	}
	update := bson.D{{Key: "$set", Value: bson.D{
		{Key: "instance", Value: w.Instance}, {Key: "host", Value: w.Host}, {Key: "pid", Value: int64(w.PID)},
		{Key: "started_at", Value: w.StartedAt.UTC()}, {Key: "kinds", Value: w.Kinds},
		{Key: "concurrency", Value: int64(w.Concurrency)}, {Key: "running", Value: int64(w.Running)},
		{Key: "heartbeat", Value: w.Heartbeat.UTC()}, {Key: "until", Value: w.Until.UTC()},
	}}}
	coll := s.db.Collection(WorkersCollection)
	for range 5 {
		_, err := coll.UpdateOne(ctx, filter, update, options.UpdateOne().SetUpsert(true))
		if err == nil {
			return nil
		}
		if !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("register worker %s: %w", w.ID, mapErr(err))
		}
		var cur registryDoc
		err = coll.FindOne(ctx, bson.D{{Key: "_id", Value: w.ID}}).Decode(&cur)
		if errors.Is(err, mongo.ErrNoDocuments) {
			continue // unregistered meanwhile
		}
		if err != nil {
			return fmt.Errorf("register worker %s: %w", w.ID, mapErr(err))
		}
		if cur.Until.After(p.Now) && cur.Instance != w.Instance && cur.Instance != p.Replace {
			return fmt.Errorf("register worker %s: %w", w.ID, &task.WorkerIDTakenError{Holder: cur.info()})
		}
	}
	return fmt.Errorf("register worker %s: %w: contended", w.ID, task.ErrConflict)
}

// UnregisterWorker implements task.Registry.
func (s *Store) UnregisterWorker(ctx context.Context, id, instance string) error {
	if err := s.check(); err != nil {
		return err
	}
	_, err := s.db.Collection(WorkersCollection).DeleteOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "instance", Value: instance}})
	if err != nil {
		return fmt.Errorf("unregister worker %s: %w", id, mapErr(err))
	}
	return nil
}

// Workers implements task.Registry.
func (s *Store) Workers(ctx context.Context) ([]task.WorkerInfo, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	cur, err := s.db.Collection(WorkersCollection).Find(ctx, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("workers: %w", mapErr(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var out []task.WorkerInfo
	for cur.Next(ctx) {
		var d registryDoc
		if err := cur.Decode(&d); err != nil {
			return nil, fmt.Errorf("workers: %w", err)
		}
		out = append(out, d.info())
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("workers: %w", mapErr(err))
	}
	return out, nil
}
