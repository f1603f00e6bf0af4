package mongostore

// Watching the user's own collections (task.CollectionWatcher), for
// package trigger: the checks of a watch, a change stream on a collection
// with the watch's filter applied by the server, and a scan of the
// matching documents by _id.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

var _ task.CollectionWatcher = (*Store)(nil)

// ownCollections are the collections leasepool writes in its database.
var ownCollections = []string{TasksCollection, LocksCollection, LinesCollection, DocumentsCollection, WorkersCollection}

// CheckCollectionWatch implements task.CollectionWatcher.
func (s *Store) CheckCollectionWatch(ctx context.Context, w task.CollectionWatch) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := s.checkOwn(w); err != nil {
		return err
	}
	if _, err := watchPipeline(w); err != nil {
		return err
	}
	// listCollections with a name filter is not honoured everywhere (the
	// wire test server lists every collection): compare the names here.
	names, err := s.client.Database(w.Database).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		return fmt.Errorf("collection %s.%s: %w", w.Database, w.Collection, mapErr(err))
	}
	if !slices.Contains(names, w.Collection) {
		return fmt.Errorf("%w: collection: %s.%s does not exist (create it first: a trigger watches an existing collection)",
			task.ErrInvalid, w.Database, w.Collection)
	}
	// The server judges the filter too, where it checks more than
	// checkMatch does (MongoDB does; the wire test server does not): as a
	// query, and in the watch's own pipeline, opened and closed at once,
	// which also tells a server that cannot stream changes.
	filter, err := parseFilter(w.Filter)
	if err != nil {
		return err
	}
	coll := s.client.Database(w.Database).Collection(w.Collection)
	err = coll.FindOne(ctx, filter).Err()
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return serverRefused(w, err)
	}
	pipeline, _ := watchPipeline(w) // checked above
	cs, err := coll.Watch(ctx, pipeline)
	if err != nil {
		if errors.Is(mapErr(err), task.ErrWatchUnsupported) {
			return fmt.Errorf("%w: collection: %s.%s: this server cannot stream changes (a standalone server: triggers need a replica set or a sharded cluster)",
				task.ErrInvalid, w.Database, w.Collection)
		}
		return serverRefused(w, err)
	}
	_ = cs.Close(context.WithoutCancel(ctx))
	return nil
}

// serverRefused is the error of a server's refusal of a watch's filter,
// or of a failure to ask it.
func serverRefused(w task.CollectionWatch, err error) error {
	var srv mongo.ServerError
	if errors.As(err, &srv) {
		return fmt.Errorf("%w: filter: the server refuses it: %s", task.ErrInvalid, oneLine(err.Error()))
	}
	return fmt.Errorf("collection %s.%s: %w", w.Database, w.Collection, mapErr(err))
}

