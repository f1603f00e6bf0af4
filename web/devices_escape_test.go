package web_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/safetext"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// TestDevicesPageNeutralisesBidi: an id and attributes holding U+202E and
// ESC, written to the store around the checks, are shown escaped, in
// <bdi>, in the table and the charts.
func TestDevicesPageNeutralisesBidi(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	now := e.store.Now()
	if err := mqttdev.StoreStates(e.store).PutDeviceState(t.Context(), mqttdev.DeviceState{ID: "evil\u202e1", Online: true, At: now, SeenAt: now}); err != nil {
		t.Fatal(err)
	}
	inv, _ := json.Marshal(map[string]any{"attributes": map[string]string{"firmware": "1.0\u202egnp.exe", "site\x1b": "x"}})
	if _, err := e.store.PutDocument(task.WithInternalWrite(t.Context()), task.Document{Namespace: mqttdev.InventoryNamespace, ID: "d2", Value: inv}); err != nil {
		t.Fatal(err)
	}
	body := e.wantPage("/devices", 200, `<bdi class="device-id">evil\u202e1</bdi>`, `<bdi>firmware=1.0\u202egnp.exe</bdi>`,
		`data-label="1.0\u202egnp.exe"`, `by announced <bdi>site\x1b</bdi>`)
	if strings.ContainsFunc(body, func(r rune) bool { return r != '\n' && r != '\t' && safetext.Unsafe(r) }) {
		t.Errorf("the devices page holds a control or format character raw:\n%q", body)
	}
}
