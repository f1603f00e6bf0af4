// Package mongostore is leasepool's MongoDB backend: a task.Store on
// go.mongodb.org/mongo-driver/v2. Tasks live one document per task in the
// collection `tasks` (field names as in docs/tasks.md), resource locks one
// document per lock key in `locks`. Writes are single-document operations
// (upserts and compare-and-set updateOne on `version`), so no transactions
// are needed and MongoDB 4.4 operators suffice; concurrent task updates
// share one `update` command (batch.go). Watch is a change stream on
// `tasks` and needs a replica set or sharded cluster; on a standalone
// server it returns task.ErrWatchUnsupported and the consumer polls.
//
// Store.Now is the server's clock as estimated from the `hello` command's
// localTime, refreshed in the background, so that hosts with skewed clocks
// agree on leases.
//
// It also runs against de.bwaldvogel:mongo-java-server (the test server of
// tests/servers), whose differences it survives: change events only for
// update statements and inserts (so every task write is an updateOne
// statement), getMore that never waits
// (Watch polls with TryNext), and update events with a wrong documentKey
// (the key is taken from the looked-up full document).
package mongostore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/leasepool/leasepool/task"
)

var _ task.Store = (*Store)(nil)

// Collection names.
const (
	TasksCollection = "tasks"
	LocksCollection = "locks"
	// LinesCollection holds the waiting lines of lock keys (task.LockLine).
	LinesCollection = "lock_lines"
)

// DefaultDatabase is used when neither Config.Database nor the URI names one.
const DefaultDatabase = "leasepool"

// Config tunes a Store. A nil *Config takes every default.
type Config struct {
	// Logger receives background errors (clock refresh). Default
	// slog.Default().
	Logger *slog.Logger
	// Database is the database name. Default: the URI's path
	// (mongodb://host/NAME), else DefaultDatabase.
	Database string
	// PollInterval is how long a change stream sleeps after a poll that
	// returned nothing. Default 10ms; must not be negative.
	PollInterval time.Duration
	// ClockRefresh is how often the offset to the server's clock is
	// measured again. Default 30s; must not be negative.
	ClockRefresh time.Duration
	// Clock is the local clock, injectable for tests. Default time.Now.
	Clock func() time.Time
	// Monitor, if set, sees every command sent to the server (to count
	// round trips, or to trace).
	Monitor *event.CommandMonitor
	// UpdateStreams is how many bulk writes of task updates may be out at
	// once. A key's updates always go through the same stream, so writers
	// of one document meet in one batch. Default DefaultUpdateStreams;
	// must not be negative.
	UpdateStreams int
	// ConnectTimeout bounds Open's first contact with the deployment: a
	// server that does not answer by then fails Open with one line naming
	// it (so does a server that refuses, or a host that does not exist, at
	// once). Default: the URI's serverSelectionTimeoutMS when it has one,
	// else DefaultConnectTimeout; must not be negative.
	ConnectTimeout time.Duration
}

// DefaultUpdateStreams is Config.UpdateStreams' default.
const DefaultUpdateStreams = 4

func (c Config) validate() error {
	if c.PollInterval < 0 {
		return fmt.Errorf("%w: mongostore config: PollInterval (%s) must not be negative", task.ErrInvalid, c.PollInterval)
	}
	if c.UpdateStreams < 0 {
		return fmt.Errorf("%w: mongostore config: UpdateStreams (%d) must not be negative", task.ErrInvalid, c.UpdateStreams)
	}
	if c.ConnectTimeout < 0 {
		return fmt.Errorf("%w: mongostore config: ConnectTimeout (%s) must not be negative", task.ErrInvalid, c.ConnectTimeout)
	}
	if c.ClockRefresh < 0 {
		return fmt.Errorf("%w: mongostore config: ClockRefresh (%s) must not be negative", task.ErrInvalid, c.ClockRefresh)
	}
	if c.Database != "" && (len(c.Database) > 63 || strings.ContainsAny(c.Database, "/\\. \"$\x00")) {
		return fmt.Errorf("%w: mongostore config: Database %q is not a valid database name", task.ErrInvalid, c.Database)
	}
	return nil
}

func (c Config) withDefaults(uriDB string) Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Database == "" {
		c.Database = uriDB
	}
	if c.UpdateStreams == 0 {
		c.UpdateStreams = DefaultUpdateStreams
	}
	if c.Database == "" {
		c.Database = DefaultDatabase
	}
	if c.PollInterval == 0 {
		c.PollInterval = 10 * time.Millisecond
	}
	if c.ClockRefresh == 0 {
		c.ClockRefresh = 30 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	return c
}

