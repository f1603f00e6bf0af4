package sqlitestore

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// TestWritePastItsDeadlineIsNotApplied: the writer refuses a forwarded
// request whose deadline has passed, inside the transaction and writing
// nothing, so that a client that stopped waiting at the deadline can
// learn the outcome from the file once it holds the write lock: an
// acquire applied after its sender gave up and released would hold a
// lock nobody holds.
func TestWritePastItsDeadlineIsNotApplied(t *testing.T) {
	s, err := Open(context.Background(), filepath.Join(t.TempDir(), "s.db"), &Config{DirectWrites: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	past := withFence(context.Background(), s.clock.now())
	future := withFence(context.Background(), s.clock.now()+int64(time.Minute))
	holder := task.Holder{TaskKey: "t", WorkerID: "w", Attempt: 1}
	lock := task.LockParams{Keys: []string{"device"}, Holder: holder, Now: s.Now(), Until: s.Now().Add(time.Minute)}

	if err := s.acquireLocks(past, lock); !errors.Is(err, errNotApplied) {
		t.Fatalf("acquire past its deadline: %v; want errNotApplied", err)
	}
	other := lock
	other.Holder.TaskKey = "u"
	if err := s.acquireLocks(context.Background(), other); err != nil {
		t.Fatalf("the lock a refused acquire named is not free: %v", err)
	}
	doc := task.Document{Namespace: "ns", ID: "d", Value: json.RawMessage(`{}`)}
	if _, err := s.putDocument(past, doc); !errors.Is(err, errNotApplied) {
		t.Fatalf("put past its deadline: %v; want errNotApplied", err)
	}
	if _, err := s.GetDocument(context.Background(), "ns", "d"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("a refused put was stored: %v", err)
	}
	if _, err := s.putDocument(future, doc); err != nil {
		t.Fatalf("put before its deadline: %v", err)
	}
}
