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
// which also resumes past an invalidate event. With p.Documents, a second
// stream on documents runs beside it (see pairStream); with p.NoTasks as
// well, that stream alone (documentsStream).
func (s *Store) Watch(ctx context.Context, p task.WatchParams) (task.ChangeStream, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	tasksTok, docsTok, docsOnly := splitToken(p.ResumeAfter)
	if p.NoTasks {
		if len(p.Documents) == 0 {
			return nil, fmt.Errorf("watch: %w: NoTasks and no Documents", task.ErrInvalid)
		}
		ds, err := s.watchDocuments(ctx, p, docsTok)
		if err != nil {
			return nil, err
		}
		return documentsStream{ds}, nil
	}
	if docsOnly {
		// Starting the tasks from now would skip the task writes since.
		return nil, fmt.Errorf("watch: %w: the resume token is of a stream of documents alone, which it alone resumes", task.ErrInvalid)
	}
	ops := bson.A{"insert", "update", "replace", "invalidate"}
	if len(p.Documents) == 0 {
		return s.watch(ctx, s.tasks, ops, tasksTok, p.SkipQuiet, decodeEvent)
	}
	ts, err := s.watch(ctx, s.tasks, ops, tasksTok, p.SkipQuiet, decodeEvent)
	if err != nil {
		return nil, err
	}
	ds, err := s.watchDocuments(ctx, p, docsTok)
	if err != nil {
		ts.Close()
		return nil, err
	}
	return newPairStream(ts, ds), nil
}

func (s *Store) watchDocuments(ctx context.Context, p task.WatchParams, resume task.Token) (*changeStream, error) {
	return s.watch(ctx, s.db.Collection(DocumentsCollection), bson.A{"insert", "update", "replace", "delete", "invalidate"},
		resume, false, decodeDocumentEvent(p))
}

func (s *Store) watch(ctx context.Context, coll *mongo.Collection, ops bson.A, resume task.Token, skipQuiet bool,
	decode func(bson.Raw) (task.Event, bool, error)) (*changeStream, error) {
	pipeline := mongo.Pipeline{bson.D{{Key: "$match", Value: bson.D{
		{Key: "operationType", Value: bson.D{{Key: "$in", Value: ops}}},
	}}}}
	if skipQuiet {
		// On MongoDB the server leaves quiet writes out, before it looks
		// their documents up, by the field only they set: a worker then
		// receives nothing for a lease renewal. A server whose events carry
		// no updateDescription (the wire test server) passes every event,
		// and the stream drops the quiet ones it can tell (quiet, below).
		pipeline = append(pipeline, bson.D{{Key: "$match", Value: bson.D{
			{Key: "updateDescription.updatedFields." + quietField, Value: bson.D{{Key: "$exists", Value: false}}},
		}}})
	}
	opts := options.ChangeStream().SetFullDocument(options.UpdateLookup).SetMaxAwaitTime(maxAwait)
	if len(resume) > 0 {
		tok := bson.Raw(resume)
		if err := tok.Validate(); err != nil {
			return nil, fmt.Errorf("watch: resume token: %w: %w", task.ErrHistoryLost, err)
		}
		opts.SetStartAfter(tok)
	}
	cs, err := coll.Watch(ctx, pipeline, opts)
	if err != nil {
		return nil, fmt.Errorf("watch: %w", mapErr(err))
	}
	c := &changeStream{s: s, cs: cs, skipQuiet: skipQuiet, decode: decode, done: make(chan struct{})}
	c.token = slices.Clone(task.Token(cs.ResumeToken()))
	if len(c.token) == 0 && len(resume) > 0 {
		c.token = slices.Clone(resume)
	}
	return c, nil
}

// The fields of a pair stream's resume token, a BSON document holding the
// tokens of its two streams.
const (
	tasksTokenField     = "leasepool_tasks"
	documentsTokenField = "leasepool_documents"
)

// splitToken reads a pair stream's token, or a documentsStream's
// (docsOnly). Any other token is a tasks stream's (a reader that asked for
// no documents before): the documents stream then starts from now.
func splitToken(tok task.Token) (tasks, docs task.Token, docsOnly bool) {
	raw := bson.Raw(tok)
	if len(tok) == 0 || raw.Validate() != nil {
		return tok, nil, false
	}
	t, tok1 := raw.Lookup(tasksTokenField).DocumentOK()
	d, tok2 := raw.Lookup(documentsTokenField).DocumentOK()
	if !tok1 && !tok2 {
		return tok, nil, false
	}
	return task.Token(t), task.Token(d), !tok1
}

// joinToken is splitToken's inverse. It is nil while either stream has no
// position yet (the test server names none before a stream's first
// event): resuming from half a token would skip the other collection's
// writes in between, where nil tells the reader to re-query.
func joinToken(tasks, docs task.Token) task.Token {
	if len(tasks) == 0 || len(docs) == 0 {
		return nil
	}
	d := bson.D{{Key: tasksTokenField, Value: bson.Raw(tasks)}, {Key: documentsTokenField, Value: bson.Raw(docs)}}
	b, err := bson.Marshal(d)
	if err != nil {
		return nil
	}
	return task.Token(b)
}

