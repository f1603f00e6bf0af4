package web_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

// tasks is every task in the store, for before/after comparisons.
func (e *env) tasks() string {
	e.t.Helper()
	ts, err := e.store.List(e.t.Context(), task.ListQuery{})
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(ts)
	return string(b)
}

// publishN inserts n tasks through the store, created a second apart in
// the past hour: keys p00.., kinds k1/k2.
func (e *env) publishN(n int) []*task.Task {
	e.t.Helper()
	base := e.store.Now().Add(-time.Hour)
	var out []*task.Task
	for i := range n {
		t, err := task.NewTask(task.PublishParams{
			Key: fmt.Sprintf("p%02d", i), Kind: []string{"k1", "k2"}[i%2],
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d,"color":"%s"}`, i, []string{"red", "blue", "green"}[i%3])),
		}, base.Add(time.Duration(i)*time.Second))
		if err == nil {
			_, _, err = e.store.Insert(e.t.Context(), t)
		}
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, t)
	}
	return out
}

type pageBody struct {
	Tasks      []*task.Task `json:"tasks"`
	NextCursor string       `json:"next_cursor"`
	PrevCursor string       `json:"prev_cursor"`
}

func (e *env) page(query string) pageBody {
	e.t.Helper()
	var p pageBody
	out := e.want("GET", "/api/v1/tasks?"+query, "", 200, `"tasks":`)
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		e.t.Fatalf("GET tasks?%s: %v in %s", query, err, out)
	}
	return p
}

func taskKeys(ts []*task.Task) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Key
	}
	return out
}

func TestPublishAndGet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("POST", "/api/v1/tasks", `{"key":"a","kind":"noop"}`, 201, `"result":"inserted"`)
	e.want("POST", "/api/v1/tasks", `{"key":"a","kind":"noop"}`, 200, `"result":"existing"`)
	out := e.want("POST", "/api/v1/tasks", `{"key":"m1","kind":"mail","payload":{"to":"x@example.com"},"priority":5,
		"specific_worker_ids":["w1"],"lock_keys":["smtp"],"max_unexpected_retries":0,"ping_interval":"50ms","delay":"1h"}`, 201, `"key":"m1"`)
	var pub struct {
		Task *task.Task `json:"task"`
	}
	if err := json.Unmarshal([]byte(out), &pub); err != nil {
		t.Fatal(err)
	}
	stored, err := e.store.Get(t.Context(), "m1")
	if err != nil {
		t.Fatal(err)
	}
	if stored.Priority != 5 || stored.MaxUnexpectedRetries != 0 || time.Duration(stored.PingInterval) != 50*time.Millisecond ||
		!slices.Equal(stored.LockKeys, []string{"smtp"}) || stored.RunAt.Before(time.Now().Add(50*time.Minute)) ||
		string(stored.Payload) != `{"to":"x@example.com"}` || pub.Task.Version != stored.Version {
		t.Errorf("stored %+v", stored)
	}
	e.want("GET", "/api/v1/tasks/m1", "", 200, `"specific_worker_ids":["w1"]`)
	e.want("GET", "/api/v1/tasks/nope", "", 404, `{"error":"task not found"}`)
	// A device command gets its device's lock key, as with the CLI.
	e.want("POST", "/api/v1/tasks", `{"key":"d1","kind":"device","payload":{"device":"pump-7","command":"flush"}}`, 201, `"lock_keys":["device:pump-7"]`)
	// Rerun of a finished task.
	if _, err := task.Cancel(t.Context(), e.store, "a"); err != nil {
		t.Fatal(err)
	}
	e.want("POST", "/api/v1/tasks", `{"key":"a","kind":"noop","rerun":true}`, 200, `"result":"rerun"`)
	// The control doorbell is not a task.
	e.want("POST", "/api/v1/pauses", `{"scope":"all"}`, 201, "")
	e.want("GET", "/api/v1/tasks/leasepool:control", "", 404, "task not found")
	e.want("POST", "/api/v1/tasks/leasepool:control/cancel", "", 400, `key: \"leasepool:control\" is reserved`)
}

func TestPublishBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	big := `{"s":"` + strings.Repeat("x", task.MaxPayloadSize) + `"}`
	for _, c := range []struct{ body, field string }{
		{`{"kind":"noop"}`, "key: must not be empty"},
		{`{"key":"a"}`, "kind: must not be empty"},
		{`{"key":"` + strings.Repeat("k", 513) + `","kind":"noop"}`, "key: is longer than 512 bytes"},
		{`{"key":"a\u0001","kind":"noop"}`, "key: "},
		{`{"key":"a","kind":"sleep","payload":{"duration":"soon"}}`, "payload: sleep: "},
		{`{"key":"a","kind":"exec","payload":{}}`, "payload"},
		{`{"key":"a","kind":"device","payload":{"device":"pump-7"}}`, "payload: "},
		{`{"key":"a","kind":"noop","payload":` + big + `}`, "payload: is "},
		{`{"key":"a","kind":"noop","priority":"high"}`, "priority: want a JSON int"},
		{`{"key":"a","kind":"noop","ping_interval":"1ms"}`, "ping_interval: (1ms) must be at least 10ms"},
		{`{"key":"a","kind":"noop","ping_interval":"soon"}`, "body: "},
		{`{"key":"a","kind":"noop","ping_interval":"2s","worker_timeout":"1s"}`, "worker_timeout: (1s) must be above ping_interval"},
		{`{"key":"a","kind":"noop","max_unexpected_retries":-1}`, "max_unexpected_retries: must not be negative"},
		{`{"key":"a","kind":"noop","concurrent_worker_cnt":-1}`, "concurrent_worker_cnt: must be at least 1"},
		{`{"key":"a","kind":"noop","delay":"-1s"}`, "delay: must not be negative"},
		{`{"key":"a","kind":"noop","delay":"1s","run_at":"2030-01-01T00:00:00Z"}`, "delay: give run_at or delay, not both"},
		{`{"key":"a","kind":"noop","specific_worker_ids":[""]}`, "specific_worker_ids: must not be empty"},
		{`{"key":"a","kind":"noop","lock_keys":[""]}`, "lock_keys: must not be empty"},
		{`{"key":"a","kind":"noop","colour":"red"}`, `body: want one JSON object: json: unknown field \"colour\"`},
		{`{"key":"a","kind":"noop"} {}`, "body: want one JSON object, got more"},
		{``, "body: "},
	} {
		e.want("POST", "/api/v1/tasks", c.body, 400, `{"error":"`+c.field)
	}
	if got := e.tasks(); got != "null" {
		t.Errorf("bad publishes wrote tasks: %s", got)
	}
}

func TestListTasks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	all := taskKeys(e.publishN(23))
	newest := slices.Clone(all)
	slices.Reverse(newest)
	// Newest first by default; a walk by next_cursor sees each task once.
	if p := e.page(""); !slices.Equal(taskKeys(p.Tasks), newest) || p.NextCursor != "" || p.PrevCursor != "" {
		t.Fatalf("first page = %v next %q prev %q", taskKeys(p.Tasks), p.NextCursor, p.PrevCursor)
	}
	for _, order := range []string{"desc", "asc"} {
		want := newest
		if order == "asc" {
			want = all
		}
		var got []string
		var pages []pageBody
		q := "limit=5&order=" + order
		for p := e.page(q); ; p = e.page(q + "&cursor=" + p.NextCursor) {
			pages = append(pages, p)
			got = append(got, taskKeys(p.Tasks)...)
			if p.NextCursor == "" {
				break
			}
		}
		if !slices.Equal(got, want) || len(pages) != 5 {
			t.Fatalf("%s walk = %v in %d pages, want %v in 5", order, got, len(pages), want)
		}
		// prev_cursor of page 3 gives page 2 back, in the same order.
		back := e.page(q + "&cursor=" + pages[2].PrevCursor)
		if !slices.Equal(taskKeys(back.Tasks), taskKeys(pages[1].Tasks)) || back.NextCursor == "" || back.PrevCursor == "" {
			t.Errorf("%s: back from page 3 = %v (next %q prev %q), want page 2 %v", order, taskKeys(back.Tasks),
				back.NextCursor, back.PrevCursor, taskKeys(pages[1].Tasks))
		}
		first := e.page(q + "&cursor=" + back.PrevCursor)
		if !slices.Equal(taskKeys(first.Tasks), taskKeys(pages[0].Tasks)) || first.PrevCursor != "" {
			t.Errorf("%s: back to page 1 = %v prev %q, want %v and no prev", order, taskKeys(first.Tasks), first.PrevCursor, taskKeys(pages[0].Tasks))
		}
	}
	if _, err := task.Cancel(t.Context(), e.store, "p04"); err != nil {
		t.Fatal(err)
	}
	if _, err := task.Modify(t.Context(), e.store, "p07", func(tk *task.Task) error {
		tk.Claim(task.Holder{TaskKey: tk.Key, WorkerID: "w7"}, e.store.Now())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mid := e.mustGet("p11").CreatedAt
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"state=cancelled", []string{"p04"}},
		{"state=running&worker=w7", []string{"p07"}},
		{"worker=w8", nil},
		{"kind=k2&key_prefix=p1&order=asc", []string{"p11", "p13", "p15", "p17", "p19"}},
		{"text=%22color%22%3A%22green%22&kind=k1&order=asc", []string{"p02", "p08", "p14", "p20"}},
		{"created_after=" + url.QueryEscape(mid.Format(time.RFC3339Nano)) + "&key_prefix=p1&order=asc", []string{"p12", "p13", "p14", "p15", "p16", "p17", "p18", "p19"}},
		{"created_before=" + url.QueryEscape(mid.Format(time.RFC3339Nano)) + "&limit=2", []string{"p10", "p09"}},
	} {
		if got := taskKeys(e.page(c.query).Tasks); !slices.Equal(got, c.want) && (len(got) != 0 || len(c.want) != 0) {
			t.Errorf("GET tasks?%s = %v, want %v", c.query, got, c.want)
		}
	}
	for _, c := range []struct{ query, field string }{
		{"limit=0", "limit: "}, {"limit=1001", "limit: "}, {"limit=ten", "limit: "},
		{"state=bogus", "state: "}, {"order=up", "order: "}, {"cursor=zzz", "cursor: "},
		{"cursor=" + base64("c12"), "cursor: "}, {"created_after=yesterday", "created_after: "},
		{"updated_before=2020", "updated_before: "}, {"colour=red", "colour: unknown parameter"},
		{"kind=" + strings.Repeat("k", 513), "kind: "},
	} {
		e.want("GET", "/api/v1/tasks?"+c.query, "", 400, `{"error":"`+c.field)
	}
}

