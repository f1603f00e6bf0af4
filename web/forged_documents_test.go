package web_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/retention"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// TestForgedDocumentsInEveryNamespace: a document that does not decode,
// written by a store-level writer into each namespace leasepool keeps its
// own state in (pauses, limits, schedules, their cursors, device states,
// the device inventory, the retention policy), fails no page and no API list: the good entries
// beside it are still shown.
func TestForgedDocumentsInEveryNamespace(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	ctx := t.Context()
	if _, err := control.Pause(ctx, e.store, control.Kind("slow")); err != nil {
		t.Fatal(err)
	}
	if err := control.SetLimit(ctx, e.store, control.Limit{Target: control.Kind("mail"), N: 5, Per: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := mqttdev.StoreStates(e.store).PutDeviceState(ctx, mqttdev.DeviceState{ID: "pump-7", Online: true, SeenAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{control.PauseNamespace, control.LimitNamespace, schedule.Namespace, schedule.CursorNamespace,
		mqttdev.StateNamespace, mqttdev.InventoryNamespace, retention.Namespace} {
		for id, v := range map[string]string{"kind:forged": `"not an object"`, "<script>x</script>": `{"paused":7,"n":"x","every":[],"slot":{}}`} {
			if _, err := e.store.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: ns, ID: id, Value: json.RawMessage(v)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.want("GET", "/api/v1/pauses", "", 200, `"name":"slow"`)
	e.want("GET", "/api/v1/limits", "", 200, `"name":"mail"`)
	e.want("GET", "/api/v1/schedules", "", 200, `"nightly"`)
	e.want("GET", "/api/v1/devices", "", 200, `"pump-7"`)
	e.wantPage("/", 200)
	e.wantPage("/controls", 200, "slow", "mail", "nightly")
	e.wantPage("/devices", 200, "pump-7")
	e.wantPage("/tasks", 200)
}
