package metrics_test

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// openTraffic opens a store through the opener with a StoreTraffic
// registered on a registry of its own.
func openTraffic(t *testing.T, url string) (task.Store, *prometheus.Registry) {
	t.Helper()
	traffic := metrics.NewStoreTraffic()
	reg := prometheus.NewRegistry()
	reg.MustRegister(traffic)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := store.Open(ctx, url, store.Options{Monitor: traffic.Monitor()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, reg
}

// TestStoreTrafficOnMongoDB: a store opened through the opener counts its
// commands and their bytes, and counts change events only from change
// streams: the reply to the stats aggregate and to a listing's find carry
// tasks too and must not count.
func TestStoreTrafficOnMongoDB(t *testing.T) {
	uri := testservers.MongoURI(t) // fails, not skips, without the server
	db := fmt.Sprintf("lp_traffic_%d", time.Now().UnixNano()%1_000_000_000)
	s, reg := openTraffic(t, withDatabase(t, uri, db))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	updates := value(t, reg, "leasepool_store_commands_total", "command", "update")
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "t1", Kind: kind}); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "leasepool_store_commands_total", "command", "update"); got < max(updates, 0)+1 {
		t.Errorf("update commands %v after a publish, want at least %v", got, max(updates, 0)+1)
	}
	for _, dir := range []string{"sent", "received"} {
		if got := value(t, reg, "leasepool_store_bytes_total", "command", "update", "direction", dir); got < 50 {
			t.Errorf("update bytes %s: %v, want a command's and a reply's worth", dir, got)
		}
	}

	// Reads whose replies hold tasks: none is a change event.
	if _, err := s.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(ctx, task.ListQuery{}); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "leasepool_store_change_events_total"); got != 0 {
		t.Fatalf("change events %v with no change stream open, want 0", got)
	}

	cs, err := s.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	for i := range 3 {
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprintf("w%d", i), Kind: kind}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := cs.Next(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "leasepool_store_change_events_total"); got != 3 {
		t.Errorf("change events %v after 3 publishes read from the stream, want 3", got)
	}
	if got := value(t, reg, "leasepool_store_commands_total", "command", "getMore"); got < 1 {
		t.Errorf("getMore commands %v with a change stream read, want at least 1", got)
	}
}

// withDatabase is uri naming database db.
func withDatabase(t *testing.T, uri, db string) string {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	return u.String()
}

// TestStoreTrafficOnEmbeddedStore: a process on an embedded store sends
// no MongoDB commands and exports no MongoDB series.
func TestStoreTrafficOnEmbeddedStore(t *testing.T) {
	s, reg := openTraffic(t, "sqlite:"+filepath.Join(t.TempDir(), "tasks.db"))
	if _, _, err := task.Publish(context.Background(), s, task.PublishParams{Key: "t1", Kind: kind}); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		t.Errorf("series %s exported by a process on an embedded store", f.GetName())
	}
}

