package web_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"unicode"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// badDeviceIDs are refused at every entry of the API.
var badDeviceIDs = []string{" ", "a b", "..", ".", "dev\u202e1", "dev\x00", "dev\n", "dev\u200f", "dev\u2066", "dev\u00a0"}

// TestBadDeviceIDsRefusedByTheAPI: each refused id, in the path of a label
// edit, as the device of a published command and of a rollout, is a 400
// naming the field whose message prints no control or format character;
// "." and ".." never reach a handler (the router cleans them away).
// Nothing is written.
func TestBadDeviceIDsRefusedByTheAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	for _, id := range badDeviceIDs {
		payload, _ := json.Marshal(map[string]any{"key": "k1", "kind": "device", "payload": map[string]string{"device": id, "command": "reboot"}})
		ro, _ := json.Marshal(map[string]any{"name": "r1", "command": "u", "devices": []string{"d1", id}})
		labels := "/api/v1/devices/" + url.PathEscape(id) + "/labels"
		dots := id == "." || id == ".."
		for _, tc := range []struct {
			method, path, body, names string
			routed                    bool
		}{
			{"PUT", labels, `{"labels":{"k":"v"}}`, "device", !dots},
			{"PATCH", labels, `{"set":{"k":"v"}}`, "device", !dots},
			{"POST", "/api/v1/tasks", string(payload), "device", true},
			{"POST", "/api/v1/rollouts", string(ro), "devices", true},
		} {
			code, out := e.do(tc.method, tc.path, tc.body)
			if !tc.routed {
				if code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
					t.Errorf("%s %s = %d %s, want 404 or 405", tc.method, tc.path, code, out)
				}
				continue
			}
			var res struct {
				Error string `json:"error"`
			}
			_ = json.Unmarshal([]byte(out), &res)
			if code != http.StatusBadRequest || !strings.Contains(res.Error, tc.names) {
				t.Errorf("%s %s %s = %d %s, want 400 naming %s", tc.method, tc.path, tc.body, code, out, tc.names)
			}
			if strings.ContainsFunc(res.Error, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) {
				t.Errorf("%s %s: error %q holds a control or format character", tc.method, tc.path, res.Error)
			}
		}
	}
	assertNothingWritten(t, e)
}

func assertNothingWritten(t *testing.T, e *env) {
	t.Helper()
	for _, ns := range []string{mqttdev.InventoryNamespace, rollout.Namespace} {
		if docs, err := e.store.Documents(t.Context(), ns); err != nil || len(docs) != 0 {
			t.Errorf("refused writes left %d documents in %s (%v)", len(docs), ns, err)
		}
	}
	if tasks, err := e.store.List(t.Context(), task.ListQuery{}); err != nil || len(tasks) != 0 {
		t.Errorf("refused writes left %d tasks (%v)", len(tasks), err)
	}
}
