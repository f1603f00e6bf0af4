package mongostore

// Documents (task.DocumentStore): one MongoDB document per namespace and
// id in `documents`, written by compare-and-set on its version. Streams
// that ask for documents watch this collection beside `tasks`.

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

// DocumentsCollection holds task.Documents: {_id: {ns, id}, ns, id,
// version, value, updated_at, terms}. Every put writes terms, an array
// (empty for none) under the multikey index ns_terms; a document without
// the field was written by a version that kept no terms, and
// DocumentsByTerms returns it too.
const DocumentsCollection = "documents"

type documentDoc struct {
	Namespace string        `bson:"ns"`
	ID        string        `bson:"id"`
	Version   int64         `bson:"version"`
	Value     bson.RawValue `bson:"value"`
	UpdatedAt time.Time     `bson:"updated_at"`
	Terms     []string      `bson:"terms,omitempty"`
}

func documentID(namespace, id string) bson.D {
	return bson.D{{Key: "ns", Value: namespace}, {Key: "id", Value: id}}
}

func (d documentDoc) document() (task.Document, error) {
	v, err := bsonToJSON(d.Value)
	if err != nil {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", d.Namespace, d.ID, err)
	}
	if v == nil {
		v = []byte("null")
	}
	var terms []string
	if len(d.Terms) > 0 {
		terms = d.Terms
	}
	return task.Document{Namespace: d.Namespace, ID: d.ID, Version: d.Version, Value: v, UpdatedAt: utc(d.UpdatedAt), Terms: terms}, nil
}

// GetDocument implements task.DocumentStore.
func (s *Store) GetDocument(ctx context.Context, namespace, id string) (task.Document, error) {
	if err := s.check(); err != nil {
		return task.Document{}, err
	}
	if err := task.CheckDocumentName(namespace, id); err != nil {
		return task.Document{}, err
	}
	var d documentDoc
	err := s.db.Collection(DocumentsCollection).FindOne(ctx, bson.D{{Key: "_id", Value: documentID(namespace, id)}}).Decode(&d)
	if err != nil {
		return task.Document{}, fmt.Errorf("document %s/%s: %w", namespace, id, mapErr(err))
	}
	return d.document()
}

// PutDocument implements task.DocumentStore: an insert for version 0 (a
// duplicate _id is a conflict), else a replace of the document at
// d.Version.
func (s *Store) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	if err := s.check(); err != nil {
		return task.Document{}, err
	}
	value, err := task.CheckDocument(ctx, d)
	if err != nil {
		return task.Document{}, err
	}
	bv, err := jsonToBSON(value)
	if err != nil {
		return task.Document{}, fmt.Errorf("%w: document value: %w", task.ErrInvalid, err)
	}
	terms, _ := task.CheckTerms("document terms", d.Terms) // checked by CheckDocument
	now := s.Now().UTC().Truncate(time.Millisecond)
	doc := bson.D{
		{Key: "_id", Value: documentID(d.Namespace, d.ID)}, {Key: "ns", Value: d.Namespace}, {Key: "id", Value: d.ID},
		{Key: "version", Value: d.Version + 1}, {Key: "value", Value: bv}, {Key: "updated_at", Value: now},
		// Always an array, empty for none: a document without the field
		// is one a version without terms wrote.
		{Key: "terms", Value: append([]string{}, terms...)},
	}
	coll := s.db.Collection(DocumentsCollection)
	if d.Version == 0 {
		_, err = coll.InsertOne(ctx, doc)
	} else {
		var res *mongo.UpdateResult
		res, err = coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: documentID(d.Namespace, d.ID)}, {Key: "version", Value: d.Version}}, doc)
		if err == nil && res.MatchedCount == 0 {
			err = fmt.Errorf("stored version is not %d: %w", d.Version, task.ErrConflict)
		}
	}
	if err != nil {
		return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, mapErr(err))
	}
	return task.Document{Namespace: d.Namespace, ID: d.ID, Version: d.Version + 1, Value: append([]byte(nil), value...), UpdatedAt: now, Terms: terms}, nil
}

// DeleteDocument implements task.DocumentStore.
func (s *Store) DeleteDocument(ctx context.Context, namespace, id string, version int64) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := task.CheckDocumentName(namespace, id); err != nil {
		return err
	}
	filter := bson.D{{Key: "_id", Value: documentID(namespace, id)}}
	if version != 0 {
		filter = append(filter, bson.E{Key: "version", Value: version})
	}
	coll := s.db.Collection(DocumentsCollection)
	res, err := coll.DeleteOne(ctx, filter)
	if err == nil && res.DeletedCount == 0 {
		err = coll.FindOne(ctx, bson.D{{Key: "_id", Value: documentID(namespace, id)}}).Err()
		if err == nil {
			err = fmt.Errorf("stored version is not %d: %w", version, task.ErrConflict)
		} else if errors.Is(err, mongo.ErrNoDocuments) {
			err = task.ErrNotFound
		}
	}
	if err != nil {
		return fmt.Errorf("delete document %s/%s: %w", namespace, id, mapErr(err))
	}
	return nil
}