// documentsStream is a stream of document writes alone
// (task.WatchParams.NoTasks). Its tokens hold the documents stream's
// token as a pair's does, without the tasks', so that splitToken tells
// them apart: a stream that carries tasks refuses them.
type documentsStream struct{ *changeStream }

// Next implements task.ChangeStream.
func (d documentsStream) Next(ctx context.Context) (task.Event, error) {
	ev, err := d.changeStream.Next(ctx)
	ev.Token = documentsToken(ev.Token)
	return ev, err
}

// ResumeToken implements task.ChangeStream: nil while the stream has no
// position yet, as a plain stream's.
func (d documentsStream) ResumeToken() task.Token {
	return documentsToken(d.changeStream.ResumeToken())
}

func documentsToken(docs task.Token) task.Token {
	if len(docs) == 0 {
		return nil
	}
	b, err := bson.Marshal(bson.D{{Key: documentsTokenField, Value: bson.Raw(docs)}})
	if err != nil {
		return nil
	}
	return task.Token(b)
}

// pairStream merges the change streams of tasks and of documents (the
// test server has no database-wide stream). Events of one collection keep
// their order; the two are interleaved as they come, so a document write
// and a task write may arrive in either order. Each stream is read by its
// own goroutine, so that one waiting on the server (up to maxAwait) never
// holds back the other's events.
type pairStream struct {
	sides  [2]*changeStream // tasks, documents
	events chan sideEvent
	stop   context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	once   sync.Once

	mu  sync.Mutex
	tok [2]task.Token // each side's position, as handed out
	err error
}

type sideEvent struct {
	side int
	ev   task.Event
	err  error
}

func newPairStream(tasks, docs *changeStream) *pairStream {
	ctx, stop := context.WithCancel(context.Background())
	p := &pairStream{sides: [2]*changeStream{tasks, docs}, events: make(chan sideEvent), stop: stop, done: make(chan struct{})}
	for i, c := range p.sides {
		p.tok[i] = c.ResumeToken()
		p.wg.Add(1)
		go p.read(ctx, i, c)
	}
	return p
}

// read hands side's events to Next, one at a time. While it holds none,
// the side's position is its stream's, which passes skipped events too.
func (p *pairStream) read(ctx context.Context, side int, c *changeStream) {
	defer p.wg.Done()
	for {
		ev, ok, err := c.poll(ctx)
		switch {
		case err != nil || ok:
			select {
			case p.events <- sideEvent{side: side, ev: ev, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
			continue
		}
		p.mu.Lock()
		p.tok[side] = c.ResumeToken()
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(c.s.cfg.PollInterval):
		}
	}
}

// Next implements task.ChangeStream.
func (p *pairStream) Next(ctx context.Context) (task.Event, error) {
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	if err != nil {
		return task.Event{}, err
	}
	select {
	case <-ctx.Done():
		return task.Event{}, ctx.Err()
	case <-p.done:
		return task.Event{}, errStreamClosed
	case se := <-p.events:
		p.mu.Lock()
		defer p.mu.Unlock()
		if se.err != nil {
			p.err = se.err
			return task.Event{}, se.err
		}
		p.tok[se.side] = se.ev.Token
		se.ev.Token = joinToken(p.tok[0], p.tok[1])
		return se.ev, nil
	}
}

// ResumeToken implements task.ChangeStream.
func (p *pairStream) ResumeToken() task.Token {
	p.mu.Lock()
	defer p.mu.Unlock()
	return joinToken(p.tok[0], p.tok[1])
}

// Close implements task.ChangeStream.
func (p *pairStream) Close() error {
	var err error
	p.once.Do(func() {
		close(p.done)
		p.stop()
		err = errors.Join(p.sides[0].Close(), p.sides[1].Close())
		p.wg.Wait()
	})
	return err
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
	// decode turns a raw event into a task.Event, or skips it.
	decode func(bson.Raw) (task.Event, bool, error)

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
		ev, skip, err := c.decode(c.cs.Current)
		if err != nil {
			c.err = fmt.Errorf("change stream: %w", err)
			return task.Event{}, false, c.err
		}
		c.setToken(c.cs.ResumeToken())
		if skip || c.skipQuiet && (quiet(ev) || quietWrite(c.cs.Current)) {
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

// quietWrite reports whether raw is the event of a quiet write by what the
// write itself set (quietField), whatever document it looked up: on
// MongoDB the server's $match leaves these out already; the wire test
// server's events carry the write's $set in documentKey instead, and
// their lookup reads the document as it is when the stream is polled.
func quietWrite(raw bson.Raw) bool {
	if _, err := raw.LookupErr("updateDescription", "updatedFields", quietField); err == nil {
		return true
	}
	_, err := raw.LookupErr("documentKey", "$set", quietField)
	return err == nil
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
