package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
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
	}
	code, body := e.do("PATCH", "/api/v1/devices/pump-3/labels", `{"set":{"site":"paris"},"remove":["model"]}`)
	var inv mqttdev.Inventory
	if err := json.Unmarshal([]byte(body), &inv); code != 200 || err != nil || inv.Labels.String() != "site=paris" {
		t.Fatalf("PATCH = %d %s", code, body)
	}
	if code, body := e.do("GET", "/api/v1/devices?select=site=paris", ""); code != 200 || !strings.Contains(body, "pump-3") || strings.Contains(body, "pump-1") {
		t.Fatalf("devices?select = %d %s", code, body)
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
		`{"name":"../x","command":"u","devices":["a"]}`:               "name",
		`{"name":"a b","command":"u","devices":["a"]}`:                "name",
		`{"name":"x","command":"","devices":["a"]}`:                   "command",
		`{"name":"x","command":"u"}`:                                  "select",
		`{"name":"x","command":"u","devices":["a/#"]}`:                "devices",
		`{"name":"x","command":"u","devices":["a"],"args":[1]}`:       "args",
		`{"name":"x","command":"u","devices":["a"],"waves":"50%"}`:    "waves",
		`{"name":"x","command":"u","devices":["a"],"rate":"-1/1s"}`:   "rate",
		`{"name":"x","command":"u","devices":["a"],"abort_when":"x"}`: "abort-when",
		`{"name":"x","command":"u","devices":["a"],"timeout":"soon"}`: "timeout",
		`{"name":"x","command":"u","devices":["a"],"retries":99}`:     "retries",
		`{"name":"x","command":"u","devices":["a"],"wave":"1"}`:       "wave",
		`{"name":"x","command":"u","select":"model=none"}`:            "select",
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
	for deadline := time.Now().Add(30 * time.Second); !p.State.Final(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("rollout still %s", p.State)
		}
		if err := s.Step(t.Context(), "bad"); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		_, body := e.do("GET", "/api/v1/rollouts/bad", "")
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
	}
	if w := p.Waves; p.State != rollout.StateAborted || w[0].State != rollout.WaveAborted || !w[0].Ended ||
		!w[0].EndedAt.Equal(p.EndedAt) || w[1].State != rollout.WaveSkipped || w[2].State != rollout.WaveSkipped || w[2].Started {
		t.Fatalf("%s, waves %+v", p.State, w)
	}
	body := e.wantPage("/rollout?name=bad", 200, `<td class="wave-state">aborted</td>`, `<td class="wave-state">skipped</td>`)
	if !strings.Contains(body, `data-wave="1" data-state="aborted"`) || !strings.Contains(body, `data-wave="3" data-state="skipped"`) {
		t.Errorf("the waves chart does not show wave 1 aborted, wave 3 skipped")
	}
}
