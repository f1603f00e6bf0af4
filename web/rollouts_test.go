package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

func TestRolloutsAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	for _, id := range []string{"pump-1", "pump-2", "pump-3"} {
		if code, body := e.do("PUT", "/api/v1/devices/"+id+"/labels", `{"labels":{"model":"pump-x","site":"berlin"}}`); code != 200 {
			t.Fatalf("PUT labels %s = %d %s", id, code, body)
		}
		if code, body := e.do("POST", "/api/v1/devices/"+id+"/approve", ""); code != 200 {
			t.Fatalf("approve %s = %d %s", id, code, body)
		}
	}
	code, body := e.do("PATCH", "/api/v1/devices/pump-3/labels", `{"set":{"site":"paris"},"remove":["model"]}`)
	var inv mqttdev.Inventory
	if err := json.Unmarshal([]byte(body), &inv); code != 200 || err != nil || inv.Labels.String() != "site=paris" {
		t.Fatalf("PATCH = %d %s", code, body)
	}
	if code, body := e.do("GET", "/api/v1/devices?select=site=paris", ""); code != 200 || !strings.Contains(body, "pump-3") || strings.Contains(body, "pump-1") {
		t.Fatalf("devices?select = %d %s", code, body)
	}
	if code, body := e.do("GET", "/api/v1/devices?select=attr:site=paris", ""); code != 200 || strings.Contains(body, "pump-") {
		t.Fatalf("devices?select=attr:site=paris = %d %s: no device announced a site", code, body)
	}
	if code, body := e.do("GET", "/api/v1/devices?select=site", ""); code != http.StatusBadRequest || !strings.Contains(body, "select") {
		t.Fatalf("devices?select=site = %d %s, want 400 naming select", code, body)
	}
	create := `{"name":"fw-2","command":"update","args":{"v":"2"},"select":"model=pump-x","waves":"1,100%",
		"rate":"10/1m","abort_when":"failed>10% after 2","approve_waves":true,"timeout":"30s","retries":1,
		"rollback_command":"update","rollback_args":{"v":"1"}}`
	code, body = e.do("POST", "/api/v1/rollouts", create)
	var p rollout.Progress
	if err := json.Unmarshal([]byte(body), &p); code != http.StatusCreated || err != nil || p.Total.Total != 2 || len(p.Waves) != 2 {
		t.Fatalf("create = %d %s", code, body)
	}
	if code, body := e.do("POST", "/api/v1/rollouts", create); code != http.StatusConflict {
		t.Fatalf("create again = %d %s, want 409", code, body)
	}
	if code, body := e.do("GET", "/api/v1/rollouts", ""); code != 200 || !strings.Contains(body, `"name":"fw-2"`) {
		t.Fatalf("list = %d %s", code, body)
	}
	if code, body := e.do("GET", "/api/v1/rollouts/fw-2?devices=true", ""); code != 200 || !strings.Contains(body, `"device":"pump-1"`) {
		t.Fatalf("get with devices = %d %s", code, body)
	}
	for _, step := range []struct{ op, state string }{
		{"pause", "paused"}, {"approve", "paused"}, {"resume", "running"}, {"cancel", "cancelling"},
	} {
		code, body := e.do("POST", "/api/v1/rollouts/fw-2/"+step.op, "")
		if code != 200 || !strings.Contains(body, `"state":"`+step.state+`"`) {
			t.Fatalf("%s = %d %s, want %s", step.op, code, body, step.state)
		}
	}
	if code, body := e.do("POST", "/api/v1/rollouts/fw-2/resume", ""); code != http.StatusConflict {
		t.Errorf("resume of a cancelled rollout = %d %s, want 409", code, body)
	}
	if code, body := e.do("POST", "/api/v1/rollouts/fw-2/retry-failed", ""); code != http.StatusConflict {
		t.Errorf("retry-failed of a cancelled rollout = %d %s, want 409", code, body)
	}
	if code, body := e.do("GET", "/api/v1/rollouts/nope", ""); code != http.StatusNotFound || !strings.Contains(body, "rollout") {
		t.Errorf("get unknown = %d %s, want 404 naming the rollout", code, body)
	}
	// The login covers the new routes too.
	if code, _ := e.doAuth("POST", "/api/v1/rollouts/fw-2/pause", "", ""); code != http.StatusUnauthorized {
		t.Errorf("pause without a token = %d, want 401", code)
	}
	if code, _ := e.doAuth("PATCH", "/api/v1/devices/pump-1/labels", `{"set":{"a":"b"}}`, ""); code != http.StatusUnauthorized {
		t.Errorf("labels without a token = %d, want 401", code)
	}
}

func TestRolloutsAPIBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	for body, want := range map[string]string{
		`{"name":"../x","command":"u","devices":["a"]}`:                       "name",
		`{"name":"a b","command":"u","devices":["a"]}`:                        "name",
		`{"name":"x","command":"","devices":["a"]}`:                           "command",
		`{"name":"x","command":"u"}`:                                          "select",
		`{"name":"x","command":"u","devices":["a/#"]}`:                        "devices",
		`{"name":"x","command":"u","devices":["a"],"args":[1]}`:               "args",
		`{"name":"x","command":"u","devices":["a"],"waves":"50%"}`:            "waves",
		`{"name":"x","command":"u","devices":["a"],"waves":"10,5,100%"}`:      "waves",
		`{"name":"x","command":"u","devices":["a","b"],"waves":"2,10%,100%"}`: "waves",
		`{"name":"x","command":"u","devices":["a"],"rate":"-1/1s"}`:           "rate",
		`{"name":"x","command":"u","devices":["a"],"abort_when":"x"}`:         "abort-when",
		`{"name":"x","command":"u","devices":["a"],"timeout":"soon"}`:         "timeout",
		`{"name":"x","command":"u","devices":["a"],"retries":99}`:             "retries",
		`{"name":"x","command":"u","devices":["a"],"wave":"1"}`:               "wave",
		`{"name":"x","command":"u","select":"model=none"}`:                    "select",
		`{"name":"x","command":"u","select":"attr:model=pump-x"}`:             "select",
	} {
		code, out := e.do("POST", "/api/v1/rollouts", body)
		if code != http.StatusBadRequest || !strings.Contains(out, want) {
			t.Errorf("POST %s = %d %s, want 400 naming %s", body, code, out, want)
		}
	}
	for path, body := range map[string]string{
		"/api/v1/devices/d1/labels":      `{"labels":{"a b":"c"}}`,
		"/api/v1/devices/d1/labels/":     `{"labels":{}}`,
		"/api/v1/devices/a%2F%23/labels": `{"labels":{"a":"b"}}`,
	} {
		if code, out := e.do("PUT", path, body); code != http.StatusBadRequest && code != http.StatusNotFound {
			t.Errorf("PUT %s %s = %d %s, want 400 or 404", path, body, code, out)
		}
	}
	if code, out := e.do("PATCH", "/api/v1/devices/d1/labels", `{"set":{"k":"v w"}}`); code != http.StatusBadRequest || !strings.Contains(out, "label") {
		t.Errorf("PATCH bad value = %d %s", code, out)
	}
	if code, body := e.do("GET", "/api/v1/rollouts", ""); code != 200 || strings.Contains(body, `"name"`) {
		t.Errorf("refused creates left rollouts: %s", body)
	}
	if docs, err := e.store.Documents(t.Context(), mqttdev.InventoryNamespace); err != nil || len(docs) != 0 {
		t.Errorf("refused label writes left %d documents (%v)", len(docs), err)
	}
}

