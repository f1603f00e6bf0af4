package retention_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/task/storetest"
)

// TestRun deletes exactly the finished tasks past the default policy, in
// bounded batches, and nothing pending, running or recent.
func TestRun(t *testing.T) {
	ctx := t.Context()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := s.Now()
	day := 24 * time.Hour
	gone := map[string]bool{}
	put := func(key string, state task.State, age time.Duration, deleted bool) {
		storetest.PutTask(t, s, key, "k", state, now.Add(-age))
		gone[key] = deleted
	}
	for i := range 7 {
		put(fmt.Sprintf("ok-old-%d", i), task.StateSucceeded, 25*time.Hour, true)
	}
	put("ok-recent", task.StateSucceeded, 23*time.Hour, false)
	put("failed-old", task.StateFailed, 8*day, true)
	put("failed-2d", task.StateFailed, 2*day, false)
	put("cancelled-old", task.StateCancelled, 25*time.Hour, true)
	put("cancelled-recent", task.StateCancelled, time.Hour, false)
	put("pending-old", task.StatePending, 30*day, false)
	put("running-old", task.StateRunning, 30*day, false) // its lease ran out long ago: still not finished
	put("running", task.StateRunning, 0, false)

	for id, seen := range map[string]time.Duration{"gone": 31 * day, "kept": 29 * day} {
		v := fmt.Sprintf(`{"id":%q,"seen_at":%q}`, id, now.Add(-seen).Format(time.RFC3339Nano))
		if _, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: retention.DeviceStateNamespace, ID: id, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}

	n, err := retention.Run(ctx, retention.Config{Store: s, Batch: 2})
	if err != nil {
		t.Fatal(err)
	}
	if n[task.StateSucceeded] != 7 || n[task.StateFailed] != 1 || n[task.StateCancelled] != 1 || n[retention.DeviceStateNamespace] != 1 {
		t.Errorf("Run deleted %v, want 7 succeeded, 1 failed, 1 cancelled, 1 device state", n)
	}
	if docs, err := s.Documents(ctx, retention.DeviceStateNamespace); err != nil || len(docs) != 1 || docs[0].ID != "kept" {
		t.Errorf("device states after Run: %+v, %v (want only the one seen 29 days ago)", docs, err)
	}
	for key, deleted := range gone {
		_, err := s.Get(ctx, key)
		if deleted != errors.Is(err, task.ErrNotFound) {
			t.Errorf("%s: Get = %v, want deleted=%v", key, err, deleted)
		}
	}

	// A budget stops a run early; the next one carries on.
	for i := range 5 {
		storetest.PutTask(t, s, fmt.Sprintf("more-%d", i), "k", task.StateSucceeded, now.Add(-2*day))
	}
	if n, _ := retention.Run(ctx, retention.Config{Store: s, Batch: 2, MaxPerRun: 3}); n.Total() != 3 {
		t.Errorf("budget 3: deleted %v", n)
	}
	// Forever keeps; a stored policy applies from the next run.
	if err := retention.Set(ctx, s, retention.Policy{Succeeded: retention.Forever, Failed: task.Duration(time.Hour), Cancelled: retention.Forever}); err != nil {
		t.Fatal(err)
	}
	if n, _ := retention.Run(ctx, retention.Config{Store: s}); n.Total() != 1 || n[task.StateFailed] != 1 {
		t.Errorf("succeeded kept forever, failed after 1h: deleted %v, want only failed-2d", n)
	}
	if p, err := retention.Get(ctx, s); err != nil || p.Succeeded != retention.Forever {
		t.Errorf("Get = %+v, %v", p, err)
	}
}

func TestPolicyValidate(t *testing.T) {
	if err := retention.DefaultPolicy.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []retention.Policy{
		{Succeeded: 0, Failed: 1, Cancelled: 1},
		{Succeeded: 1, Failed: -2, Cancelled: 1},
		{Succeeded: 1, Failed: 1, Cancelled: task.Duration(-time.Hour)},
		{Succeeded: 1, Failed: 1, Cancelled: 1, DeviceStates: -5},
	} {
		err := p.Validate()
		if !errors.Is(err, task.ErrInvalid) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: Validate = %v", p, err)
		}
	}
}

// TestForgedDocuments: a stored policy that does not decode or validate
// fails the run, which then deletes nothing, and is counted; Set replaces
// it. A device-state document without a readable seen_at ages by its last
// write, so it neither stops the run nor stays past the policy.
func TestForgedDocuments(t *testing.T) {
	ctx := t.Context()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.PutTask(t, s, "old", "k", task.StateSucceeded, s.Now().Add(-48*time.Hour))
	before := task.MalformedCounts()[retention.Namespace]
	for _, v := range []string{`{"succeeded":"soon"}`, `{"succeeded":"1ns","failed":"-5ns","cancelled":"1ns"}`} {
		d, _ := s.GetDocument(ctx, retention.Namespace, retention.PolicyID)
		if _, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: retention.Namespace, ID: retention.PolicyID, Version: d.Version, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
		if n, err := retention.Run(ctx, retention.Config{Store: s}); !errors.Is(err, task.ErrInvalid) || n.Total() != 0 {
			t.Fatalf("Run under the forged policy %s: deleted %v, %v; want nothing, ErrInvalid", v, n, err)
		}
	}
	if n := task.MalformedCounts()[retention.Namespace] - before; n != 2 {
		t.Errorf("forged policies counted %d times; want 2", n)
	}
	if err := retention.Set(ctx, s, retention.DefaultPolicy); err != nil {
		t.Fatalf("Set over a forged policy: %v", err)
	}
	for id, v := range map[string]string{"garbage": `"not a state"`, "no-seen-at": `{"id":"no-seen-at"}`} {
		if _, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: retention.DeviceStateNamespace, ID: id, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := retention.Run(ctx, retention.Config{Store: s})
	if err != nil || n[task.StateSucceeded] != 1 || n[retention.DeviceStateNamespace] != 0 {
		t.Fatalf("Run over forged device states = %v, %v; want the old task deleted and the fresh documents kept", n, err)
	}
	if docs, err := s.Documents(ctx, retention.DeviceStateNamespace); err != nil || len(docs) != 2 {
		t.Fatalf("device states after Run: %+v, %v; want both kept (written just now)", docs, err)
	}
}
