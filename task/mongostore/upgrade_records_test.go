package mongostore_test

import (
	"encoding/json"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// TestUpgradeMovesRecordsToDocuments loads testdata/v10-records.json, the
// records collection of a database written by the program before records
// became documents (pauses, one resumed; limits, one removed; two
// schedules, one paused, and a cursor the runner advanced; two device
// states; a retention policy), and checks that Open moves each into its
// document with its value, keeps a document written since, and drops the
// records collection.
func TestUpgradeMovesRecordsToDocuments(t *testing.T) {
	uri := testservers.MongoURI(t)
	st, cfg := openFresh(t, uri)
	ctx := t.Context()
	var fixture []json.RawMessage
	readFixture(t, "testdata/v10-records.json", &fixture)
	insertFixture(t, st, "records", fixture)
	records := st.Database().Collection("records")
	// A document written before this open (by an upgraded process) is
	// newer than its record.
	if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: control.LimitNamespace, ID: "kind:mail", Value: json.RawMessage(`{"n":7,"per":"1m0s"}`)}); err != nil {
		t.Fatal(err)
	}

	upgraded := open(t, uri, cfg)
	if n, err := records.CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Fatalf("records after the upgrade: %d, %v; want none", n, err)
	}
	ctl, err := control.Load(ctx, upgraded)
	if err != nil {
		t.Fatal(err)
	}
	if len(ctl.Pauses) != 2 || ctl.Pauses[0].Target != control.Kind("slow") || ctl.Pauses[1].Target != control.Lock("device:pump-7") {
		t.Errorf("pauses %+v; want kind:slow and lock:device:pump-7 (kind:resumed was resumed)", ctl.Pauses)
	}
	wantLimits := []control.Limit{{Target: control.Kind("mail"), N: 7, Per: time.Minute}, {Target: control.Lock("device:*"), N: 2, Per: time.Second}}
	if len(ctl.Limits) != 2 || ctl.Limits[0] != wantLimits[0] || ctl.Limits[1] != wantLimits[1] {
		t.Errorf("limits %+v; want %+v (kind:mail as written since, kind:removed removed)", ctl.Limits, wantLimits)
	}
	schs, err := schedule.List(ctx, upgraded)
	if err != nil || len(schs) != 2 {
		t.Fatalf("schedules %+v, %v; want nightly and tick", schs, err)
	}
	if n := schs[0]; n.Name != "nightly" || !n.Paused || n.Cron != "0 3 * * *" || n.TZ != "Europe/Paris" {
		t.Errorf("nightly = %+v", n)
	}
	if tick := schs[1]; tick.Name != "tick" || tick.Every != task.Duration(time.Second) || !tick.LastSlot.Equal(time.Date(2026, 11, 26, 3, 55, 44, 0, time.UTC)) {
		t.Errorf("tick = %+v; want every 1s, last slot 03:55:44", tick)
	}
	states, err := mqttdev.StoreStates(upgraded).DeviceStates(ctx)
	seen := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	if err != nil || len(states) != 2 || states[0].ID != "pump-7" || !states[0].Online || !states[0].SeenAt.Equal(seen) ||
		states[1].ID != "valve-2" || states[1].Online || !states[1].SeenAt.Equal(seen.Add(-time.Minute)) {
		t.Errorf("device states %+v, %v", states, err)
	}
	// The records of kinds without leasepool's prefix are documents under it.
	for ns, want := range map[string]int{
		"leasepool.schedule": 2, "leasepool.schedule-cursor": 1, "leasepool.device-state": 2, "leasepool.retention": 1,
		"schedule": 0, "schedule-cursor": 0, "device-state": 0, "retention": 0,
	} {
		if docs, err := upgraded.Documents(ctx, ns); err != nil || len(docs) != want {
			t.Errorf("Documents(%q) = %d documents, %v; want %d", ns, len(docs), err, want)
		}
	}
	p, err := retention.Get(ctx, upgraded)
	if want := (retention.Policy{Succeeded: task.Duration(time.Hour), Failed: task.Duration(48 * time.Hour), Cancelled: retention.Forever}); err != nil || p != want {
		t.Errorf("retention policy %+v, %v; want %+v", p, err, want)
	}
	// An older device state put after the upgrade changes nothing.
	old := seen.Add(-time.Hour)
	if err := mqttdev.StoreStates(upgraded).PutDeviceState(ctx, mqttdev.DeviceState{ID: "pump-7", At: old, SeenAt: old}); err != nil {
		t.Fatal(err)
	}
	if states, err := mqttdev.StoreStates(upgraded).DeviceStates(ctx); err != nil || !states[0].Online {
		t.Errorf("device states after an older put: %+v, %v; want pump-7 still online", states, err)
	}
}