// Store is a task.Store on MongoDB. It is safe for concurrent use.
type Store struct {
	cfg    Config
	client *mongo.Client
	db     *mongo.Database
	tasks  *mongo.Collection
	locks  *mongo.Collection
	lines  *mongo.Collection

	offset  atomic.Int64 // server clock minus local clock, nanoseconds
	noHello atomic.Bool  // the server knows isMaster only
	lastSeq atomic.Int64

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
	stop      context.CancelFunc // stops the clock goroutine and the updater
	bgDone    <-chan struct{}    // closed by Close
	wg        sync.WaitGroup

	leases leaseReads // LockHolder's reads, shared (leaseread.go)

	updqs      []chan *updReq // queued Updates, one queue per stream (batch.go)
	beforeSend func(n int)    // test hook: runs in the updater before each batch
}

// Open connects to uri, checks the server answers, measures its clock and
// creates the indexes. Close the Store when done.
func Open(ctx context.Context, uri string, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	cs, err := connstring.ParseAndValidate(uri)
	if lerr := lookupError(err); lerr != nil {
		return nil, lerr // a mongodb+srv host: not bad input, perhaps a DNS outage
	}
	if err != nil {
		return nil, fmt.Errorf("%w: mongostore: uri: %w", task.ErrInvalid, err)
	}
	if c.ConnectTimeout == 0 && cs.ServerSelectionTimeoutSet {
		c.ConnectTimeout = cs.ServerSelectionTimeout
	}
	c = c.withDefaults(cs.Database)
	if err := c.validate(); err != nil {
		return nil, err
	}
	reach := newReachWatch()
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetMonitor(c.Monitor).SetServerMonitor(reach.monitor()))
	if err != nil {
		return nil, fmt.Errorf("mongostore: connect: %w", mapErr(err))
	}
	s := &Store{
		cfg:    c,
		client: client,
		db:     client.Database(c.Database),
	}
	s.tasks = s.db.Collection(TasksCollection)
	s.locks = s.db.Collection(LocksCollection)
	s.lines = s.db.Collection(LinesCollection)
	if err := s.init(ctx, reach); err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, err
	}
	s.start()
	return s, nil
}

// start runs the background goroutines: the clock refresh and the updater.
func (s *Store) start() {
	bg, stop := context.WithCancel(context.Background())
	s.stop, s.bgDone = stop, bg.Done()
	s.wg.Add(1 + s.cfg.UpdateStreams)
	go s.refreshClock(bg)
	for range s.cfg.UpdateStreams {
		q := make(chan *updReq, maxUpdateBatch)
		s.updqs = append(s.updqs, q)
		go s.updater(bg, q)
	}
}