// storedRollout is rollout name's document as stored (nil when none).
func storedRollout(t *testing.T, e *env, name string) *task.Document {
	t.Helper()
	d, err := e.store.GetDocument(t.Context(), rollout.Namespace, name)
	if errors.Is(err, task.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &d
}

// The largest rollout accepted, args and rollback_args of 64 KiB all
// '<>&' on 1,000 devices, is stored as given (no HTML escapes) and within
// what it can grow to; DELETE takes it only once it is over, with the
// write credential; a refused DELETE changes nothing.
func TestRolloutHTMLArgsCancelAndDeleteAPI(t *testing.T) {
	t.Parallel()
	const readToken = "read-only-token"
	e := newEnv(t, web.Config{Token: token, ReadToken: readToken})
	args := `{"a":"` + strings.Repeat("<>&", (rollout.MaxArgsLen-8)/3) + `"}`
	var ids []string
	for i := range rollout.MaxSpecDevices {
		ids = append(ids, fmt.Sprintf("dev-%03d", i))
	}
	devs, _ := json.Marshal(ids)
	body := `{"name":"html","command":"update","args":` + args + `,"devices":` + string(devs) +
		`,"rollback_command":"update","rollback_args":` + args + `}`
	if code, out := e.do("POST", "/api/v1/rollouts", body); code != http.StatusCreated {
		t.Fatalf("create = %d %.300s", code, out)
	}
	d := storedRollout(t, e, "html")
	if bytes.Contains(d.Value, []byte(`\u003c`)) || !bytes.Contains(d.Value, []byte(args)) {
		t.Fatalf("stored args are not as given: %.200s", d.Value)
	}
	r, err := rollout.Get(t.Context(), e.store, "html")
	if err != nil {
		t.Fatal(err)
	}
	if most, err := r.MaxSize(); err != nil || most > task.MaxDocumentSize {
		t.Fatalf("MaxSize %d %v", most, err)
	}

	for _, c := range []struct {
		auth string
		code int
	}{{"", http.StatusUnauthorized}, {"Bearer " + readToken, http.StatusForbidden}, {"Bearer " + token, http.StatusConflict}} {
		before := storedRollout(t, e, "html")
		code, out := e.doAuth("DELETE", "/api/v1/rollouts/html", "", c.auth)
		if code != c.code || (code == http.StatusConflict && !strings.Contains(out, "cancel it first")) {
			t.Fatalf("DELETE of a running rollout with %q = %d %s, want %d", c.auth, code, out, c.code)
		}
		if after := storedRollout(t, e, "html"); after == nil || after.Version != before.Version || !bytes.Equal(after.Value, before.Value) {
			t.Fatalf("a refused DELETE changed the rollout")
		}
	}
	if code, out := e.do("POST", "/api/v1/rollouts/html/cancel", ""); code != 200 || !strings.Contains(out, `"state":"cancelling"`) {
		t.Fatalf("cancel = %d %.300s", code, out)
	}
	drv, err := rollout.NewDriver(rollout.DriverConfig{Store: e.store, WorkerID: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for r.State != rollout.StateCancelled {
		if err := drv.Pass(t.Context()); err != nil {
			t.Fatal(err)
		}
		if r, err = rollout.Get(t.Context(), e.store, "html"); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s", r.State)
		}
	}
	if code, out := e.do("DELETE", "/api/v1/rollouts/html", ""); code != 200 || !strings.Contains(out, `"deleted":true`) {
		t.Fatalf("DELETE of a cancelled rollout = %d %s", code, out)
	}
	if storedRollout(t, e, "html") != nil {
		t.Fatal("the rollout's document is still stored")
	}
	for _, m := range []string{"GET", "DELETE"} {
		if code, out := e.do(m, "/api/v1/rollouts/html", ""); code != http.StatusNotFound {
			t.Errorf("%s after delete = %d %s, want 404", m, code, out)
		}
	}
}

// A device task published over the API under a key of a rollout not yet
// created (the squat): the create is refused with 409 naming the key,
// and nothing is written.
func TestRolloutCreateOverASquattedKeyAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	sq := `{"key":"rollout:sq1:dev-2:1","kind":"device","payload":{"device":"dev-2","command":"update","args":{"version":"evil-0.0"}}}`
	if code, out := e.do("POST", "/api/v1/tasks", sq); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("publish the squat = %d %s", code, out)
	}
	create := `{"name":"sq1","command":"update","args":{"version":"2.0"},"devices":["dev-1","dev-2"]}`
	code, out := e.do("POST", "/api/v1/rollouts", create)
	if code != http.StatusConflict || !strings.Contains(out, "rollout:sq1:dev-2:1") {
		t.Fatalf("create over the squat = %d %s, want 409 naming the task", code, out)
	}
	if storedRollout(t, e, "sq1") != nil {
		t.Fatal("the refused create wrote the rollout")
	}
	tk, err := e.store.Get(t.Context(), "rollout:sq1:dev-2:1")
	if err != nil || tk.Version != 1 {
		t.Fatalf("the squatting task: %+v %v", tk, err)
	}
}