// Documents implements task.DocumentStore.
func (s *Store) Documents(ctx context.Context, namespace string) ([]task.Document, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := task.ValidateName("document namespace", namespace); err != nil {
		return nil, err
	}
	out, err := s.findDocuments(ctx, bson.D{{Key: "ns", Value: namespace}})
	if err != nil {
		return nil, fmt.Errorf("documents %s: %w", namespace, err)
	}
	return out, nil
}

// DocumentsByTerms implements task.DocumentStore: the documents of
// namespace whose terms hold all of terms, off the multikey index
// ns_terms, and those without the field (written by a version that kept
// no terms), whose index key is null.
func (s *Store) DocumentsByTerms(ctx context.Context, namespace string, terms []string) ([]task.Document, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	terms, err := task.CheckTermsQuery(namespace, terms)
	if err != nil {
		return nil, err
	}
	filter := bson.D{{Key: "ns", Value: namespace}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "terms", Value: bson.D{{Key: "$all", Value: terms}}}},
		// No field: null on the index (an equality the planner bounds,
		// where $exists: false could cost the $or its index).
		bson.D{{Key: "terms", Value: nil}},
	}}}
	out, err := s.findDocuments(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("documents %s by terms: %w", namespace, err)
	}
	return out, nil
}

// findDocuments returns the documents filter finds, by id.
func (s *Store) findDocuments(ctx context.Context, filter bson.D) ([]task.Document, error) {
	cur, err := s.db.Collection(DocumentsCollection).Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "id", Value: 1}}))
	if err != nil {
		return nil, mapErr(err)
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var out []task.Document
	for cur.Next(ctx) {
		var d documentDoc
		if err := cur.Decode(&d); err != nil {
			return nil, err
		}
		doc, err := d.document()
		if err != nil {
			return nil, err
		}
		out = append(out, doc)
	}
	if err := cur.Err(); err != nil {
		return nil, mapErr(err)
	}
	return out, nil
}

// documentEvent is the part of a change event on documents that Watch
// reads.
type documentEvent struct {
	ID            bson.Raw      `bson:"_id"`
	OperationType string        `bson:"operationType"`
	FullDocument  bson.RawValue `bson:"fullDocument"`
	DocumentKey   documentKey   `bson:"documentKey"`
}

type documentKey struct {
	ID struct {
		Namespace string `bson:"ns"`
		ID        string `bson:"id"`
	} `bson:"_id"`
	raw bson.RawValue
}

func (k *documentKey) UnmarshalBSONValue(typ byte, data []byte) error {
	k.raw = bson.RawValue{Type: bson.Type(typ), Value: append([]byte(nil), data...)}
	if bson.Type(typ) != bson.TypeEmbeddedDocument {
		return nil
	}
	type plain documentKey
	var p plain
	if err := bson.Unmarshal(data, &p); err != nil {
		return err
	}
	k.ID = p.ID
	return nil
}

// writtenDocument reads a document as stored, if v holds one (a
// looked-up document may be gone, or a later write's). Without a version
// it is not one.
func writtenDocument(v bson.RawValue) (*task.Document, bool) {
	raw, ok := v.DocumentOK()
	if !ok {
		return nil, false
	}
	if _, ok := raw.Lookup("version").AsInt64OK(); !ok {
		return nil, false
	}
	var dd documentDoc
	if err := bson.Unmarshal(raw, &dd); err != nil || dd.Namespace == "" {
		return nil, false
	}
	d, err := dd.document()
	if err != nil {
		return nil, false
	}
	return &d, true
}

// decodeDocumentEvent turns a change event on documents into a
// task.Event, skipping those of namespaces p does not ask for.
func decodeDocumentEvent(p task.WatchParams) func(bson.Raw) (task.Event, bool, error) {
	return func(raw bson.Raw) (task.Event, bool, error) {
		var de documentEvent
		if err := bson.Unmarshal(raw, &de); err != nil {
			return task.Event{}, false, fmt.Errorf("decode document change event: %w", err)
		}
		if de.OperationType == "invalidate" {
			return task.Event{}, false, fmt.Errorf("document stream invalidated (collection dropped or renamed): %w", task.ErrHistoryLost)
		}
		if len(de.ID) == 0 {
			return task.Event{}, false, fmt.Errorf("change event without _id (resume token)")
		}
		ev := task.Event{Token: task.Token(append([]byte(nil), de.ID...))}
		doc := &task.Document{Namespace: de.DocumentKey.ID.Namespace, ID: de.DocumentKey.ID.ID}
		if de.OperationType == "delete" {
			ev.DocumentDeleted = true
		} else if d, ok := writtenDocument(de.DocumentKey.raw); ok {
			// The test server's replace: an update with the replacement in
			// documentKey, the write's own document, where its fullDocument
			// is looked up when the stream is polled (a later write's).
			doc = d
		} else if d, ok := writtenDocument(de.FullDocument); ok {
			doc = d
		}
		if doc.Namespace == "" || !p.WantsDocuments(doc.Namespace) {
			return task.Event{}, true, nil
		}
		ev.Document = doc
		return ev, false, nil
	}
}
