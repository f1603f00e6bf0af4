package web_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/web"
)

// TestDevicesAPIKeepsWhatDevicesSayApart: pump-1..3 are labelled
// ring=prod and approved; pump-9, approved by nobody, announces ring=prod.
// The listing shows pump-9 new with ring=prod among its attributes, not
// its labels; a label selector and a rollout of ring=prod leave it out;
// DELETE forgets it; approving it from the dashboard makes it vouched for.
func TestDevicesAPIKeepsWhatDevicesSayApart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	ctx := t.Context()
	for _, id := range []string{"pump-1", "pump-2", "pump-3"} {
		if code, body := e.do("PATCH", "/api/v1/devices/"+id+"/labels", `{"set":{"ring":"prod"}}`); code != 200 {
			t.Fatalf("label %s = %d %s", id, code, body)
		}
		if code, body := e.do("POST", "/api/v1/devices/"+id+"/approve", `{"by":"alice"}`); code != 200 || !strings.Contains(body, `"by":"alice"`) {
			t.Fatalf("approve %s = %d %s", id, code, body)
		}
	}
	if err := mqttdev.PutAttributes(ctx, e.store, "pump-9", mqttdev.Labels{"ring": "prod"}, e.store.Now()); err != nil {
		t.Fatal(err)
	}
	devices := func(query string) map[string]mqttdev.DeviceInfo {
		t.Helper()
		code, body := e.do("GET", "/api/v1/devices"+query, "")
		var list []mqttdev.DeviceInfo
		if err := json.Unmarshal([]byte(body), &list); code != 200 || err != nil {
			t.Fatalf("GET devices%s = %d %s %v", query, code, body, err)
		}
		out := map[string]mqttdev.DeviceInfo{}
		for _, d := range list {
			out[d.ID] = d
		}
		return out
	}
	all := devices("")
	if d := all["pump-9"]; !d.New || d.Vouched != nil || len(d.Labels) != 0 || d.Attributes.String() != "ring=prod" {
		t.Fatalf("pump-9 listed as %+v: want new, ring=prod an attribute and no label", d)
	}
	if d := all["pump-1"]; d.New || d.Vouched == nil || d.Vouched.By != "alice" || d.Labels.String() != "ring=prod" || len(d.Attributes) != 0 {
		t.Fatalf("pump-1 listed as %+v", d)
	}
	if got := devices("?select=ring=prod"); len(got) != 3 || got["pump-9"].ID != "" {
		t.Fatalf("?select=ring=prod = %v: want pump-1..3", got)
	}
	if got := devices("?select=attr:ring=prod"); len(got) != 1 || got["pump-9"].ID == "" {
		t.Fatalf("?select=attr:ring=prod = %v: want pump-9", got)
	}
	// Labelled by mistake too, pump-9 is still new: the rollout leaves it
	// out and says so.
	if code, body := e.do("PATCH", "/api/v1/devices/pump-9/labels", `{"set":{"ring":"prod"}}`); code != 200 {
		t.Fatalf("label pump-9 = %d %s", code, body)
	}
	code, body := e.do("POST", "/api/v1/rollouts", `{"name":"canary1","command":"update","select":"ring=prod","waves":"1,100%"}`)
	var p rollout.Progress
	if err := json.Unmarshal([]byte(body), &p); code != http.StatusCreated || err != nil || p.Total.Total != 3 ||
		!strings.HasSuffix(p.Events[0].Detail, "1 new device left out, not vouched for (leasepool device approve): pump-9") {
		t.Fatalf("create canary1 = %d %s", code, body)
	}
	if code, body := e.do("GET", "/api/v1/rollouts/canary1?devices=true", ""); code != 200 || strings.Contains(body, `"device":"pump-9"`) {
		t.Fatalf("canary1 targets pump-9: %d %s", code, body)
	}

	// Refused: bad input names the field and writes nothing; no token.
	before := devices("")
	for path, c := range map[string]struct{ body, names string }{
		"/api/v1/devices/pump-9/approve":   {`{"by":""}`, "by"},
		"/api/v1/devices/pump-9/approve/":  {``, ""},
		"/api/v1/devices/a%2F%23/approve":  {``, "device"},
		"/api/v1/devices/pump-9/approve?x": {`{"by":"a","x":1}`, "x"},
	} {
		if code, out := e.do("POST", path, c.body); code/100 != 4 || !strings.Contains(out, c.names) {
			t.Errorf("POST %s %s = %d %s, want 4xx naming %q", path, c.body, code, out, c.names)
		}
	}
	if code, _ := newEnv(t, web.Config{Token: token}).doAuth("POST", "/api/v1/devices/pump-9/approve", "", ""); code != http.StatusUnauthorized {
		t.Errorf("approve without a token = %d, want 401", code)
	}
	if after := devices(""); !after["pump-9"].New || len(after) != len(before) {
		t.Fatalf("refused approvals changed pump-9: %+v", after["pump-9"])
	}

	// Forget: gone, labels and all, until it announces itself again.
	if code, body := e.do("DELETE", "/api/v1/devices/pump-9", ""); code != 200 || body != `{"forgotten":"pump-9"}`+"\n" {
		t.Fatalf("DELETE pump-9 = %d %s", code, body)
	}
	if _, ok := devices("")["pump-9"]; ok {
		t.Fatal("pump-9 still listed after DELETE")
	}
	if code, body := e.do("DELETE", "/api/v1/devices/pump-9", ""); code != http.StatusNotFound || !strings.Contains(body, "pump-9") {
		t.Errorf("DELETE pump-9 again = %d %s, want 404 naming it", code, body)
	}
	if code, body := e.do("DELETE", "/api/v1/devices/a%2F%23", ""); code != http.StatusBadRequest || !strings.Contains(body, "device") {
		t.Errorf("DELETE a/# = %d %s, want 400 naming device", code, body)
	}
	if code, _ := newEnv(t, web.Config{Token: token}).doAuth("DELETE", "/api/v1/devices/pump-9", "", ""); code != http.StatusUnauthorized {
		t.Errorf("DELETE without a token = %d, want 401", code)
	}
	if err := mqttdev.PutAttributes(ctx, e.store, "pump-9", mqttdev.Labels{"ring": "prod"}, e.store.Now()); err != nil {
		t.Fatal(err)
	}
	if d := devices("")["pump-9"]; !d.New || len(d.Labels) != 0 {
		t.Fatalf("pump-9 back as %+v, want new without its label", d)
	}
	if code, body := e.do("PATCH", "/api/v1/devices/pump-9/labels", `{"set":{"ring":"prod"}}`); code != 200 {
		t.Fatalf("label pump-9 = %d %s", code, body)
	}

	// The dashboard marks it new, with an Approve button that works.
	page := e.wantPage("/devices", 200, `class="badge new"`, `action="/device/approve"`, `name="device" value="pump-9"`)
	if strings.Count(page, `class="badge new"`) != 1 {
		t.Errorf("the devices page marks %d devices new, want pump-9 only", strings.Count(page, `class="badge new"`))
	}
	if code, loc := e.send("POST", "/device/approve", url.Values{"csrf": {e.csrf()}, "device": {"pump-9"}}, nil); code != 303 || loc != "/devices?msg=device-approved" {
		t.Fatalf("dashboard approve = %d %q", code, loc)
	}
	if d := devices("")["pump-9"]; d.New || d.Vouched == nil || d.Vouched.By != "operator (dashboard)" {
		t.Fatalf("after the dashboard's approve pump-9 is %+v", d)
	}
	if out := e.wantPage("/devices?msg=device-approved", 200, "device approved"); strings.Contains(out, `class="badge new"`) {
		t.Error("the devices page still marks a device new")
	}
	code, body = e.do("POST", "/api/v1/rollouts", `{"name":"canary2","command":"update","select":"ring=prod","waves":"1,100%"}`)
	if err := json.Unmarshal([]byte(body), &p); code != http.StatusCreated || err != nil || p.Total.Total != 4 {
		t.Fatalf("create canary2 = %d %s: want pump-9 among 4 targets", code, body)
	}
}
