package testservers_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/testservers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func connect(t *testing.T, uri string) *mongo.Client {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(10 * time.Second))
	if err != nil {
		t.Fatalf("connect %s: %v", uri, err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

func TestSharedServers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t, testservers.MongoURI(t))
	if err := c.Ping(ctx, nil); err != nil {
		t.Fatalf("ping mongo: %v", err)
	}
	u, err := url.Parse(testservers.MQTTURL(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatalf("dial mqtt: %v", err)
	}
	conn.Close()
}

// An H2-backed server keeps its data and its oplog across a clean stop and
// restart.
func TestStartMongoH2Restart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	uri, stop, restart := testservers.StartMongo(t, filepath.Join(t.TempDir(), "data.mv"))

	c := connect(t, uri)
	coll := c.Database("db").Collection("c")
	cs, err := coll.Watch(ctx, mongo.Pipeline{})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "x"} {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "n", Value: 1}}); err != nil {
			t.Fatalf("insert: %v", err)
		}
	}
	afterA := readEvents(t, ctx, cs, 1)[0].ID
	cs.Close(ctx)
	stop()
	stop() // twice is fine
	restart()

	var got struct {
		N int `bson:"n"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "a"}}).Decode(&got); err != nil {
		t.Fatalf("find after restart: %v", err)
	}
	if got.N != 1 {
		t.Fatalf("n = %d after restart, want 1", got.N)
	}
	// And so does its oplog: a stream resumed after a's insert reads x's,
	// written before the stop.
	resumed, err := coll.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetResumeAfter(afterA))
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close(ctx)
	if e := readEvents(t, ctx, resumed, 1)[0]; e.key() != "x" {
		t.Fatalf("resumed after a's insert across a restart: read %s %s, want x's insert", e.OperationType, e.key())
	}
}

// changeEvent is what the tests below read of a change event.
type changeEvent struct {
	ID            bson.Raw       `bson:"_id"`
	OperationType string         `bson:"operationType"`
	ClusterTime   bson.Timestamp `bson:"clusterTime"`
	DocumentKey   struct {
		ID string `bson:"_id"`
	} `bson:"documentKey"`
	FullDocument struct {
		ID string `bson:"_id"`
		N  int    `bson:"n"`
	} `bson:"fullDocument"`
}

// key is the _id of the event's document: the server puts an update's
// operators, not its _id, in documentKey, so an update's is its full
// document's.
func (e changeEvent) key() string {
	if e.OperationType == "update" {
		return e.FullDocument.ID
	}
	return e.DocumentKey.ID
}

// readEvents reads n events from cs, failing t if they do not come
// within a minute.
func readEvents(t *testing.T, ctx context.Context, cs *mongo.ChangeStream, n int) []changeEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out []changeEvent
	for len(out) < n && cs.Next(ctx) {
		var e changeEvent
		if err := cs.Decode(&e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	if len(out) < n {
		t.Fatalf("read %d of %d change events: %v", len(out), n, cs.Err())
	}
	return out
}

// TestMongoChangeStreamsUnderConcurrentWrites: the launcher indexes the
// server's oplog reads (tests/mongo/Launcher.java). Eight writers insert
// and then update documents of two collections at once; a stream on one
// collection reads each of its inserts and updates once, none of the
// other collection, in the oplog's order, each update with the document
// as stored; and a stream resumed after any one of those events reads
// exactly the ones after it.
func TestMongoChangeStreamsUnderConcurrentWrites(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	uri, _, _ := testservers.StartMongo(t, "")
	db := connect(t, uri).Database("db")
	watched, other := db.Collection("watched"), db.Collection("other")
	cs, err := watched.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetFullDocument(options.UpdateLookup))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close(context.Background())
	const writers, each = 8, 100
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			errs <- func() error {
				for i := range each {
					coll := watched
					if i%2 == 1 {
						coll = other
					}
					id := fmt.Sprintf("%s-%d-%03d", coll.Name(), w, i)
					if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "n", Value: 0}}); err != nil {
						return err
					}
					if _, err := coll.UpdateByID(ctx, id, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 1}}}}); err != nil {
						return err
					}
				}
				return nil
			}()
		}()
	}
	// Read while they write: a read that saw an entry before an earlier
	// one was added would step over it.
	want := writers * each // half inserts, half updates of the watched collection
	events := readEvents(t, ctx, cs, want)
	for range writers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]int{}
	for i, e := range events {
		if !strings.HasPrefix(e.key(), "watched-") {
			t.Fatalf("event %d is of %q, not of the watched collection", i, e.key())
		}
		if i > 0 && e.ClusterTime.Compare(events[i-1].ClusterTime) <= 0 {
			t.Fatalf("event %d at %v, after event %d at %v", i, e.ClusterTime, i-1, events[i-1].ClusterTime)
		}
		if e.OperationType == "update" && e.FullDocument.N != 1 {
			t.Fatalf("update of %s has full document %+v, want the stored one with n 1", e.key(), e.FullDocument)
		}
		seen[e.OperationType+" "+e.key()]++
	}
	if len(seen) != want {
		t.Fatalf("%d distinct events of %d", len(seen), want)
	}
	for _, at := range []int{0, want / 3, want - 1} {
		resumed, err := watched.Watch(ctx, mongo.Pipeline{}, options.ChangeStream().SetFullDocument(options.UpdateLookup).SetResumeAfter(events[at].ID))
		if err != nil {
			t.Fatal(err)
		}
		rest := readEvents(t, ctx, resumed, len(events)-at-1)
		for i, e := range rest {
			if w := events[at+1+i]; e.ClusterTime != w.ClusterTime || e.key() != w.key() {
				t.Fatalf("resumed after event %d: event %d is %s %s, want %s %s", at, i, e.OperationType, e.key(), w.OperationType, w.key())
			}
		}
		// And nothing more: a marker written now is the next event (and
		// one of those the next resumed stream reads).
		marker := fmt.Sprintf("marker-%d", at)
		if _, err := watched.InsertOne(ctx, bson.D{{Key: "_id", Value: marker}}); err != nil {
			t.Fatal(err)
		}
		e := readEvents(t, ctx, resumed, 1)[0]
		if e.key() != marker {
			t.Fatalf("resumed after event %d: after the last write, read %s %s, want the marker", at, e.OperationType, e.key())
		}
		events = append(events, e)
		resumed.Close(context.Background())
	}
}