func base64(s string) string {
	b, _ := json.Marshal([]byte(s)) // std base64 in quotes; URL-safe enough for these letters
	return strings.TrimRight(strings.Trim(string(b), `"`), "=")
}

func (e *env) mustGet(key string) *task.Task {
	e.t.Helper()
	t, err := e.store.Get(e.t.Context(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

func TestCancelRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.publishN(1)
	e.want("POST", "/api/v1/tasks/p00/cancel", "", 200, `"state":"cancelled"`)
	if got := e.mustGet("p00"); got.State != task.StateCancelled {
		t.Fatalf("after cancel: %s", got.State)
	}
	e.want("POST", "/api/v1/tasks/p00/cancel", "", 409, "task already finished")
	e.want("POST", "/api/v1/tasks/p00/retry", "", 200, `"state":"pending"`)
	e.want("POST", "/api/v1/tasks/p00/retry", "", 409, "task not finished")
	e.want("POST", "/api/v1/tasks/nope/cancel", "", 404, "task not found")
	e.want("POST", "/api/v1/tasks/nope/retry", "", 404, "task not found")
	e.want("GET", "/api/v1/tasks/p00/cancel", "", 405, "allowed: POST")
}

type bulkBody struct {
	Results []struct {
		Key    string `json:"key"`
		OK     bool   `json:"ok"`
		State  string `json:"state"`
		Status int    `json:"status"`
	} `json:"results"`
	OK         int    `json:"ok"`
	Failed     int    `json:"failed"`
	NextCursor string `json:"next_cursor"`
}

func (e *env) bulk(body string) bulkBody {
	e.t.Helper()
	var b bulkBody
	if err := json.Unmarshal([]byte(e.want("POST", "/api/v1/tasks/bulk", body, 200, `"results"`)), &b); err != nil {
		e.t.Fatal(err)
	}
	return b
}

func TestBulk(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.publishN(9)
	if _, err := task.Cancel(t.Context(), e.store, "p01"); err != nil {
		t.Fatal(err)
	}
	b := e.bulk(`{"action":"cancel","keys":["p00","p01","nope","p02"]}`)
	type res struct {
		key    string
		ok     bool
		status int
	}
	var got []res
	for _, r := range b.Results {
		got = append(got, res{r.Key, r.OK, r.Status})
	}
	if want := []res{{"p00", true, 0}, {"p01", false, 409}, {"nope", false, 404}, {"p02", true, 0}}; !slices.Equal(got, want) || b.OK != 2 || b.Failed != 2 {
		t.Errorf("bulk cancel by keys = %+v (ok %d failed %d), want %+v", got, b.OK, b.Failed, want)
	}
	// By filter, two at a time, following next_cursor: p03..p08 pending.
	var cancelled []string
	cursor := ""
	for range 10 {
		b := e.bulk(`{"action":"cancel","filter":{"state":"pending"},"limit":2,"cursor":"` + cursor + `"}`)
		for _, r := range b.Results {
			if !r.OK || r.State != "cancelled" {
				t.Errorf("bulk by filter: %+v", r)
			}
			cancelled = append(cancelled, r.Key)
		}
		if cursor = b.NextCursor; cursor == "" {
			break
		}
	}
	if want := []string{"p03", "p04", "p05", "p06", "p07", "p08"}; !slices.Equal(cancelled, want) {
		t.Errorf("bulk cancel by filter reached %v, want %v", cancelled, want)
	}
	if b := e.bulk(`{"action":"retry","filter":{"kind":"k1","key_prefix":"p0"}}`); b.OK != 5 || b.NextCursor != "" {
		t.Errorf("bulk retry k1 = ok %d next %q, want 5 and none", b.OK, b.NextCursor)
	}
	before := e.tasks()
	keys, _ := json.Marshal(slices.Repeat([]string{"p00"}, 1001))
	for _, c := range []struct{ body, field string }{
		{`{"action":"delete","keys":["p00"]}`, `action: \"delete\" is not one of cancel, retry`},
		{`{"action":"cancel"}`, "keys: give keys or filter, exactly one"},
		{`{"action":"cancel","keys":["p00"],"filter":{}}`, "keys: give keys or filter, exactly one"},
		{`{"action":"cancel","keys":` + string(keys) + `}`, "keys: 1001 keys, more than the limit of 1000"},
		{`{"action":"cancel","keys":["p00",""]}`, "keys: must not be empty"},
		{`{"action":"cancel","keys":["p00"],"limit":5}`, "limit: applies to a filter only"},
		{`{"action":"cancel","filter":{"state":"done"}}`, "state: "},
		{`{"action":"cancel","filter":{"colour":"red"}}`, "body: "},
		{`{"action":"cancel","filter":{},"limit":1001}`, "limit: must be from 1 to 1000"},
		{`{"action":"cancel","filter":{},"cursor":"zzz"}`, "cursor: "},
	} {
		e.want("POST", "/api/v1/tasks/bulk", c.body, 400, `{"error":"`+c.field)
	}
	if after := e.tasks(); after != before {
		t.Errorf("bad bulk requests changed tasks")
	}
}

func TestWorkersDevicesStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{Token: token})
	e.want("GET", "/api/v1/workers", "", 200, "[]")
	e.want("GET", "/api/v1/devices", "", 200, "[]")
	e.want("GET", "/api/v1/stats", "", 200, `"counts":[]`)
	now := e.store.Now()
	for _, w := range []task.WorkerInfo{
		{ID: "w1", Instance: "i1", Host: "h", PID: 1, Heartbeat: now, Until: now.Add(time.Hour)},
		{ID: "w2", Instance: "i2", Host: "h", PID: 2, Heartbeat: now, Until: now.Add(time.Millisecond)},
	} {
		if err := e.store.RegisterWorker(t.Context(), task.RegisterParams{Worker: w, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := mqttdev.StoreStates(e.store).PutDeviceState(t.Context(), mqttdev.DeviceState{ID: "pump-7", Online: true, At: now}); err != nil {
		t.Fatal(err)
	}
	e.want("POST", "/api/v1/tasks", `{"key":"d1","kind":"device","payload":{"device":"pump-7","command":"flush"}}`, 201, "")
	e.want("POST", "/api/v1/tasks", `{"key":"d2","kind":"device","payload":{"device":"pump-7","command":"drain"}}`, 201, "")
	if _, err := task.Modify(t.Context(), e.store, "d1", func(tk *task.Task) error {
		tk.Claim(task.Holder{TaskKey: tk.Key, WorkerID: "w1"}, e.store.Now())
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.publishN(3)
	e.want("POST", "/api/v1/tasks/p00/cancel", "", 200, "")
	testutil.Eventually(t, time.Second, "w2's registration to lapse", func() bool { return e.store.Now().After(now.Add(time.Millisecond)) })
	var ws []struct {
		ID   string `json:"id"`
		Live bool   `json:"live"`
	}
	if err := json.Unmarshal([]byte(e.want("GET", "/api/v1/workers", "", 200, "")), &ws); err != nil || len(ws) != 2 ||
		ws[0].ID != "w1" || !ws[0].Live || ws[1].ID != "w2" || ws[1].Live {
		t.Errorf("workers = %+v, %v", ws, err)
	}
	e.want("GET", "/api/v1/devices", "", 200, `[{"id":"pump-7","known":true,"online":true,`)
	e.want("GET", "/api/v1/devices", "", 200, `"current":"d1","command":"flush","holder":"w1","attempt":1,"queued":1,"new":true}]`)
	var st struct {
		ByState     map[string]int64 `json:"by_state"`
		Workers     int              `json:"workers"`
		LiveWorkers int              `json:"live_workers"`
		OldestReady time.Time        `json:"oldest_ready_at"`
	}
	if err := json.Unmarshal([]byte(e.want("GET", "/api/v1/stats", "", 200, `{"state":"running","kind":"device","n":1}`)), &st); err != nil ||
		st.ByState["pending"] != 3 || st.ByState["cancelled"] != 1 || st.ByState["running"] != 1 || st.Workers != 2 || st.LiveWorkers != 1 || st.OldestReady.IsZero() {
		t.Errorf("stats = %+v, %v", st, err)
	}
}

func TestTasksReadOnlyAndAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t, web.Config{ReadOnly: true, Token: token})
	e.publishN(1)
	before := e.tasks()
	writes := []struct{ method, path, body string }{
		{"POST", "/api/v1/tasks", `{"key":"a","kind":"noop"}`},
		{"POST", "/api/v1/tasks/p00/cancel", ""},
		{"POST", "/api/v1/tasks/p00/retry", ""},
		{"POST", "/api/v1/tasks/bulk", `{"action":"cancel","keys":["p00"]}`},
	}
	for _, r := range writes {
		e.want(r.method, r.path, r.body, 403, `{"error":"this server is read-only"}`)
	}
	reads := []string{"/api/v1/tasks", "/api/v1/tasks/p00", "/api/v1/workers", "/api/v1/devices", "/api/v1/stats"}
	for _, p := range reads {
		e.want("GET", p, "", 200, "")
		for _, auth := range []string{"", "Bearer wrong"} {
			if code, _ := e.doAuth("GET", p, "", auth); code != 401 {
				t.Errorf("GET %s with Authorization %q = %d, want 401", p, auth, code)
			}
		}
	}
	for _, r := range writes {
		if code, _ := e.doAuth(r.method, r.path, r.body, "Bearer nope"); code != 401 {
			t.Errorf("%s %s without the token = %d, want 401", r.method, r.path, code)
		}
	}
	if code, _ := e.doAuth("GET", "/api/v1/events", "", ""); code != 401 {
		t.Errorf("GET events without the token = %d, want 401", code)
	}
	if after := e.tasks(); after != before {
		t.Errorf("read-only server changed tasks")
	}
}
