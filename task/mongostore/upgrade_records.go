package mongostore

// The upgrade of shared records into documents: a database written before
// documents held pauses, limits, schedules, their cursors, device states
// and the retention policy as records, one per kind and id in the
// `records` collection. Open copies each into `documents` as version 1 of
// the document named by its kind (the namespace, prefixed as
// recordNamespace says) and id, then drops `records`.

import (
	"context"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leasepool/leasepool/task"
)

// legacyRecords is the collection of shared records.
const legacyRecords = "records"

// recordNamespace is the namespace of a shared record's document: its
// kind, with task.DocumentPrefix put before the kinds that lacked it
// (pauses, limits and the doorbell had it already).
func recordNamespace(kind string) string {
	switch kind {
	case "schedule", "schedule-cursor", "device-state", "retention":
		return task.DocumentPrefix + kind
	}
	return kind
}

type legacyRecord struct {
	Kind  string        `bson:"kind"`
	ID    string        `bson:"id"`
	Value bson.RawValue `bson:"value"`
	At    time.Time     `bson:"at"`
}

// upgradeRecords moves every shared record into its document. A document
// already there is kept: processes opening at once copy the same records,
// and one written since the copy is newer than its record. The records go
// only once every copy is in, so an upgrade cut short is done again by the
// next open.
func (s *Store) upgradeRecords(ctx context.Context) error {
	coll := s.db.Collection(legacyRecords)
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("mongostore: upgrade records: %w", mapErr(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	docs := s.db.Collection(DocumentsCollection)
	n := 0
	for cur.Next(ctx) {
		var r legacyRecord
		if err := cur.Decode(&r); err != nil {
			return fmt.Errorf("mongostore: upgrade records: %w", err)
		}
		value := r.Value
		if value.Type == 0 {
			value = bson.RawValue{Type: bson.TypeNull}
		}
		ns := recordNamespace(r.Kind)
		_, err := docs.InsertOne(ctx, bson.D{
			{Key: "_id", Value: documentID(ns, r.ID)}, {Key: "ns", Value: ns}, {Key: "id", Value: r.ID},
			{Key: "version", Value: int64(1)}, {Key: "value", Value: value}, {Key: "updated_at", Value: r.At.UTC()},
		})
		if err != nil && !mongo.IsDuplicateKeyError(err) {
			return fmt.Errorf("mongostore: upgrade record %s/%s: %w", r.Kind, r.ID, mapErr(err))
		}
		n++
	}
	if err := cur.Err(); err != nil {
		return fmt.Errorf("mongostore: upgrade records: %w", mapErr(err))
	}
	if n == 0 {
		return nil
	}
	if err := coll.Drop(ctx); err != nil {
		return fmt.Errorf("mongostore: upgrade records: drop %s: %w", legacyRecords, mapErr(err))
	}
	s.cfg.Logger.Info("mongostore: moved shared records into documents", "records", n)
	return nil
}
