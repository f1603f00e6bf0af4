package mongostore_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
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
	st, cfg := openFresh(t, uri)
	var fixture map[string][]json.RawMessage
	readFixture(t, "testdata/locks-v10.json", &fixture)
	for coll, docs := range fixture {
		insertFixture(t, st, coll, docs)
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
