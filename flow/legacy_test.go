package flow

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestLegacyFlowsAreAdoptedSQLite opens testdata/v9-flows.db, written by
// the program that kept flows as tasks (flow old running at step a, flow
// done cancelled): both are adopted as documents, their tasks retired
// (cancelled, marked moved), old moves on, and done, once deleted by
// flow retention, does not come back from its task.
func TestLegacyFlowsAreAdoptedSQLite(t *testing.T) {
	fixture, err := os.ReadFile("testdata/v9-flows.db")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "s.db")
	if err := os.WriteFile(path, fixture, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := sqlitestore.Open(t.Context(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	checkAdoption(t, s)
}

// TestLegacyFlowsAreAdoptedMongo: a MongoDB database holding a flow as a
// task, as the program before documents wrote it (its first step task not
// published yet: a crash in between), is adopted and repaired.
func TestLegacyFlowsAreAdoptedMongo(t *testing.T) {
	uri := testservers.MongoURI(t)
	ctx := t.Context()
	s, err := mongostore.Open(ctx, uri, &mongostore.Config{Database: "flow_legacy_" + time.Now().Format("150405.000000000")[7:]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = s.Database().Drop(context.Background())
		s.Close()
	})
	// The flows' JSON as stored, made on a scratch store.
	scratch := openStore(t)
	for _, key := range []string{"old", "done"} {
		if _, _, err := Publish(ctx, scratch, Spec{Key: key, Steps: []Step{{Name: "a", Action: Action{Kind: "noop"}}, {Name: "b", Action: Action{Kind: "noop"}}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Cancel(ctx, scratch, "done", false); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"old", "done"} {
		d, err := scratch.GetDocument(ctx, Namespace, key)
		if err != nil {
			t.Fatal(err)
		}
		legacy, _, err := task.Publish(task.WithInternalWrite(ctx), s, task.PublishParams{Key: legacyPrefix + key, Kind: legacyKind,
			Payload: d.Value, Options: task.Options{SpecificWorkerIDs: []string{"leasepool:flow-documents"}}})
		if err != nil {
			t.Fatal(err)
		}
		if key == "done" {
			if _, err := task.Cancel(ctx, s, legacy.Key); err != nil {
				t.Fatal(err)
			}
		}
	}
	checkAdoption(t, s)
}

func checkAdoption(t *testing.T, s task.Store) {
	t.Helper()
	ctx := t.Context()
	fs, err := List(ctx, s, ListQuery{})
	if err != nil || len(fs) != 2 || fs[0].Key != "old" || fs[1].Key != "done" {
		t.Fatalf("List after the upgrade: %d flows, %v; want old and done", len(fs), err)
	}
	if fs[0].State != StateRunning || fs[1].State != StateCancelled {
		t.Fatalf("adopted flows: old %s, done %s; want running, cancelled", fs[0].State, fs[1].State)
	}
	for _, key := range []string{"old", "done"} {
		tk, err := s.Get(ctx, legacyPrefix+key)
		if err != nil || tk.State != task.StateCancelled || string(tk.Payload) != string(movedMarker) {
			t.Fatalf("legacy task of %s after adoption: %+v, %v; want cancelled and marked moved", key, tk, err)
		}
	}
	if active, err := List(ctx, s, ListQuery{Active: true}); err != nil || len(active) != 1 || active[0].Key != "old" {
		t.Fatalf("List(Active) after adoption: %d, %v; want old", len(active), err)
	}
	// old moves on from its adopted document.
	if _, err := Reconcile(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	finish(t, s, StepKey("old", 1, 0, "a", false), true)
	if _, err := Reconcile(ctx, s, nil); err != nil {
		t.Fatal(err)
	}
	mustState(t, s, "old", StateRunning, 1)
	// done, deleted by flow retention, stays deleted.
	if n, err := DeleteStopped(ctx, s, s.Now().Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("DeleteStopped: %d, %v; want done deleted", n, err)
	}
	if fs, err := List(ctx, s, ListQuery{}); err != nil || len(fs) != 1 || fs[0].Key != "old" {
		t.Fatalf("List after done's deletion: %d, %v; want old only", len(fs), err)
	}
	if _, err := Get(ctx, s, "done"); err == nil {
		t.Fatal("Get of a deleted flow whose legacy task remains found it")
	}
}