func (s *Store) init(ctx context.Context, reach *reachWatch) error {
	if err := s.firstContact(ctx, reach); err != nil {
		return err
	}
	// A few samples; the one with the shortest round trip is the best.
	if err := s.syncClock(ctx, 3); err != nil {
		return fmt.Errorf("mongostore: %w", err)
	}
	_, err := s.tasks.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "key", Value: 1}}, Options: options.Index().SetUnique(true).SetName("key_unique")},
		{Keys: bson.D{{Key: "state", Value: 1}, {Key: "next_claim_at", Value: 1}, {Key: "priority", Value: -1}}, Options: options.Index().SetName("state_next_claim_at_priority")},
		{Keys: bson.D{{Key: "state", Value: 1}, {Key: "priority", Value: -1}, {Key: "next_claim_at", Value: 1}, {Key: "seq", Value: 1}}, Options: options.Index().SetName("state_priority_next_claim_at_seq")},
		// A group's head (CandidateQuery.Group); tasks without a group
		// stay out of it.
		{Keys: bson.D{{Key: "group", Value: 1}, {Key: "state", Value: 1}, {Key: "priority", Value: -1}, {Key: "next_claim_at", Value: 1}, {Key: "seq", Value: 1}},
			Options: options.Index().SetName("group_state_priority_next_claim_at_seq").SetPartialFilterExpression(bson.D{{Key: "group", Value: bson.D{{Key: "$exists", Value: true}}}})},
		// Retention deletes finished tasks by state and age.
		{Keys: bson.D{{Key: "state", Value: 1}, {Key: "updated_at", Value: 1}}, Options: options.Index().SetName("state_updated_at")},
		// List pages by seq, filtered by state and/or kind (list.go).
		{Keys: bson.D{{Key: "seq", Value: 1}}, Options: options.Index().SetName("seq")},
		{Keys: bson.D{{Key: "state", Value: 1}, {Key: "seq", Value: 1}}, Options: options.Index().SetName("state_seq")},
		{Keys: bson.D{{Key: "kind", Value: 1}, {Key: "state", Value: 1}, {Key: "seq", Value: 1}}, Options: options.Index().SetName("kind_state_seq")},
		{Keys: bson.D{{Key: "kind", Value: 1}, {Key: "seq", Value: 1}}, Options: options.Index().SetName("kind_seq")},
	})
	if err != nil {
		return fmt.Errorf("mongostore: create indexes: %w", mapErr(err))
	}
	_, err = s.lines.Indexes().CreateOne(ctx, mongo.IndexModel{
		Keys: bson.D{{Key: "lock_key", Value: 1}, {Key: "priority", Value: -1}, {Key: "seq", Value: 1}}, Options: options.Index().SetName("lock_key_rank")})
	if err != nil {
		return fmt.Errorf("mongostore: create indexes: %w", mapErr(err))
	}
	if err := s.upgradeLockNamespaces(ctx); err != nil {
		return err
	}
	// Documents lists a namespace by id; the index also creates the
	// collection, which a stream asking for documents watches.
	// DocumentsByTerms finds a namespace's documents by term on the
	// multikey ns_terms.
	_, err = s.db.Collection(DocumentsCollection).Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "ns", Value: 1}, {Key: "id", Value: 1}}, Options: options.Index().SetName("ns_id")},
		{Keys: bson.D{{Key: "ns", Value: 1}, {Key: "terms", Value: 1}}, Options: options.Index().SetName("ns_terms")},
	})
	if err != nil {
		return fmt.Errorf("mongostore: create indexes: %w", mapErr(err))
	}
	return s.upgradeRecords(ctx)
}

// Close stops the clock refresh and the updater, and disconnects. Calling
// it again is fine. Operations after Close fail with task.ErrClosed, and so
// do Updates still queued; a batch in flight is cancelled and its callers
// get an error wrapping task.ErrClosed (outcome unknown, as with any
// connection error).
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.stop()
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.client.Disconnect(ctx); err != nil {
			s.closeErr = fmt.Errorf("mongostore: close: %w", err)
		}
	})
	return s.closeErr
}

func (s *Store) check() error {
	if s.closed.Load() {
		return task.ErrClosed
	}
	return nil
}

// Database returns the database the store uses.
func (s *Store) Database() *mongo.Database { return s.db }

// mapErr is the one place that turns driver errors into task sentinels.
// Errors it does not recognise (connection errors, timeouts) are wrapped
// unchanged, so callers may retry them.
func mapErr(err error) error {
	if err == nil {
		return nil
	}
	var cmd mongo.CommandError
	var srv mongo.ServerError
	switch {
	case errors.Is(err, task.ErrClosed), errors.Is(err, task.ErrNotFound),
		errors.Is(err, task.ErrHistoryLost), errors.Is(err, task.ErrWatchUnsupported):
		return err
	case errors.Is(err, mongo.ErrClientDisconnected):
		return fmt.Errorf("%w: %w", task.ErrClosed, err)
	case errors.Is(err, mongo.ErrNoDocuments):
		return fmt.Errorf("%w: %w", task.ErrNotFound, err)
	case mongo.IsDuplicateKeyError(err):
		return fmt.Errorf("%w: %w", task.ErrConflict, err)
	case errors.As(err, &srv) && (srv.HasErrorCode(codeHistoryLost) || srv.HasErrorCode(codeChangeStreamFatal) ||
		srv.HasErrorCode(codeInvalidResumeToken)):
		return fmt.Errorf("%w: %w", task.ErrHistoryLost, err)
	case errors.As(err, &srv) && (srv.HasErrorCode(codeChangeStreamReplicaSetOnly) ||
		srv.HasErrorCode(codeUnrecognizedStage) || srv.HasErrorCode(codeCommandNotSupported)):
		return fmt.Errorf("%w: %w", task.ErrWatchUnsupported, err)
	case errors.As(err, &cmd) && strings.Contains(cmd.Message, "only supported on replica sets"):
		return fmt.Errorf("%w: %w", task.ErrWatchUnsupported, err)
	}
	return err
}

