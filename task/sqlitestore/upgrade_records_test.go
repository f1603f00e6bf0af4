package sqlitestore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestUpgradeRecordsToDocuments opens testdata/v10.db, written by the
// program of schema version 10 (pauses, one resumed; limits, one removed;
// two schedules, one paused, and a cursor the runner advanced; two device
// states; a retention policy), all as shared records. A read-only open
// reads them as they are; a writer's open moves them into documents and
// drops the records table; every value survives, and writes go on.
func TestUpgradeRecordsToDocuments(t *testing.T) {
	path := copyFixture(t, "v10.db")
	ro, err := sqlitestore.Open(t.Context(), path, &sqlitestore.Config{ReadOnly: true, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("read-only open of a version 10 store: %v", err)
	}
	checkV10Values(t, "read-only, before the upgrade", ro)
	ro.Close()

	st := open(t, path, nil)
	db := rawDB(t, path)
	var v, records, docs int
	for _, c := range []struct {
		q    string
		dest any
	}{
		{`PRAGMA user_version`, &v},
		{`SELECT count(*) FROM sqlite_master WHERE name = 'records'`, &records},
		{`SELECT count(*) FROM documents WHERE namespace LIKE 'leasepool.%' AND namespace <> 'leasepool.control'`, &docs},
	} {
		if err := db.QueryRow(c.q).Scan(c.dest); err != nil {
			t.Fatalf("%s: %v", c.q, err)
		}
	}
	if v != sqlitestore.SchemaVersion || records != 0 || docs != 12 {
		t.Fatalf("after the upgrade: version %d, records tables %d, documents %d; want %d, 0, 12 (one per record, each under leasepool.)", v, records, docs, sqlitestore.SchemaVersion)
	}
	checkV10Values(t, "after the upgrade", st)

	// Writes go on from the moved documents.
	ctx := t.Context()
	if changed, err := control.Resume(ctx, st, control.Kind("slow")); err != nil || !changed {
		t.Fatalf("Resume of an upgraded pause = %v, %v", changed, err)
	}
	states := mqttdev.StoreStates(st)
	old := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	if err := states.PutDeviceState(ctx, mqttdev.DeviceState{ID: "pump-7", Online: false, At: old, SeenAt: old}); err != nil {
		t.Fatal(err)
	}
	if got, err := states.DeviceStates(ctx); err != nil || len(got) != 2 || !got[0].Online {
		t.Fatalf("device states after an older put = %+v, %v; want pump-7 still online", got, err)
	}
	if _, err := schedule.Resume(ctx, st, "nightly"); err != nil {
		t.Fatal(err)
	}
	if err := schedule.Remove(ctx, st, "tick"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetDocument(ctx, schedule.CursorNamespace, "tick"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("tick's cursor after Remove: %v; want ErrNotFound", err)
	}
}

// checkV10Values checks the controls, schedules, device states and
// retention policy testdata/v10.db holds.
func checkV10Values(t *testing.T, when string, st task.Store) {
	t.Helper()
	ctx := t.Context()
	ctl, err := control.Load(ctx, st)
	if err != nil {
		t.Fatalf("%s: controls: %v", when, err)
	}
	if len(ctl.Pauses) != 2 || ctl.Pauses[0].Target != control.Kind("slow") || ctl.Pauses[1].Target != control.Lock("device:pump-7") ||
		ctl.Pauses[0].Since.IsZero() {
		t.Errorf("%s: pauses %+v; want kind:slow and lock:device:pump-7 (kind:resumed was resumed)", when, ctl.Pauses)
	}
	wantLimits := []control.Limit{{Target: control.Kind("mail"), N: 5, Per: time.Minute}, {Target: control.Lock("device:*"), N: 2, Per: time.Second}}
	if len(ctl.Limits) != 2 || ctl.Limits[0] != wantLimits[0] || ctl.Limits[1] != wantLimits[1] {
		t.Errorf("%s: limits %+v; want %+v (kind:removed was removed)", when, ctl.Limits, wantLimits)
	}
	schs, err := schedule.List(ctx, st)
	if err != nil || len(schs) != 2 {
		t.Fatalf("%s: schedules %+v, %v; want nightly and tick", when, schs, err)
	}
	nightly, tick := schs[0], schs[1]
	if nightly.Name != "nightly" || !nightly.Paused || nightly.Cron != "0 3 * * *" || nightly.TZ != "Europe/Paris" || nightly.Template.Kind != "report" {
		t.Errorf("%s: nightly = %+v", when, nightly)
	}
	if slot := time.Date(2026, 11, 26, 3, 55, 39, 0, time.UTC); tick.Name != "tick" || tick.Paused ||
		tick.Every != task.Duration(time.Second) || !tick.LastSlot.Equal(slot) {
		t.Errorf("%s: tick = %+v; want every 1s, last slot %s", when, tick, slot)
	}
	states, err := mqttdev.StoreStates(st).DeviceStates(ctx)
	seen := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	if err != nil || len(states) != 2 || states[0].ID != "pump-7" || !states[0].Online || !states[0].SeenAt.Equal(seen) ||
		states[1].ID != "valve-2" || states[1].Online || !states[1].SeenAt.Equal(seen.Add(-time.Minute)) {
		t.Errorf("%s: device states %+v, %v", when, states, err)
	}
	p, err := retention.Get(ctx, st)
	if want := (retention.Policy{Succeeded: task.Duration(time.Hour), Failed: task.Duration(48 * time.Hour), Cancelled: retention.Forever}); err != nil || p != want {
		t.Errorf("%s: retention policy %+v, %v; want %+v", when, p, err, want)
	}
	// The records of kinds without leasepool's prefix are documents under it.
	for ns, want := range map[string]int{
		"leasepool.schedule": 2, "leasepool.schedule-cursor": 1, "leasepool.device-state": 2, "leasepool.retention": 1,
		"schedule": 0, "schedule-cursor": 0, "device-state": 0, "retention": 0,
	} {
		if docs, err := st.Documents(ctx, ns); err != nil || len(docs) != want {
			t.Errorf("%s: Documents(%q) = %d documents, %v; want %d", when, ns, len(docs), err, want)
		}
	}
}
