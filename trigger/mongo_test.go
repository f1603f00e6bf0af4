package trigger_test

// Triggers against the MongoDB wire test server (tests/servers): each test
// on a database of its own, a runner in the test process.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/trigger"
)

var dbSeq atomic.Int64

type tlogWriter struct{ t testing.TB }

func (w tlogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// openStore opens a store on a fresh database, dropped when t ends.
func openStore(t *testing.T) *mongostore.Store {
	t.Helper()
	db := fmt.Sprintf("lp_trig_%d_%d", time.Now().UnixNano()%1e12, dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := mongostore.Open(ctx, testservers.MongoURI(t), &mongostore.Config{Database: db,
		Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = st.Database().Drop(context.Background())
		_ = st.Close()
	})
	return st
}

// userCollection creates the collection name in st's database.
func userCollection(t *testing.T, st *mongostore.Store, name string) *mongo.Collection {
	t.Helper()
	if err := st.Database().CreateCollection(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	return st.Database().Collection(name)
}

// runRunner runs a trigger runner as the elected worker would, until t
// ends or the returned stop is called.
func runRunner(t *testing.T, st task.Store) (stop func()) {
	t.Helper()
	r, err := trigger.NewRunner(trigger.RunnerConfig{Store: st, Poll: 100 * time.Millisecond, IdleSave: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(tlogWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Duty(ctx) }()
	var once atomic.Bool
	stop = func() {
		if once.CompareAndSwap(false, true) {
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// taskKeys returns the keys of the tasks of kind.
func taskKeys(t *testing.T, st *mongostore.Store, kind string) []string {
	t.Helper()
	cur, err := st.Database().Collection(mongostore.TasksCollection).Find(t.Context(), bson.D{{Key: "kind", Value: kind}},
		options.Find().SetProjection(bson.D{{Key: "key", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		Key string `bson:"key"`
	}
	if err := cur.All(t.Context(), &docs); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(docs))
	for i, d := range docs {
		keys[i] = d.Key
	}
	slices.Sort(keys)
	return keys
}

// expectedKeys reads coll's change stream from the start, as a witness
// apart from the runner, and returns the key of every change of ops that
// match (a document of match true; deletes always).
func expectedKeys(t *testing.T, coll *mongo.Collection, name string, ops []string, match func(bson.Raw) bool) []string {
	t.Helper()
	cs, err := coll.Watch(t.Context(), mongo.Pipeline{}, options.ChangeStream().SetFullDocument(options.UpdateLookup).
		SetStartAtOperationTime(&bson.Timestamp{T: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())
	var keys []string
	for cs.TryNext(t.Context()) {
		op := cs.Current.Lookup("operationType").StringValue()
		if !slices.Contains(ops, op) {
			continue
		}
		if doc, ok := cs.Current.Lookup("fullDocument").DocumentOK(); op != task.OpDelete && (!ok || !match(doc)) {
			continue
		}
		keys = append(keys, trigger.ChangeKey(name, task.Token(cs.Current.Lookup("_id").Document())))
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

func TestAddRefusesBadInputWritingNothing(t *testing.T) {
	st := openStore(t)
	userCollection(t, st, "orders")
	db := st.Database().Name()
	base := trigger.Trigger{Name: "t1", Collection: db + ".orders", Kind: "order"}
	cases := []struct {
		name  string
		edit  func(*trigger.Trigger)
		field string
	}{
		{"unknown collection", func(tr *trigger.Trigger) { tr.Collection = db + ".nope" }, "collection:"},
		{"no dot", func(tr *trigger.Trigger) { tr.Collection = "orders" }, "collection:"},
		{"leasepool's tasks", func(tr *trigger.Trigger) { tr.Collection = db + "." + mongostore.TasksCollection }, "collection:"},
		{"leasepool's documents", func(tr *trigger.Trigger) { tr.Collection = db + "." + mongostore.DocumentsCollection }, "collection:"},
		{"server's own", func(tr *trigger.Trigger) { tr.Collection = "local.oplog.rs" }, "collection:"},
		{"filter not JSON", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`{"a":`) }, "filter:"},
		{"filter not an object", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`[1]`) }, "filter:"},
		{"filter unknown top operator", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`{"$foo": 1}`) }, "filter:"},
		{"filter unknown field operator", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`{"a": {"$bogus": 1}}`) }, "filter.a:"},
		{"filter $in not an array", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`{"a": {"$in": 1}}`) }, "filter.a.$in:"},
		{"filter $or empty", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`{"$or": []}`) }, "filter.$or:"},
		{"filter $where", func(tr *trigger.Trigger) { tr.Filter = json.RawMessage(`{"$where": "1"}`) }, "filter:"},
		{"operation", func(tr *trigger.Trigger) { tr.Operations = []string{"insert", "upsert"} }, "operations:"},
		{"kind", func(tr *trigger.Trigger) { tr.Kind = "" }, "kind:"},
		{"name", func(tr *trigger.Trigger) { tr.Name = "a:b" }, "name:"},
		{"run_at", func(tr *trigger.Trigger) { tr.Options.RunAt = time.Now() }, "run_at:"},
		{"lock key", func(tr *trigger.Trigger) { tr.Options.LockKeys = []string{""} }, "lock"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := base
			c.edit(&tr)
			_, err := trigger.Add(t.Context(), st, tr, false)
			if !errors.Is(err, task.ErrInvalid) {
				t.Fatalf("Add: %v, want task.ErrInvalid", err)
			}
			if msg := err.Error(); !strings.Contains(msg, c.field) || strings.Contains(msg, "\n") {
				t.Errorf("Add: %q, want one line naming %q", msg, c.field)
			}
		})
	}
	for _, ns := range []string{trigger.Namespace, trigger.PositionNamespace} {
		if docs, err := st.Documents(t.Context(), ns); err != nil || len(docs) != 0 {
			t.Errorf("documents of %s after refused adds: %d (%v), want none", ns, len(docs), err)
		}
	}
	// The good one passes, so the refusals above were for their field.
	if _, err := trigger.Add(t.Context(), st, base, false); err != nil {
		t.Fatalf("Add of the valid trigger: %v", err)
	}
	if _, err := trigger.Add(t.Context(), st, base, false); !errors.Is(err, trigger.ErrExists) {
		t.Fatalf("second Add: %v, want ErrExists", err)
	}
}

// TestOneTaskPerMatchingChange publishes for inserts, updates and deletes
// of matching documents only, then stops the runner, writes more, and
// starts another: the changes made while none ran publish, and nothing
// publishes twice (the keys of a second runner's replay are the first's).
func TestOneTaskPerMatchingChange(t *testing.T) {
	st := openStore(t)
	coll := userCollection(t, st, "orders")
	name := "orders"
	ops := []string{task.OpInsert, task.OpUpdate, task.OpDelete}
	added, err := trigger.Add(t.Context(), st, trigger.Trigger{Name: name, Collection: st.Database().Name() + ".orders",
		Filter: json.RawMessage(`{"match": true}`), Operations: ops, Kind: "order-changed", Fields: []string{"n"},
		Options: task.Options{Priority: 3, LockKeys: []string{"orders"}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if added.Since.IsZero() || !slices.Equal(added.Operations, ops) {
		t.Fatalf("added: %+v", added)
	}
	match := func(d bson.Raw) bool { v, ok := d.Lookup("match").BooleanOK(); return ok && v }
	write := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := coll.InsertOne(t.Context(), bson.D{{Key: "_id", Value: i}, {Key: "match", Value: i%2 == 0}, {Key: "n", Value: 0}, {Key: "x", Value: "y"}}); err != nil {
				t.Fatal(err)
			}
			if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := runRunner(t, st)
	write(0, 20)
	if _, err := coll.DeleteOne(t.Context(), bson.D{{Key: "_id", Value: 19}}); err != nil {
		t.Fatal(err)
	}
	want := expectedKeys(t, coll, name, ops, match)
	if len(want) != 21 { // 10 matching inserts, 10 matching updates, 1 delete
		t.Fatalf("witness saw %d matching changes, want 21", len(want))
	}
	testutil.Eventually(t, 20*time.Second, "a task per matching change", func() bool { return len(taskKeys(t, st, "order-changed")) >= len(want) })
	if got := taskKeys(t, st, "order-changed"); !slices.Equal(got, want) {
		t.Fatalf("task keys:\n got %q\nwant %q", got, want)
	}
	stop()

	write(20, 40) // no runner: these wait in the server's history
	want = expectedKeys(t, coll, name, ops, match)
	runRunner(t, st)
	testutil.Eventually(t, 20*time.Second, "the changes made while no runner ran", func() bool { return len(taskKeys(t, st, "order-changed")) >= len(want) })
	if got := taskKeys(t, st, "order-changed"); !slices.Equal(got, want) {
		t.Fatalf("task keys after the restart:\n got %q\nwant %q", got, want)
	}
	// A payload: the named field with _id; and the task's options.
	tk, err := st.Get(t.Context(), want[0])
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(tk.Payload, &p); err != nil {
		t.Fatal(err)
	}
	if _, ok := p["_id"]; !ok || len(p) > 2 || p["x"] != nil {
		t.Errorf("payload %s: want _id and n only", tk.Payload)
	}
	if tk.Priority != 3 || !slices.Equal(tk.LockKeys, []string{"orders"}) {
		t.Errorf("task options: priority %d, lock keys %q", tk.Priority, tk.LockKeys)
	}
	infos, err := trigger.List(t.Context(), st)
	if err != nil || len(infos) != 1 || len(infos[0].Position.Token) == 0 {
		t.Fatalf("List: %+v %v, want one trigger with a stored position", infos, err)
	}
}

// TestRescanWhenHistoryIsLost stores a position the server cannot resume
// from: the runner rescans the matching documents, one task each, and a
// second rescan publishes nothing new for the documents unchanged.
func TestRescanWhenHistoryIsLost(t *testing.T) {
	st := openStore(t)
	coll := userCollection(t, st, "items")
	name := "items"
	if _, err := trigger.Add(t.Context(), st, trigger.Trigger{Name: name, Collection: st.Database().Name() + ".items",
		Filter: json.RawMessage(`{"n": {"$gte": 5}}`), Kind: "item", VersionField: "v"}, false); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := coll.InsertOne(t.Context(), bson.D{{Key: "_id", Value: fmt.Sprintf("i%02d", i)}, {Key: "n", Value: i}, {Key: "v", Value: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	lose := func() {
		t.Helper()
		// Not a BSON document: the store answers task.ErrHistoryLost, as
		// MongoDB does for a position past its oplog.
		var p trigger.Position
		d, err := st.GetDocument(t.Context(), trigger.PositionNamespace, name)
		if errors.Is(err, task.ErrNotFound) {
			d = task.Document{Namespace: trigger.PositionNamespace, ID: name}
		} else if err != nil {
			t.Fatal(err)
		} else if err := json.Unmarshal(d.Value, &p); err != nil {
			t.Fatal(err)
		}
		p.Token = task.Token("gone")
		d.Value, _ = json.Marshal(p)
		if _, err := st.PutDocument(task.WithInternalWrite(t.Context()), d); err != nil {
			t.Fatal(err)
		}
	}
	rescans := func() int {
		infos, err := trigger.List(t.Context(), st)
		if err != nil || len(infos) != 1 || infos[0].Position.Rescan == nil || !infos[0].Position.Rescan.Done {
			return 0
		}
		return infos[0].Position.Rescan.Count
	}
	scanKeys := func() (scan, change int) {
		for _, k := range taskKeys(t, st, "item") {
			if strings.HasPrefix(k, "trigger:items:scan:") {
				scan++
			} else {
				change++
			}
		}
		return scan, change
	}
	lose()
	stop := runRunner(t, st)
	testutil.Eventually(t, 20*time.Second, "a rescan done", func() bool { return rescans() == 1 })
	if scan, _ := scanKeys(); scan != 5 {
		t.Fatalf("rescan published %d tasks, want 5 (n from 5 to 9)", scan)
	}
	// Changes after the rescan publish from the stream (which starts a
	// second before the scan, so the inserts of that second publish
	// again under their change keys: see docs/triggers.md).
	_, before := scanKeys()
	if _, err := coll.UpdateOne(t.Context(), bson.D{{Key: "_id", Value: "i07"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "v", Value: 2}}}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the update after the rescan", func() bool { _, c := scanKeys(); return c > before })
	stop()

	lose()
	runRunner(t, st)
	testutil.Eventually(t, 20*time.Second, "a second rescan done", func() bool { return rescans() == 2 })
	// Only i07 changed version since the first rescan.
	if scan, _ := scanKeys(); scan != 6 {
		t.Fatalf("after the second rescan: %d scan tasks, want 6 (one new, for the document whose version moved)", scan)
	}
}

func TestPauseResumeRemove(t *testing.T) {
	st := openStore(t)
	coll := userCollection(t, st, "jobs")
	name := "jobs"
	if _, err := trigger.Add(t.Context(), st, trigger.Trigger{Name: name, Collection: st.Database().Name() + ".jobs", Kind: "job"}, false); err != nil {
		t.Fatal(err)
	}
	runRunner(t, st)
	insert := func(id int) {
		if _, err := coll.InsertOne(t.Context(), bson.D{{Key: "_id", Value: id}}); err != nil {
			t.Fatal(err)
		}
	}
	insert(1)
	testutil.Eventually(t, 20*time.Second, "the first task", func() bool { return len(taskKeys(t, st, "job")) == 1 })
	if tr, err := trigger.Pause(t.Context(), st, name); err != nil || !tr.Paused {
		t.Fatalf("Pause: %+v %v", tr, err)
	}
	// The runner stops following within a poll; what is written while
	// paused publishes on resume, from the stored position.
	insert(2)
	if _, err := trigger.Resume(t.Context(), st, name); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the change made while paused", func() bool { return len(taskKeys(t, st, "job")) == 2 })
	if err := trigger.Remove(t.Context(), st, name); err != nil {
		t.Fatal(err)
	}
	if _, err := trigger.Get(t.Context(), st, name); !errors.Is(err, trigger.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
	if err := trigger.Remove(t.Context(), st, name); !errors.Is(err, trigger.ErrNotFound) {
		t.Fatalf("second Remove: %v", err)
	}
	if _, err := trigger.Pause(t.Context(), st, "nope"); !errors.Is(err, trigger.ErrNotFound) {
		t.Fatalf("Pause of none: %v", err)
	}
}

// A trigger replaced onto another collection starts there from the
// replace; replaced on the same one, it keeps its position.
func TestReplaceKeepsPositionOnItsCollectionOnly(t *testing.T) {
	st := openStore(t)
	a, b := userCollection(t, st, "a"), userCollection(t, st, "b")
	db := st.Database().Name()
	tr := trigger.Trigger{Name: "r", Collection: db + ".a", Kind: "r"}
	if _, err := trigger.Add(t.Context(), st, tr, false); err != nil {
		t.Fatal(err)
	}
	stop := runRunner(t, st)
	if _, err := a.InsertOne(t.Context(), bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "a's task and a stored position", func() bool {
		infos, err := trigger.List(t.Context(), st)
		return err == nil && len(infos) == 1 && len(infos[0].Position.Token) > 0 && len(taskKeys(t, st, "r")) == 1
	})
	stop()
	tr.Filter = json.RawMessage(`{"x": 1}`)
	if _, err := trigger.Add(t.Context(), st, tr, true); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetDocument(t.Context(), trigger.PositionNamespace, "r"); err != nil {
		t.Fatalf("position after a replace on the same collection: %v", err)
	}
	tr.Collection, tr.Filter = db+".b", nil
	if _, err := trigger.Add(t.Context(), st, tr, true); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetDocument(t.Context(), trigger.PositionNamespace, "r"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("position after a replace onto another collection: %v, want none", err)
	}
	runRunner(t, st)
	if _, err := b.InsertOne(t.Context(), bson.D{{Key: "_id", Value: 2}}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "b's task", func() bool { return len(taskKeys(t, st, "r")) == 2 })
}
