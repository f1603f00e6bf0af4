package control_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func openStore(t *testing.T) *sqlitestore.Store {
	t.Helper()
	st, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), &sqlitestore.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestDoorbellIsNoTask: a task named like the doorbell is an ordinary
// task, and neither reads nor writes the doorbell document.
func TestDoorbellIsNoTask(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ctx := t.Context()
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: control.DoorbellID, Kind: control.DoorbellNamespace}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetDocument(ctx, control.DoorbellNamespace, control.DoorbellID); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("doorbell after publishing a task of its names: %v; want none", err)
	}
	if _, err := control.Pause(ctx, st, control.Kind("report")); err != nil {
		t.Fatal(err)
	}
	if tk, err := st.Get(ctx, control.DoorbellID); err != nil || tk.State != task.StatePending || tk.Version != 1 {
		t.Fatalf("task %s after a control write: %+v, %v; want it pending, untouched", control.DoorbellID, tk, err)
	}
}

// TestCorruptDoorbellDoesNotWedge: a doorbell written wrong by a
// store-level writer (a value of anything) is put right by the next
// control write, which still reaches every reader.
func TestCorruptDoorbellDoesNotWedge(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ctx := t.Context()
	payload := json.RawMessage(strings.Repeat("[", task.MaxStoredDepth) + strings.Repeat("]", task.MaxStoredDepth))
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: control.DoorbellNamespace, ID: control.DoorbellID, Value: payload}); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Pause(ctx, st, control.Kind("report")); err != nil {
		t.Fatalf("Pause over a corrupt doorbell: %v", err)
	}
	doc, err := st.GetDocument(ctx, control.DoorbellNamespace, control.DoorbellID)
	if err != nil || doc.Version != 2 || !strings.HasPrefix(string(doc.Value), `{"rung_at":`) {
		t.Fatalf("doorbell after a control write: %+v, %v; want version 2, rung", doc, err)
	}
	if ps, err := control.Pauses(ctx, st); err != nil || len(ps) != 1 {
		t.Fatalf("Pauses = %+v, %v", ps, err)
	}
}

// TestMalformedDocumentsAreSkipped: a pause or limit document that does
// not parse is skipped and counted once; the good ones still load, and
// control writes over a forged document still work.
func TestMalformedDocumentsAreSkipped(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ctx := t.Context()
	if _, err := control.Pause(ctx, st, control.Lock("device:pump-7")); err != nil {
		t.Fatal(err)
	}
	if err := control.SetLimit(ctx, st, control.Limit{Target: control.Kind("k"), N: 2, Per: time.Second}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []task.Document{
		{Namespace: control.PauseNamespace, ID: "no-scope", Value: json.RawMessage(`{"paused":true}`)},
		{Namespace: control.PauseNamespace, ID: "kind:x", Value: json.RawMessage(`{"paused":"yes"}`)},
		{Namespace: control.LimitNamespace, ID: "kind:y", Value: json.RawMessage(`[1]`)},
	} {
		if _, err := st.PutDocument(task.WithInternalWrite(ctx), d); err != nil {
			t.Fatal(err)
		}
	}
	before := task.MalformedCounts()
	for range 2 {
		s, err := control.Load(ctx, st)
		if err != nil {
			t.Fatalf("Load over malformed records: %v", err)
		}
		if len(s.Pauses) != 1 || s.Pauses[0].Target != control.Lock("device:pump-7") || len(s.Limits) != 1 {
			t.Fatalf("Load = %+v %+v; want the good pause and limit only", s.Pauses, s.Limits)
		}
	}
	after := task.MalformedCounts()
	if after[control.PauseNamespace]-before[control.PauseNamespace] != 2 || after[control.LimitNamespace]-before[control.LimitNamespace] != 1 {
		t.Errorf("MalformedCounts %v -> %v; want 2 pause and 1 limit document counted once", before, after)
	}
	// A write over a forged document replaces it.
	if changed, err := control.Pause(ctx, st, control.Kind("x")); err != nil || !changed {
		t.Fatalf("Pause over a forged document: %v, %v; want changed", changed, err)
	}
	if err := control.SetLimit(ctx, st, control.Limit{Target: control.Kind("y"), N: 1, Per: time.Second}); err != nil {
		t.Fatalf("SetLimit over a forged document: %v", err)
	}
	if s, err := control.Load(ctx, st); err != nil || len(s.Pauses) != 2 || len(s.Limits) != 2 {
		t.Fatalf("Load after writes over forged documents: %+v, %v; want 2 pauses and 2 limits", s, err)
	}
}
