package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// TestDevicesListingEscapes: what the store holds about devices, written
// around the checks (an id and an announced attribute holding U+202E, a
// label key holding ESC), reaches `leasepool devices` escaped.
func TestDevicesListingEscapes(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("device", "label", "d1", "model=x")
	st, err := sqlitestore.Open(t.Context(), c.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	put := func(ns, id string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := st.PutDocument(task.WithInternalWrite(t.Context()), task.Document{Namespace: ns, ID: id, Value: b}); err != nil {
			t.Fatal(err)
		}
	}
	put(mqttdev.InventoryNamespace, "d2", map[string]any{"attributes": map[string]string{"firmware": "1.0\u202egnp.exe", "site\x1b[2J": "x"}})
	put(mqttdev.StateNamespace, "evil\u202e1", mqttdev.DeviceState{ID: "evil\u202e1", Online: true, At: time.Now(), SeenAt: time.Now()})
	st.Close()

	out := c.must("devices")
	if rawControls(out) {
		t.Errorf("devices prints a control or format character raw:\n%q", out)
	}
	for _, want := range []string{`firmware=1.0\u202egnp.exe`, `site\x1b[2J=x`, `evil\u202e1`, "d1"} {
		if !strings.Contains(out, want) {
			t.Errorf("devices lacks %s:\n%s", want, out)
		}
	}
	// JSON says the same, escaped: it decodes to what the store holds.
	js := c.must("devices", "--json")
	if rawControls(js) {
		t.Errorf("devices --json prints a control or format character raw:\n%q", js)
	}
	var infos []mqttdev.DeviceInfo
	if err := json.Unmarshal([]byte(js), &infos); err != nil || len(infos) != 3 || infos[2].ID != "evil\u202e1" || infos[1].Attributes["firmware"] != "1.0\u202egnp.exe" {
		t.Fatalf("devices --json: %v %+v", err, infos)
	}
}