// checkOwn refuses a watch of a collection leasepool writes, or of the
// server's own.
func (s *Store) checkOwn(w task.CollectionWatch) error {
	switch {
	case w.Database == s.db.Name() && slices.Contains(ownCollections, w.Collection):
		return fmt.Errorf("%w: collection: %s.%s is leasepool's own (its store's database is %s)",
			task.ErrInvalid, w.Database, w.Collection, s.db.Name())
	case w.Database == "admin" || w.Database == "local" || w.Database == "config" || strings.HasPrefix(w.Collection, "system."):
		return fmt.Errorf("%w: collection: %s.%s is the server's own", task.ErrInvalid, w.Database, w.Collection)
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// parseFilter reads a match expression in MongoDB extended JSON (empty:
// everything) and checks its operators.
func parseFilter(js json.RawMessage) (bson.D, error) {
	if len(strings.TrimSpace(string(js))) == 0 {
		return bson.D{}, nil
	}
	if !json.Valid(js) {
		return nil, fmt.Errorf("%w: filter: is not valid JSON", task.ErrInvalid)
	}
	var d bson.D
	if err := bson.UnmarshalExtJSON(js, false, &d); err != nil {
		return nil, fmt.Errorf("%w: filter: not a JSON object of a match expression: %s", task.ErrInvalid, oneLine(err.Error()))
	}
	if err := checkMatch("filter", d); err != nil {
		return nil, err
	}
	return d, nil
}

// The operators of a match expression, at its top and on a field.
var (
	topOperators   = []string{"$and", "$or", "$nor", "$comment"}
	fieldOperators = []string{"$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$not", "$exists", "$type",
		"$mod", "$regex", "$options", "$all", "$elemMatch", "$size", "$bitsAllSet", "$bitsAnySet", "$bitsAllClear",
		"$bitsAnyClear", "$geoWithin", "$geoIntersects"}
)

// checkMatch checks the match expression d found at path.
func checkMatch(path string, d bson.D) error {
	for _, e := range d {
		switch {
		case slices.Contains([]string{"$and", "$or", "$nor"}, e.Key):
			arr, ok := e.Value.(bson.A)
			if !ok || len(arr) == 0 {
				return fmt.Errorf("%w: %s.%s: want a non-empty array of match expressions", task.ErrInvalid, path, e.Key)
			}
			for i, v := range arr {
				sub, ok := v.(bson.D)
				if !ok {
					return fmt.Errorf("%w: %s.%s[%d]: want a match expression (an object)", task.ErrInvalid, path, e.Key, i)
				}
				if err := checkMatch(fmt.Sprintf("%s.%s[%d]", path, e.Key, i), sub); err != nil {
					return err
				}
			}
		case e.Key == "$comment":
		case strings.HasPrefix(e.Key, "$"):
			return fmt.Errorf("%w: %s: %s is not a top-level operator a trigger can use (%s)", task.ErrInvalid, path, e.Key,
				strings.Join(topOperators, ", "))
		case e.Key == "":
			return fmt.Errorf("%w: %s: an empty field name", task.ErrInvalid, path)
		default:
			if err := checkCondition(path+"."+e.Key, e.Value); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkCondition checks what a field is matched against: a value, or a
// document of operators (not both).
func checkCondition(path string, v any) error {
	d, ok := v.(bson.D)
	if !ok || len(d) == 0 || !strings.HasPrefix(d[0].Key, "$") {
		if ok {
			for _, e := range d {
				if strings.HasPrefix(e.Key, "$") {
					return fmt.Errorf("%w: %s: mixes operators (%s) with fields", task.ErrInvalid, path, e.Key)
				}
			}
		}
		return nil
	}
	for _, e := range d {
		if !slices.Contains(fieldOperators, e.Key) {
			return fmt.Errorf("%w: %s: %s is not a query operator", task.ErrInvalid, path, e.Key)
		}
		switch e.Key {
		case "$in", "$nin", "$all":
			if _, ok := e.Value.(bson.A); !ok {
				return fmt.Errorf("%w: %s.%s: want an array", task.ErrInvalid, path, e.Key)
			}
		case "$not":
			if err := checkCondition(path+".$not", e.Value); err != nil {
				return err
			}
		case "$elemMatch":
			sub, ok := e.Value.(bson.D)
			if !ok {
				return fmt.Errorf("%w: %s.$elemMatch: want an object", task.ErrInvalid, path)
			}
			if len(sub) > 0 && strings.HasPrefix(sub[0].Key, "$") && !slices.Contains(topOperators, sub[0].Key) {
				if err := checkCondition(path+".$elemMatch", sub); err != nil {
					return err
				}
			} else if err := checkMatch(path+".$elemMatch", sub); err != nil {
				return err
			}
		}
	}
	return nil
}

// onDocument rewrites a match expression on a document into one on change
// events, whose document is fullDocument.
func onDocument(d bson.D) bson.D {
	out := make(bson.D, 0, len(d))
	for _, e := range d {
		switch e.Key {
		case "$and", "$or", "$nor":
			arr := e.Value.(bson.A) // checked by checkMatch
			subs := make(bson.A, len(arr))
			for i, v := range arr {
				subs[i] = onDocument(v.(bson.D))
			}
			out = append(out, bson.E{Key: e.Key, Value: subs})
		case "$comment":
			out = append(out, e)
		default:
			out = append(out, bson.E{Key: "fullDocument." + e.Key, Value: e.Value})
		}
	}
	return out
}

// watchPipeline is the change stream's pipeline of w: its operations, and
// its filter on every change but deletes, which carry no document.
func watchPipeline(w task.CollectionWatch) (mongo.Pipeline, error) {
	if len(w.Operations) == 0 {
		return nil, fmt.Errorf("%w: operations: name at least one of %s", task.ErrInvalid, strings.Join(task.CollectionOperations, ", "))
	}
	var ops, withDoc bson.A
	for _, op := range w.Operations {
		if !slices.Contains(task.CollectionOperations, op) {
			return nil, fmt.Errorf("%w: operations: %q is not one of %s", task.ErrInvalid, op, strings.Join(task.CollectionOperations, ", "))
		}
		ops = append(ops, op)
		if op != task.OpDelete {
			withDoc = append(withDoc, op)
		}
	}
	filter, err := parseFilter(w.Filter)
	if err != nil {
		return nil, err
	}
	p := mongo.Pipeline{bson.D{{Key: "$match", Value: bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: ops}}}}}}}
	if len(filter) > 0 {
		cond := bson.A{append(bson.D{{Key: "operationType", Value: bson.D{{Key: "$in", Value: withDoc}}}}, onDocument(filter)...)}
		if len(withDoc) < len(ops) {
			cond = append(cond, bson.D{{Key: "operationType", Value: task.OpDelete}})
		}
		p = append(p, bson.D{{Key: "$match", Value: bson.D{{Key: "$or", Value: cond}}}})
	}
	return p, nil
}

// WatchCollection implements task.CollectionWatcher.
func (s *Store) WatchCollection(ctx context.Context, w task.CollectionWatch, from task.CollectionPosition) (task.CollectionStream, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := s.checkOwn(w); err != nil {
		return nil, err
	}
	pipeline, err := watchPipeline(w)
	if err != nil {
		return nil, err
	}
	opts := options.ChangeStream().SetFullDocument(options.UpdateLookup).SetMaxAwaitTime(maxAwait)
	switch {
	case len(from.Token) > 0:
		tok := bson.Raw(from.Token)
		if err := tok.Validate(); err != nil {
			return nil, fmt.Errorf("watch %s.%s: resume token: %w: %w", w.Database, w.Collection, task.ErrHistoryLost, err)
		}
		opts.SetStartAfter(tok)
	case !from.StartAt.IsZero():
		opts.SetStartAtOperationTime(&bson.Timestamp{T: uint32(from.StartAt.Unix())})
	}
	cs, err := s.client.Database(w.Database).Collection(w.Collection).Watch(ctx, pipeline, opts)
	if err != nil {
		return nil, fmt.Errorf("watch %s.%s: %w", w.Database, w.Collection, mapErr(err))
	}
	c := &collectionStream{s: s, cs: cs, done: make(chan struct{}), name: w.Database + "." + w.Collection}
	c.token = slices.Clone(task.Token(cs.ResumeToken()))
	if len(c.token) == 0 {
		c.token = slices.Clone(from.Token)
	}
	return c, nil
}

// collectionStream polls a change stream on a user's collection, as
// changeStream does on tasks.
type collectionStream struct {
	s    *Store
	name string
	done chan struct{}

	mu     sync.Mutex // serialises driver calls and Close
	cs     *mongo.ChangeStream
	closed bool
	err    error

	tokMu sync.Mutex
	token task.Token
}

// Next implements task.CollectionStream.
func (c *collectionStream) Next(ctx context.Context) (task.CollectionChange, error) {
	for {
		if err := ctx.Err(); err != nil {
			return task.CollectionChange{}, err
		}
		ch, ok, err := c.poll(ctx)
		if err != nil || ok {
			return ch, err
		}
		select {
		case <-ctx.Done():
			return task.CollectionChange{}, ctx.Err()
		case <-c.done:
			return task.CollectionChange{}, errStreamClosed
		case <-time.After(c.s.cfg.PollInterval):
		}
	}
}

func (c *collectionStream) poll(ctx context.Context) (task.CollectionChange, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return task.CollectionChange{}, false, errStreamClosed
	}
	if c.err != nil {
		return task.CollectionChange{}, false, c.err
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxAwait+30*time.Second)
	got := c.cs.TryNext(dctx)
	cancel()
	if !got {
		if err := c.cs.Err(); err != nil {
			c.err = fmt.Errorf("change stream on %s: %w", c.name, mapErr(err))
			return task.CollectionChange{}, false, c.err
		}
		c.setToken(c.cs.ResumeToken())
		return task.CollectionChange{}, false, nil
	}
	ch, err := decodeCollectionChange(c.cs.Current)
	if err != nil {
		c.err = fmt.Errorf("change stream on %s: %w", c.name, err)
		return task.CollectionChange{}, false, c.err
	}
	c.setToken(c.cs.ResumeToken())
	return ch, true, nil
}

