package mongostore

// The change stream: a MongoDB change stream on `tasks`, its events
// turned into task.Events and its resume token into task.Tokens.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/task"
)

// errStreamClosed is returned by Next after Close.
var errStreamClosed = fmt.Errorf("change stream: %w", task.ErrClosed)

// maxAwait bounds how long one getMore waits on a server that honours it,
// and so how late Next notices a cancelled context.
const maxAwait = 500 * time.Millisecond

// Watch implements task.Store: a change stream on tasks with the full
// document looked up for updates. A resume token is passed as startAfter,
// which also resumes past an invalidate event.
func (s *Store) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	pipeline := mongo.Pipeline{bson.D{{Key: "$match", Value: bson.D{
		{Key: "operationType", Value: bson.D{{Key: "$in", Value: bson.A{"insert", "update", "replace", "invalidate"}}}},
	}}}}
	opts := options.ChangeStream().SetFullDocument(options.UpdateLookup).SetMaxAwaitTime(maxAwait)
	if len(p.ResumeAfter) > 0 {
		tok := bson.Raw(p.ResumeAfter)
		if err := tok.Validate(); err != nil {
			return nil, fmt.Errorf("watch: resume token: %w: %w", task.ErrHistoryLost, err)
		}
		opts.SetStartAfter(tok)
	}
	cs, err := s.tasks.Watch(ctx, pipeline, opts)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", mapErr(err))
	}
	c := &changeStream{s: s, cs: cs, skipQuiet: p.SkipQuiet, done: make(chan struct{})}
	c.token = slices.Clone(task.Token(cs.ResumeToken()))
	if len(c.token) == 0 && len(p.ResumeAfter) > 0 {
		c.token = slices.Clone(p.ResumeAfter)
	}
	return c, nil
}

// changeStream polls a driver change stream with TryNext and a short
// sleep: the test server's getMore never waits, and on MongoDB TryNext
// waits up to maxAwait. Next uses an uncancellable context for the driver
// call so that a cancelled Next leaves the stream usable.
type changeStream struct {
	s    *Store
	done chan struct{}
	// skipQuiet leaves out quiet writes (task.WatchParams.SkipQuiet).
	skipQuiet bool

	mu     sync.Mutex // serialises driver calls and Close
	cs     *mongo.ChangeStream
	closed bool
	err    error

	tokMu sync.Mutex
	token task.Token
}

func (c *changeStream) setToken(t bson.Raw) {
	if len(t) == 0 {
		return
	}
	c.tokMu.Lock()
	c.token = slices.Clone(task.Token(t))
	c.tokMu.Unlock()
}

// ResumeToken implements task.ChangeStream.
func (c *changeStream) ResumeToken() task.Token {
	c.tokMu.Lock()
	defer c.tokMu.Unlock()
	return slices.Clone(c.token)
}

// Next implements task.ChangeStream.
func (c *changeStream) Next(ctx context.Context) (task.Event, error) {
	for {
		if err := ctx.Err(); err != nil {
			return task.Event{}, err
		}
		ev, ok, err := c.poll(ctx)
		if err != nil || ok {
			return ev, err
		}
		select {
		case <-ctx.Done():
			return task.Event{}, ctx.Err()
		case <-c.done:
			return task.Event{}, errStreamClosed
		case <-time.After(c.s.cfg.PollInterval):
		}
	}
}

// poll asks the driver once. ok is false when nothing came.
func (c *changeStream) poll(ctx context.Context) (ev task.Event, ok bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return task.Event{}, false, errStreamClosed
		}
		if c.err != nil {
			return task.Event{}, false, c.err
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), maxAwait+30*time.Second)
		got := c.cs.TryNext(dctx)
		cancel()
		if !got {
			if err := c.cs.Err(); err != nil {
				c.err = fmt.Errorf("change stream: %w", mapErr(err))
				return task.Event{}, false, c.err
			}
			c.setToken(c.cs.ResumeToken())
			return task.Event{}, false, nil
		}
		ev, skip, err := decodeEvent(c.cs.Current)
		if err != nil {
			c.err = fmt.Errorf("change stream: %w", err)
			return task.Event{}, false, c.err
		}
		c.setToken(c.cs.ResumeToken())
		if skip || c.skipQuiet && quiet(ev) {
			continue
		}
		return ev, true, nil
	}
}

// quiet reports whether ev is a quiet write (task.Task.Quiet) known to be
// the one its looked-up document stored: a later write's document says
// nothing of the write the event is for.
func quiet(ev task.Event) bool {
	return ev.Task != nil && ev.Version == ev.Task.Version && ev.Task.Quiet()
}

// Close implements task.ChangeStream. Calling it again is fine.
func (c *changeStream) Close() error {
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

// changeEvent is the part of a MongoDB change event that Watch reads.
type changeEvent struct {
	ID            bson.Raw      `bson:"_id"`
	OperationType string        `bson:"operationType"`
	FullDocument  bson.RawValue `bson:"fullDocument"`
	DocumentKey   bson.RawValue `bson:"documentKey"`
	// UpdatedFields holds the version the update stored (every Update sets
	// it), where the looked-up document may be a later write's.
	UpdateDescription struct {
		UpdatedFields bson.Raw `bson:"updatedFields"`
	} `bson:"updateDescription"`
}

// updatedVersion is the version an update event's write stored, or 0: from
// updateDescription on MongoDB, from the $set that the test server puts in
// documentKey.
func updatedVersion(ce changeEvent) int64 {
	if f := ce.UpdateDescription.UpdatedFields; len(f) > 0 {
		if v, ok := f.Lookup("version").AsInt64OK(); ok {
			return v
		}
	}
	if k, ok := ce.DocumentKey.DocumentOK(); ok {
		if set, ok := k.Lookup("$set").DocumentOK(); ok {
			if v, ok := set.Lookup("version").AsInt64OK(); ok {
				return v
			}
		}
	}
	return 0
}

// decodeEvent turns a raw change event into a task.Event. The key comes
// from the full document (the test server's update events carry a wrong
// documentKey), else from a `key` in documentKey (a collection sharded on
// key). An event whose key cannot be found is skipped (skip true). An
// invalidate event gives task.ErrHistoryLost.
func decodeEvent(raw bson.Raw) (ev task.Event, skip bool, err error) {
	var ce changeEvent
	if err := bson.Unmarshal(raw, &ce); err != nil {
		return task.Event{}, false, fmt.Errorf("decode change event: %w", err)
	}
	if ce.OperationType == "invalidate" {
		return task.Event{}, false, fmt.Errorf("stream invalidated (collection dropped or renamed): %w", task.ErrHistoryLost)
	}
	if len(ce.ID) == 0 {
		return task.Event{}, false, fmt.Errorf("change event without _id (resume token)")
	}
	ev.Token = slices.Clone(task.Token(ce.ID))
	ev.Version = updatedVersion(ce)
	if doc, ok := ce.FullDocument.DocumentOK(); ok {
		if k, ok := doc.Lookup("key").StringValueOK(); ok {
			ev.Key = k
		}
		if t, err := decodeTask(doc); err == nil && t.Key != "" {
			ev.Task = t
		}
	}
	if ev.Key == "" {
		if doc, ok := ce.DocumentKey.DocumentOK(); ok {
			if k, ok := doc.Lookup("key").StringValueOK(); ok {
				ev.Key = k
			}
		}
	}
	if ev.Key == "" {
		return task.Event{}, true, nil
	}
	return ev, false, nil
}