// POST /api/v1/rollouts?dry_run=true answers the plan, each wave's
// devices, and writes nothing.
func TestRolloutDryRunAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	body := `{"name":"fw","command":"update","devices":["d3","d1","d2"],"waves":"1,100%","approve_waves":true}`
	code, out := e.do("POST", "/api/v1/rollouts?dry_run=true", body)
	var p rollout.Plan
	if err := json.Unmarshal([]byte(out), &p); code != 200 || err != nil || len(p.Waves) != 2 ||
		fmt.Sprint(p.Waves[0].Devices, p.Waves[1].Devices) != "[d1] [d2 d3]" || p.Waves[1].Gate != rollout.GateApproval {
		t.Fatalf("dry run = %d %s", code, out)
	}
	for q, want := range map[string]string{"?dry_run=maybe": "dry_run", "?dry_run=1": "waves"} {
		bad := strings.Replace(body, `"1,100%"`, `"2,1,100%"`, 1)
		if code, out := e.do("POST", "/api/v1/rollouts"+q, bad); code != http.StatusBadRequest || !strings.Contains(out, want) {
			t.Errorf("POST %s = %d %s, want 400 naming %s", q, code, out, want)
		}
	}
	if storedRollout(t, e, "fw") != nil {
		t.Fatal("a dry run wrote the rollout")
	}
}

// After an abort, the API and the dashboard agree on the waves: the one
// it aborted in ended with the rollout, the later ones were skipped.
func TestRolloutWavesAfterAbort(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{})
	mux := consumer.NewMux()
	mux.RegisterFunc(mqttdev.Kind, func(context.Context, *consumer.Job) error {
		return fmt.Errorf("%w: simulated", mqttdev.ErrDeviceFailed)
	})
	c, err := consumer.New(consumer.Config{Store: e.store, Handler: mux, WorkerID: "fleet", RetryPolicy: consumer.NoBackoff})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer c.Stop(context.Background())
	e.want("POST", "/api/v1/rollouts", `{"name":"bad","command":"update","devices":["d1","d2","d3","d4"],"waves":"2,3,100%",
		"abort_when":"failed>50% after 1"}`, http.StatusCreated, `"state":"running"`)
	s := rollout.NewStepper(e.store)
	var p rollout.Progress
	// A step each check, as a driver does.
	testutil.Eventually(t, 30*time.Second, "the rollout to end", func() bool {
		if err := s.Step(t.Context(), "bad"); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		_, body := e.do("GET", "/api/v1/rollouts/bad", "")
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return p.State.Final()
	})
	if w := p.Waves; p.State != rollout.StateAborted || w[0].State != rollout.WaveAborted || !w[0].Ended ||
		!w[0].EndedAt.Equal(p.EndedAt) || w[1].State != rollout.WaveSkipped || w[2].State != rollout.WaveSkipped || w[2].Started {
		t.Fatalf("%s, waves %+v", p.State, w)
	}
	body := e.wantPage("/rollout?name=bad", 200, `<td class="wave-state">aborted</td>`, `<td class="wave-state">skipped</td>`)
	if !strings.Contains(body, `data-wave="1" data-state="aborted"`) || !strings.Contains(body, `data-wave="3" data-state="skipped"`) {
		t.Errorf("the waves chart does not show wave 1 aborted, wave 3 skipped")
	}
}