func (c *collectionStream) setToken(t bson.Raw) {
	if len(t) == 0 {
		return
	}
	c.tokMu.Lock()
	c.token = slices.Clone(task.Token(t))
	c.tokMu.Unlock()
}

// ResumeToken implements task.CollectionStream.
func (c *collectionStream) ResumeToken() task.Token {
	c.tokMu.Lock()
	defer c.tokMu.Unlock()
	return slices.Clone(c.token)
}

// Close implements task.CollectionStream. Calling it again is fine.
func (c *collectionStream) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	close(c.done)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.cs.Close(ctx); err != nil && !errors.Is(err, mongo.ErrClientDisconnected) {
		return fmt.Errorf("change stream close: %w", err)
	}
	return nil
}

// decodeCollectionChange reads one change event of a user's collection.
// The _id comes from documentKey, else from the full document (the wire
// test server's update events carry the update in documentKey); a full
// document without an _id (that server's stand-in for a document deleted
// since) is no document.
func decodeCollectionChange(raw bson.Raw) (task.CollectionChange, error) {
	var ev struct {
		ID            bson.Raw      `bson:"_id"`
		OperationType string        `bson:"operationType"`
		FullDocument  bson.RawValue `bson:"fullDocument"`
		DocumentKey   bson.RawValue `bson:"documentKey"`
	}
	if err := bson.Unmarshal(raw, &ev); err != nil {
		return task.CollectionChange{}, fmt.Errorf("decode change event: %w", err)
	}
	switch ev.OperationType {
	case "invalidate", "drop", "rename", "dropDatabase":
		return task.CollectionChange{}, fmt.Errorf("the collection was dropped or renamed (%s): %w", ev.OperationType, task.ErrHistoryLost)
	}
	if len(ev.ID) == 0 {
		return task.CollectionChange{}, fmt.Errorf("change event without _id (resume token)")
	}
	ch := task.CollectionChange{Token: slices.Clone(task.Token(ev.ID)), Operation: ev.OperationType}
	var id bson.RawValue
	if k, ok := ev.DocumentKey.DocumentOK(); ok {
		id, _ = k.LookupErr("_id")
	}
	if doc, ok := ev.FullDocument.DocumentOK(); ok {
		if did, err := doc.LookupErr("_id"); err == nil {
			if id.Type == 0 {
				id = did
			}
			js, err := extJSON(doc)
			if err != nil {
				return task.CollectionChange{}, fmt.Errorf("change event's document: %w", err)
			}
			ch.Document = js
		}
	}
	if id.Type != 0 {
		js, err := idJSON(id, false)
		if err != nil {
			return task.CollectionChange{}, fmt.Errorf("change event's _id: %w", err)
		}
		ch.ID = js
	}
	return ch, nil
}

