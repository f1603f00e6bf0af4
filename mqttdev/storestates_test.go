package mqttdev

import (
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestStoreStatesKeepTheLatest: workers racing to store one device's
// status messages leave the one seen last, whatever order the puts land
// in, and a forged document (not JSON of a state, or another device's
// state) is skipped and counted by the listing, then replaced by the next
// status message.
func TestStoreStatesKeepTheLatest(t *testing.T) {
	t.Parallel()
	st, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "s.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := t.Context()
	states := StoreStates(st)
	base := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			seen := base.Add(time.Duration(i) * time.Second)
			if err := states.PutDeviceState(ctx, DeviceState{ID: "pump-7", Online: i%2 == 1, At: seen, SeenAt: seen}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if err := states.PutDeviceState(ctx, DeviceState{ID: "pump-7", Online: false, At: base, SeenAt: base}); err != nil {
		t.Fatal(err)
	}
	got, err := states.DeviceStates(ctx)
	if want := base.Add(7 * time.Second); err != nil || len(got) != 1 || !got[0].SeenAt.Equal(want) || !got[0].Online {
		t.Fatalf("DeviceStates = %+v, %v; want pump-7 online, seen %s", got, err, want)
	}

	// The count is the process's, once per document id: ids of this run
	// only, so that -count runs count again.
	run := NewCorrelationID()[:8]
	garbage, valve := "garbage-"+run, "valve-"+run
	before := task.MalformedCounts()[StateNamespace]
	other, _ := json.Marshal(DeviceState{ID: "pump-7", Online: true, SeenAt: base})
	for id, v := range map[string]json.RawMessage{garbage: json.RawMessage(`"not a state"`), valve: other} {
		if _, err := st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: StateNamespace, ID: id, Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if got, err := states.DeviceStates(ctx); err != nil || len(got) != 1 || got[0].ID != "pump-7" {
			t.Fatalf("DeviceStates over forged documents = %+v, %v; want pump-7 only", got, err)
		}
	}
	if n := task.MalformedCounts()[StateNamespace] - before; n != 2 {
		t.Errorf("forged device states counted %d times; want 2, once each", n)
	}
	if err := states.PutDeviceState(ctx, DeviceState{ID: valve, SeenAt: base}); err != nil {
		t.Fatalf("a status message over a forged document: %v", err)
	}
	if got, err := states.DeviceStates(ctx); err != nil || len(got) != 2 || got[1].ID != valve {
		t.Fatalf("DeviceStates after %s reported = %+v, %v", valve, got, err)
	}
}
