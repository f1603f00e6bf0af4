package web_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// A publish of a kind no live worker runs is done and answered with a
// warning; ?strict=true refuses it with a 400 naming kind and writes
// nothing.
func TestPublishWarnsOfKindWithoutWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	warnings := func(body string) []string {
		t.Helper()
		var resp struct {
			Warnings []string `json:"warnings"`
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return resp.Warnings
	}

	out := e.want("POST", "/api/v1/tasks", `{"key":"r1","kind":"resize","payload":{"id":1}}`, http.StatusCreated, `"result"`)
	want := []string{`no live worker runs kind "resize" (live: none); the task waits until one does`}
	if got := warnings(out); !slices.Equal(got, want) {
		t.Errorf("warnings %q, want %q", got, want)
	}

	now := e.store.Now()
	w := task.WorkerInfo{ID: "w1", Instance: "w1-1", Host: "test", PID: os.Getpid(), Kinds: []string{"resize", "noop"},
		Heartbeat: now, StartedAt: now, Until: now.Add(time.Hour)}
	if err := e.store.RegisterWorker(t.Context(), task.RegisterParams{Worker: w, Now: now}); err != nil {
		t.Fatal(err)
	}
	out = e.want("POST", "/api/v1/tasks", `{"key":"r2","kind":"resize"}`, http.StatusCreated, `"result"`)
	if strings.Contains(out, "warnings") {
		t.Errorf("with a live worker of the kind: %s; want no warnings field", out)
	}
	out = e.want("POST", "/api/v1/tasks", `{"key":"r1","kind":"resize"}`, http.StatusOK, `"existing"`)
	if got := warnings(out); got != nil {
		t.Errorf("existing task: warnings %q", got)
	}
	out = e.want("POST", "/api/v1/tasks?strict=false", `{"key":"r3","kind":"resze"}`, http.StatusCreated, `"result"`)
	want = []string{`no live worker runs kind "resze" (live: noop, resize); the task waits until one does`}
	if got := warnings(out); !slices.Equal(got, want) {
		t.Errorf("warnings %q, want %q", got, want)
	}

	e.want("POST", "/api/v1/tasks?strict=true", `{"key":"r4","kind":"resze"}`, http.StatusBadRequest,
		`"kind: no live worker runs kind \"resze\" (live: noop, resize); a strict publish refuses it"`)
	if _, err := e.store.Get(t.Context(), "r4"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("a refused strict publish stored the task: %v", err)
	}
	e.want("POST", "/api/v1/tasks?strict=1", `{"key":"r5","kind":"resize"}`, http.StatusCreated, `"result"`)
	e.want("POST", "/api/v1/tasks?strict=maybe", `{"key":"r6","kind":"resize"}`, http.StatusBadRequest, `"strict: \"maybe\" is not true or false"`)
	if _, err := e.store.Get(t.Context(), "r6"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("a bad strict value stored the task: %v", err)
	}
}

// A flow whose task steps (or rollbacks) are of a kind no live worker
// runs is published with a warning per kind; ?strict=true refuses it with
// a 400 naming the first such step's field and writes nothing. Signal and
// sleep steps run as timer tasks every worker takes: no warning.
func TestPublishFlowWarnsOfKindWithoutWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	warnings := func(body string) []string {
		t.Helper()
		var resp struct {
			Warnings []string `json:"warnings"`
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return resp.Warnings
	}
	now := e.store.Now()
	w := task.WorkerInfo{ID: "w1", Instance: "w1-1", Host: "test", PID: os.Getpid(), Kinds: []string{"resize", "noop"},
		Heartbeat: now, StartedAt: now, Until: now.Add(time.Hour)}
	if err := e.store.RegisterWorker(t.Context(), task.RegisterParams{Worker: w, Now: now}); err != nil {
		t.Fatal(err)
	}
	const spec = `{"key":%q,"steps":[
 {"name":"wait","type":"signal"},
 {"name":"a","kind":"resize","rollback":{"kind":"unresize"}},
 {"name":"b","kind":"resze"},
 {"name":"c","kind":"resze","rollback":{"kind":"noop"}}]}`
	out := e.want("POST", "/api/v1/flows", fmt.Sprintf(spec, "f1"), http.StatusCreated, `"result":"inserted"`)
	want := []string{
		`no live worker runs kind "unresize" (live: noop, resize); the task waits until one does`,
		`no live worker runs kind "resze" (live: noop, resize); the task waits until one does`,
	}
	if got := warnings(out); !slices.Equal(got, want) {
		t.Errorf("warnings %q, want %q", got, want)
	}
	out = e.want("POST", "/api/v1/flows?strict=false", fmt.Sprintf(spec, "f1"), http.StatusOK, `"result":"existing"`)
	if got := warnings(out); !slices.Equal(got, want) {
		t.Errorf("existing flow: warnings %q, want %q", got, want)
	}

	e.want("POST", "/api/v1/flows?strict=true", fmt.Sprintf(spec, "f2"), http.StatusBadRequest,
		`"steps[1].rollback.kind: no live worker runs kind \"unresize\" (live: noop, resize); a strict publish refuses it"`)
	e.want("POST", "/api/v1/flows?strict=maybe", `{"key":"f3","steps":[{"name":"a","kind":"noop"}]}`, http.StatusBadRequest,
		`"strict: \"maybe\" is not true or false"`)
	for _, key := range []string{"f2", "f3"} {
		if code, body := e.do("GET", "/api/v1/flows/"+key, ""); code != http.StatusNotFound {
			t.Errorf("a refused publish stored flow %s: %d %s", key, code, body)
		}
	}
	out = e.want("POST", "/api/v1/flows?strict=true", `{"key":"f4","steps":[{"name":"s","sleep":"1h"},{"name":"a","kind":"noop"}]}`,
		http.StatusCreated, `"result":"inserted"`)
	if strings.Contains(out, "warnings") {
		t.Errorf("every kind run by a live worker: %s; want no warnings field", out)
	}
}