// extJSON is doc as relaxed extended JSON.
func extJSON(doc bson.Raw) (json.RawMessage, error) {
	b, err := bson.MarshalExtJSON(doc, false, false)
	if err != nil {
		return nil, err
	}
	return json.RawMessage(b), nil
}

// idJSON is an _id as extended JSON: relaxed for payloads and keys,
// canonical for a scan's cursor (which must read back as the same type).
func idJSON(id bson.RawValue, canonical bool) (json.RawMessage, error) {
	b, err := bson.MarshalExtJSON(bson.D{{Key: "_id", Value: id}}, canonical, false)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	return m["_id"], nil
}

// ScanCollection implements task.CollectionWatcher.
func (s *Store) ScanCollection(ctx context.Context, w task.CollectionWatch, after json.RawMessage, limit int) ([]task.CollectionDocument, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if err := s.checkOwn(w); err != nil {
		return nil, err
	}
	filter, err := parseFilter(w.Filter)
	if err != nil {
		return nil, err
	}
	if len(after) > 0 {
		var a struct {
			ID bson.RawValue `bson:"_id"`
		}
		if err := bson.UnmarshalExtJSON([]byte(`{"_id":`+string(after)+`}`), true, &a); err != nil {
			return nil, fmt.Errorf("%w: scan: after: %w", task.ErrInvalid, err)
		}
		filter = bson.D{{Key: "$and", Value: bson.A{filter, bson.D{{Key: "_id", Value: bson.D{{Key: "$gt", Value: a.ID}}}}}}}
	}
	opts := options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(int64(max(limit, 1)))
	cur, err := s.client.Database(w.Database).Collection(w.Collection).Find(ctx, filter, opts)
	if err != nil {
		return nil, fmt.Errorf("scan %s.%s: %w", w.Database, w.Collection, mapErr(err))
	}
	defer cur.Close(context.WithoutCancel(ctx))
	var out []task.CollectionDocument
	for cur.Next(ctx) {
		id, err := cur.Current.LookupErr("_id")
		if err != nil {
			continue // no _id: not a document a change could name
		}
		d := task.CollectionDocument{}
		if d.ID, err = idJSON(id, false); err == nil {
			if d.Cursor, err = idJSON(id, true); err == nil {
				d.Document, err = extJSON(cur.Current)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("scan %s.%s: %w", w.Database, w.Collection, err)
		}
		out = append(out, d)
	}
	if err := cur.Err(); err != nil {
		return nil, fmt.Errorf("scan %s.%s: %w", w.Database, w.Collection, mapErr(err))
	}
	return out, nil
}