// Server error codes that mapErr knows.
const (
	codeCommandNotFound            = 59
	codeCommandNotSupported        = 115
	codeInvalidResumeToken         = 260
	codeChangeStreamFatal          = 280
	codeHistoryLost                = 286
	codeUnrecognizedStage          = 40324
	codeChangeStreamReplicaSetOnly = 40573
)

// nextSeq returns a Seq that grows with store time across processes (it
// is store time in nanoseconds) and strictly within this process.
func (s *Store) nextSeq() int64 {
	now := s.Now().UnixNano()
	for {
		last := s.lastSeq.Load()
		seq := max(now, last+1)
		if s.lastSeq.CompareAndSwap(last, seq) {
			return seq
		}
	}
}

// Insert implements task.Store: an upsert on key with $setOnInsert.
func (s *Store) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	if err := s.check(); err != nil {
		return nil, false, err
	}
	if err := task.CheckInsertKey(ctx, t.Key); err != nil {
		return nil, false, err
	}
	if err := task.ValidateStoredPayload(t.Payload); err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	next := t.Clone()
	next.ID = bson.NewObjectID().Hex()
	next.Seq = s.nextSeq()
	next.Version = 1
	d, err := toDoc(next)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	fields, err := docFields(d)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	fields = versionFirst(fields)
	res, err := s.tasks.UpdateOne(ctx, bson.D{{Key: "key", Value: t.Key}},
		bson.D{{Key: "$setOnInsert", Value: fields}}, options.UpdateOne().SetUpsert(true))
	switch {
	case err == nil && res.UpsertedCount == 1:
		t.ID, t.Seq, t.Version = next.ID, next.Seq, next.Version
		return t, true, nil
	case err != nil && !mongo.IsDuplicateKeyError(err):
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, mapErr(err))
	}
	// It existed, or a concurrent upsert of the same key won.
	stored, err := s.Get(ctx, t.Key)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	return stored, false, nil
}

// Get implements task.Store.
func (s *Store) Get(ctx context.Context, key string) (*task.Task, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	raw, err := s.tasks.FindOne(ctx, bson.D{{Key: "key", Value: key}}).Raw()
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, mapErr(err))
	}
	return decodeTask(raw)
}

// The version field is stored first in the document (after _id) and set
// last by Update. mongo-java-server's memory backend updates a document in
// place while readers copy it field by field, so a read can be torn. With
// this order a reader that sees a new version has also seen every field of
// that write, and a torn read carries the old version, which the next
// compare-and-set refuses. On MongoDB, where reads are atomic per document,
// the order changes nothing.
func versionFirst(fields bson.D) bson.D {
	i := slices.IndexFunc(fields, func(e bson.E) bool { return e.Key == "version" })
	if i < 0 {
		return fields
	}
	v := fields[i]
	fields = slices.Delete(fields, i, i+1)
	at := 0
	if len(fields) > 0 && fields[0].Key == "_id" {
		at = 1
	}
	return slices.Insert(fields, at, v)
}

func versionLast(fields bson.D) bson.D {
	i := slices.IndexFunc(fields, func(e bson.E) bool { return e.Key == "version" })
	if i < 0 {
		return fields
	}
	v := fields[i]
	return append(slices.Delete(fields, i, i+1), v)
}

// immutable fields are left out of Update's $set.
var immutable = []string{"_id", "key", "seq"}

// Update implements task.Store: a compare-and-set on key and version.
// Concurrent Updates are sent together as one bulk write (batch.go).
func (s *Store) Update(ctx context.Context, t *task.Task) error {
	if err := s.check(); err != nil {
		return err
	}
	if err := task.ValidateStoredPayload(t.Payload); err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	next := t.Clone()
	next.Version = t.Version + 1
	d, err := toDoc(next)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	fields, err := docFields(d)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	fields = slices.DeleteFunc(fields, func(e bson.E) bool { return slices.Contains(immutable, e.Key) })
	if next.Quiet() {
		// A field no other write sets, new at every quiet write, so that
		// the change event's updatedFields names it and the server leaves
		// the event out of SkipQuiet streams (watch.go).
		fields = append(fields, bson.E{Key: quietField, Value: next.Version})
	}
	fields = versionLast(fields)
	if err := s.submitUpdate(&updReq{ctx: ctx, key: t.Key, version: t.Version, fields: fields}); err != nil {
		return err
	}
	t.Version = next.Version
	return nil
}

var unfinished = bson.A{string(task.StatePending), string(task.StateRunning)}
