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

// TestDoorbellCannotBePublished: the control document is leasepool's own;
// the publish that reset it is refused and writes nothing.
func TestDoorbellCannotBePublished(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	_, _, err := task.Publish(t.Context(), st, task.PublishParams{Key: control.DoorbellKey, Kind: control.DoorbellKind, Rerun: true})
	const want = `invalid: key: "leasepool:control" is reserved (the leasepool: prefix is leasepool's own)`
	if !errors.Is(err, task.ErrInvalid) || err.Error() != want {
		t.Fatalf("Publish %s: %v; want %q", control.DoorbellKey, err, want)
	}
	if _, err := st.Get(t.Context(), control.DoorbellKey); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("doorbell after a refused publish: %v; want none", err)
	}
}

// TestCorruptDoorbellDoesNotWedge: a doorbell written wrong by a store-level
// writer (claimable, of a real kind, with a payload of anything) is put
// right by the next control write, which still reaches every reader.
func TestCorruptDoorbellDoesNotWedge(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ctx := t.Context()
	payload := json.RawMessage(strings.Repeat("[", task.MaxStoredDepth) + strings.Repeat("]", task.MaxStoredDepth))
	if _, _, err := task.Publish(task.WithInternalWrite(ctx), st, task.PublishParams{Key: control.DoorbellKey, Kind: "noop", Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Pause(ctx, st, control.Kind("report")); err != nil {
		t.Fatalf("Pause over a corrupt doorbell: %v", err)
	}
	doc, err := st.Get(ctx, control.DoorbellKey)
	if err != nil || doc.State != task.StateCancelled || !strings.HasPrefix(string(doc.Payload), `{"rung_at":`) {
		t.Fatalf("doorbell after a control write: %+v, %v; want it cancelled and rung", doc, err)
	}
	if ps, err := control.Pauses(ctx, st); err != nil || len(ps) != 1 {
		t.Fatalf("Pauses = %+v, %v", ps, err)
	}
}

// TestMalformedRecordsAreSkipped: a pause or limit record that does not
// parse is skipped and counted; the good ones still load.
func TestMalformedRecordsAreSkipped(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ctx := t.Context()
	if _, err := control.Pause(ctx, st, control.Lock("device:pump-7")); err != nil {
		t.Fatal(err)
	}
	if err := control.SetLimit(ctx, st, control.Limit{Target: control.Kind("k"), N: 2, Per: time.Second}); err != nil {
		t.Fatal(err)
	}
	at := st.Now()
	for _, r := range []task.Record{
		{Kind: control.PauseRecord, ID: "no-scope", Value: json.RawMessage(`{"paused":true}`), At: at},
		{Kind: control.PauseRecord, ID: "kind:x", Value: json.RawMessage(`{"paused":"yes"}`), At: at},
		{Kind: control.LimitRecord, ID: "kind:y", Value: json.RawMessage(`[1]`), At: at},
	} {
		if err := st.PutRecord(ctx, r); err != nil {
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
	if after[control.PauseRecord]-before[control.PauseRecord] != 2 || after[control.LimitRecord]-before[control.LimitRecord] != 1 {
		t.Errorf("MalformedCounts %v -> %v; want 2 pause and 1 limit record counted once", before, after)
	}
}