// TestStoreTrafficAllocations: counting a change stream's poll (a getMore
// and its reply with a batch) allocates nothing.
func TestStoreTrafficAllocations(t *testing.T) {
	traffic := metrics.NewStoreTraffic()
	mon := traffic.Monitor()
	ctx := context.Background()
	open := mustMarshal(t, bson.D{{Key: "aggregate", Value: "tasks"}, {Key: "pipeline", Value: bson.A{
		bson.D{{Key: "$changeStream", Value: bson.D{{Key: "fullDocument", Value: "updateLookup"}}}}}}})
	opened := mustMarshal(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(7)}, {Key: "firstBatch", Value: bson.A{}}}}})
	mon.Started(ctx, &event.CommandStartedEvent{CommandName: "aggregate", RequestID: 1, Command: open})
	mon.Succeeded(ctx, &event.CommandSucceededEvent{CommandFinishedEvent: event.CommandFinishedEvent{CommandName: "aggregate", RequestID: 1}, Reply: opened})

	getMore := mustMarshal(t, bson.D{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "tasks"}})
	batch := mustMarshal(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(7)},
		{Key: "nextBatch", Value: bson.A{bson.D{{Key: "operationType", Value: "insert"}}, bson.D{{Key: "operationType", Value: "update"}}}}}}})
	started := &event.CommandStartedEvent{CommandName: "getMore", RequestID: 2, Command: getMore}
	succeeded := &event.CommandSucceededEvent{CommandFinishedEvent: event.CommandFinishedEvent{CommandName: "getMore", RequestID: 2}, Reply: batch}
	allocs := testing.AllocsPerRun(1000, func() {
		mon.Started(ctx, started)
		mon.Succeeded(ctx, succeeded)
	})
	if allocs != 0 {
		t.Errorf("%v allocations per counted getMore, want 0", allocs)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(traffic)
	// 1001 runs (AllocsPerRun warms up once) of two events each.
	if got := value(t, reg, "leasepool_store_change_events_total"); got != 2002 {
		t.Errorf("change events %v, want 2002", got)
	}
	// A getMore of another cursor (a find's) is not a change stream's.
	other := mustMarshal(t, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(8)},
		{Key: "nextBatch", Value: bson.A{bson.D{{Key: "key", Value: "t1"}}}}}}})
	mon.Succeeded(ctx, &event.CommandSucceededEvent{CommandFinishedEvent: event.CommandFinishedEvent{CommandName: "getMore", RequestID: 3}, Reply: other})
	// Nor is the stream's cursor once killed.
	kill := mustMarshal(t, bson.D{{Key: "killCursors", Value: "tasks"}, {Key: "cursors", Value: bson.A{int64(7)}}})
	mon.Started(ctx, &event.CommandStartedEvent{CommandName: "killCursors", RequestID: 4, Command: kill})
	mon.Succeeded(ctx, succeeded)
	if got := value(t, reg, "leasepool_store_change_events_total"); got != 2002 {
		t.Errorf("change events %v after a find cursor's and a killed stream's batches, want 2002", got)
	}
	if got := value(t, reg, "leasepool_store_commands_total", "command", "getMore"); got != 1001 {
		t.Errorf("getMore commands %v, want 1001", got)
	}
	if got, want := value(t, reg, "leasepool_store_bytes_total", "command", "getMore", "direction", "sent"), float64(1001*len(getMore)); got != want {
		t.Errorf("getMore bytes sent %v, want %v", got, want)
	}
}

func mustMarshal(t testing.TB, d bson.D) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkStoreTraffic: what counting costs a change stream's poll (a
// getMore and its reply with two events).
func BenchmarkStoreTraffic(b *testing.B) {
	traffic := metrics.NewStoreTraffic()
	mon := traffic.Monitor()
	ctx := context.Background()
	open := mustMarshal(b, bson.D{{Key: "aggregate", Value: "tasks"}, {Key: "pipeline", Value: bson.A{
		bson.D{{Key: "$changeStream", Value: bson.D{}}}}}})
	opened := mustMarshal(b, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(7)}, {Key: "firstBatch", Value: bson.A{}}}}})
	mon.Started(ctx, &event.CommandStartedEvent{CommandName: "aggregate", RequestID: 1, Command: open})
	mon.Succeeded(ctx, &event.CommandSucceededEvent{CommandFinishedEvent: event.CommandFinishedEvent{CommandName: "aggregate", RequestID: 1}, Reply: opened})
	started := &event.CommandStartedEvent{CommandName: "getMore", RequestID: 2,
		Command: mustMarshal(b, bson.D{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "tasks"}})}
	succeeded := &event.CommandSucceededEvent{CommandFinishedEvent: event.CommandFinishedEvent{CommandName: "getMore", RequestID: 2},
		Reply: mustMarshal(b, bson.D{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(7)},
			{Key: "nextBatch", Value: bson.A{bson.D{{Key: "operationType", Value: "insert"}}, bson.D{{Key: "operationType", Value: "update"}}}}}}})}
	b.ReportAllocs()
	for b.Loop() {
		mon.Started(ctx, started)
		mon.Succeeded(ctx, succeeded)
	}
}
