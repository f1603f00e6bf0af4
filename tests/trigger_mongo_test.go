package tests

// Triggers end to end on the MongoDB wire test server: `leasepool trigger
// add`, a writer process changing the collection, and `leasepool worker`
// processes (the elected one runs the trigger) SIGKILLed and restarted.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/trigger"
	"github.com/leasepool/leasepool/worker"
)

// triggerChanges is how many changes the kill test makes:
// LEASEPOOL_TRIGGER_CHANGES, default 10,000.
func triggerChanges(t *testing.T) int {
	n := 10_000
	if v := os.Getenv("LEASEPOOL_TRIGGER_CHANGES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 10 {
			t.Fatalf("LEASEPOOL_TRIGGER_CHANGES=%q: want a number of at least 10", v)
		}
	}
	return n
}

// triggerSetup is a fresh database with a collection "orders" and the
// trigger "orders" on it: matching documents (match true), inserts and
// updates, kind order-changed (which no worker runs, so every task stays
// to be counted).
func triggerSetup(t *testing.T, ctx context.Context) (uri string, st *mongostore.Store, coll *mongo.Collection) {
	t.Helper()
	// A server of the test's own: the shared one serves every other
	// test's writes and change streams beside this one's, and so would
	// measure the other tests.
	base, _, _ := testservers.StartMongo(t, "")
	uri = mongoDBURI(t, base)
	st = openMongoStore(t, ctx, uri, nil)
	t.Cleanup(func() { _ = st.Database().Drop(context.Background()) })
	if err := st.Database().CreateCollection(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(leasepoolBin(t), "--store", uri, "trigger", "add", "orders",
		"--collection", st.Database().Name()+".orders", "--filter", `{"match": true}`, "--operations", "insert,update",
		"--kind", "order-changed").CombinedOutput()
	if err != nil {
		t.Fatalf("trigger add: %v\n%s", err, out)
	}
	return uri, st, st.Database().Collection("orders")
}

// orderTaskKeys returns the keys of the trigger's tasks, sorted.
func orderTaskKeys(t *testing.T, ctx context.Context, st *mongostore.Store) []string {
	t.Helper()
	cur, err := st.Database().Collection(mongostore.TasksCollection).Find(ctx, bson.D{{Key: "kind", Value: "order-changed"}},
		options.Find().SetProjection(bson.D{{Key: "key", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		Key string `bson:"key"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(docs))
	for i, d := range docs {
		keys[i] = d.Key
	}
	sort.Strings(keys)
	return keys
}

func countOrderTasks(t *testing.T, ctx context.Context, st *mongostore.Store) int {
	t.Helper()
	n, err := st.Database().Collection(mongostore.TasksCollection).CountDocuments(ctx, bson.D{{Key: "kind", Value: "order-changed"}})
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// witnessKeys reads the collection's whole change stream apart from the
// workers and returns the key of every insert and update of a matching
// document (the match field never changes, so the looked-up document
// tells), and how many changes it read in all.
func witnessKeys(t *testing.T, ctx context.Context, coll *mongo.Collection) (keys []string, all int) {
	t.Helper()
	cs, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetFullDocument(options.UpdateLookup).
		SetStartAtOperationTime(&bson.Timestamp{T: 1}).SetBatchSize(1000))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())
	for cs.TryNext(ctx) {
		all++
		op := cs.Current.Lookup("operationType").StringValue()
		doc, ok := cs.Current.Lookup("fullDocument").DocumentOK()
		if !ok || (op != task.OpInsert && op != task.OpUpdate) {
			continue
		}
		if m, ok := doc.Lookup("match").BooleanOK(); ok && m {
			keys = append(keys, trigger.ChangeKey("orders", task.Token(cs.Current.Lookup("_id").Document())))
		}
	}
	if err := cs.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	return keys, all
}

// TestMongoTriggerSurvivesKills: a writer process makes the changes
// while the worker running the trigger (the election's lease holder,
// beside a standby) is SIGKILLed 10 times, each time at a random point
// of the publishing, and a new one started: every
// matching change has exactly one task (the keys are the witness's, one
// each), and no change the filter excludes has one.
func TestMongoTriggerSurvivesKills(t *testing.T) {
	ctx := t.Context()
	n := triggerChanges(t)
	uri, st, coll := triggerSetup(t, ctx)
	u, _ := url.Parse(uri)
	writer := exec.Command(buildBinary(t, "./testdata/triggerwriter"), "-uri", uri, "-db", strings.TrimPrefix(u.Path, "/"),
		"-coll", "orders", "-n", strconv.Itoa(n))
	start := time.Now()
	// Two workers live at once, the elected one and a standby: a kill then
	// costs the rest of the election's lease, the replacement's process
	// start overlapping it rather than following it. Each kill is of the
	// lease's holder, told by the store.
	live, started := map[string]*workerProc{}, 0
	standby := func() {
		id := fmt.Sprintf("trig-%d", started)
		live[id] = startWorker(t, uri, id)
		started++
	}
	standby()
	standby()
	writerOut := make(chan error, 1)
	go func() {
		out, err := writer.CombinedOutput()
		if err == nil && !strings.Contains(string(out), fmt.Sprintf("done %d", n)) {
			err = fmt.Errorf("output %q", out)
		}
		writerOut <- err
	}()
	// Inserts are half the changes, three in four of them matching, and
	// so are the updates, about: kill k falls once about k/11 of that has
	// published, give or take a random 1/22.
	expect := n * 3 / 4
	for k := 1; k <= 10; k++ {
		at := k*expect/11 + rand.IntN(expect/22+1) - expect/44
		eventually(t, 3*time.Minute, fmt.Sprintf("%d tasks published before kill %d", at, k), func() bool {
			return countOrderTasks(t, ctx, st) >= at
		})
		var holder string
		eventually(t, time.Minute, fmt.Sprintf("a live worker holding the election's lease at kill %d", k), func() bool {
			h, err := leaseHolder(t, st, worker.ElectionKey)
			holder = h
			return err == nil && live[h] != nil
		})
		live[holder].kill(t)
		delete(live, holder)
		t.Logf("kill %d of %s at %d tasks (%s)", k, holder, countOrderTasks(t, ctx, st), time.Since(start).Round(time.Millisecond))
		standby()
	}
	if err := <-writerOut; err != nil {
		t.Fatalf("writer: %v", err)
	}
	want, all := witnessKeys(t, ctx, coll)
	if all != n {
		t.Fatalf("the witness read %d changes, the writer made %d", all, n)
	}
	eventually(t, 3*time.Minute, fmt.Sprintf("%d tasks", len(want)), func() bool { return countOrderTasks(t, ctx, st) >= len(want) })
	elapsed := time.Since(start)
	got := orderTaskKeys(t, ctx, st)
	lost, extra := diff(want, got), diff(got, want)
	t.Logf("%d changes, %d matching, %d tasks, %d lost, %d not of a matching change, in %s with 10 kills",
		n, len(want), len(got), len(lost), len(extra), elapsed.Round(time.Millisecond))
	if len(lost) > 0 || len(extra) > 0 || len(got) != len(want) {
		t.Fatalf("lost %d (%q...), extra %d (%q...)", len(lost), head(lost), len(extra), head(extra))
	}
	// The payloads say the same: none is of a document the filter
	// excludes.
	excluded, err := st.Database().Collection(mongostore.TasksCollection).CountDocuments(ctx,
		bson.D{{Key: "kind", Value: "order-changed"}, {Key: "payload.match", Value: bson.D{{Key: "$ne", Value: true}}}})
	if err != nil || excluded != 0 {
		t.Fatalf("%d tasks of documents the filter excludes (%v)", excluded, err)
	}
}

// diff is what a has and b has not; both sorted.
func diff(a, b []string) []string {
	var out []string
	for _, k := range a {
		if _, ok := slices.BinarySearch(b, k); !ok {
			out = append(out, k)
		}
	}
	return out
}

func head(s []string) []string { return s[:min(len(s), 3)] }

// TestMongoTriggerLag prints the change-to-publish lag (the task's
// created_at, stamped by the publishing worker, less the written_at the
// writer put in the document; one host, one clock) at p50 and p99: for
// changes made one at a time, each after the previous one's task, and
// for a burst of inserts from the writer process. It asserts only that
// every change published; the figures are printed, not judged.
func TestMongoTriggerLag(t *testing.T) {
	ctx := t.Context()
	uri, st, coll := triggerSetup(t, ctx)
	startWorker(t, uri, "lag-0")
	const single = 200
	for i := range single {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: fmt.Sprintf("s%03d", i)}, {Key: "match", Value: true},
			{Key: "n", Value: 0}, {Key: "written_at", Value: time.Now().UnixNano()}}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, fmt.Sprintf("task %d", i+1), func() bool { return countOrderTasks(t, ctx, st) == i+1 })
	}
	one := insertLags(t, ctx, st)
	n := min(triggerChanges(t), 2000) // past a worker's pace, the lag is the backlog's
	u, _ := url.Parse(uri)
	start := time.Now()
	out, err := exec.Command(buildBinary(t, "./testdata/triggerwriter"), "-uri", uri, "-db", strings.TrimPrefix(u.Path, "/"),
		"-coll", "orders", "-n", strconv.Itoa(n)).CombinedOutput()
	if err != nil {
		t.Fatalf("writer: %v\n%s", err, out)
	}
	wrote := time.Since(start)
	want, _ := witnessKeys(t, ctx, coll)
	eventually(t, 3*time.Minute, fmt.Sprintf("%d tasks", len(want)), func() bool { return countOrderTasks(t, ctx, st) >= len(want) })
	published := time.Since(start)
	burst := insertLags(t, ctx, st)[len(one):]
	report := fmt.Sprintf("trigger lag, change to publish (a wire test server of its own, race detector on):\n"+
		"  one at a time: %d changes, p50 %s, p99 %s\n"+
		"  burst: %d changes (%d matching) written in %s, all published in %s; its %d inserts: p50 %s, p99 %s",
		len(one), pct(one, 50), pct(one, 99), n, len(want), wrote.Round(time.Millisecond), published.Round(time.Millisecond),
		len(burst), pct(burst, 50), pct(burst, 99))
	t.Log(report)
	fmt.Println(report)
}

// insertLags returns the lag of every insert's task, in publish order.
// An insert's payload is the document as inserted (n 0); an update's is
// looked up later and may carry a later write's written_at, so updates
// are left out.
func insertLags(t *testing.T, ctx context.Context, st *mongostore.Store) []time.Duration {
	t.Helper()
	cur, err := st.Database().Collection(mongostore.TasksCollection).Find(ctx,
		bson.D{{Key: "kind", Value: "order-changed"}, {Key: "payload.n", Value: 0}}, options.Find().SetSort(bson.D{{Key: "seq", Value: 1}}))
	if err != nil {
		t.Fatal(err)
	}
	var docs []struct {
		CreatedAt time.Time `bson:"created_at"`
		Payload   struct {
			WrittenAt int64 `bson:"written_at"`
		} `bson:"payload"`
	}
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatal(err)
	}
	out := make([]time.Duration, len(docs))
	for i, d := range docs {
		out[i] = d.CreatedAt.Sub(time.Unix(0, d.Payload.WrittenAt))
	}
	return out
}

// pct is the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(time.Millisecond)
}
