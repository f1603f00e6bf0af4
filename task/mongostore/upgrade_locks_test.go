package mongostore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/storetest"
)

// TestUpgradeMovesLocksToNamespaces loads testdata/locks-v10.json, the
// tasks, locks and lock_lines collections of a database written by the
// program before lock namespaces while it held a task's lock key and its
// line, a rate-limit slot and three singletons' leases (see
// storetest.UpgradedLocks), and checks that Open moves the slot and the
// leases to their namespaces, held as before; and that a later Open leaves
// a task's own lock key rate:kind:k#0 where it is.
func TestUpgradeMovesLocksToNamespaces(t *testing.T) {
	uri := testservers.MongoURI(t)
	cfg := mongostore.Config{Database: freshDB()}
	st := open(t, uri, cfg)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Database().Drop(ctx)
	})
	raw, err := os.ReadFile("testdata/locks-v10.json")
	if err != nil {
		t.Fatal(err)
	}
	var fixture map[string][]json.RawMessage
	if err := json.Unmarshal(raw, &fixture); err != nil {
		t.Fatal(err)
	}
	for coll, docs := range fixture {
		for _, d := range docs {
			var doc bson.D
			if err := bson.UnmarshalExtJSON(d, true, &doc); err != nil {
				t.Fatalf("%s: %v", coll, err)
			}
			if _, err := st.Database().Collection(coll).InsertOne(t.Context(), doc); err != nil {
				t.Fatalf("insert into %s: %v", coll, err)
			}
		}
	}
	upgraded := open(t, uri, cfg)
	storetest.UpgradedLocks(t, upgraded)

	again := open(t, uri, cfg)
	now := again.Now()
	p := task.LockParams{Keys: []string{"rate:kind:k#0"}, Holder: task.Holder{TaskKey: "third", WorkerID: "w3"}, Now: now, Until: now.Add(time.Minute)}
	var le *task.LockedError
	if err := again.AcquireLocks(t.Context(), p); !errors.As(err, &le) || le.Namespace != task.LockTask || le.Holder.TaskKey != "other" {
		t.Fatalf("the task lock rate:kind:k#0 after a second Open: %v; want it held by task other", err)
	}
	p.Namespace, p.Keys = task.LockRate, []string{"kind:k#0"}
	if err := again.AcquireLocks(t.Context(), p); !errors.As(err, &le) || le.Namespace != task.LockRate || le.Holder.TaskKey != "limited" {
		t.Fatalf("the slot kind:k#0 after a second Open: %v; want it held by task limited", err)
	}
}
