package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

type claimedJob struct {
	Key        string          `json:"key"`
	Kind       string          `json:"kind"`
	Attempt    int             `json:"attempt"`
	Payload    json.RawMessage `json:"payload"`
	LeaseUntil time.Time       `json:"lease_until"`
	LeaseMS    int64           `json:"lease_ms"`
	RenewMS    int64           `json:"renew_ms"`
}

// register registers worker id's instance for kinds.
func (e *env) register(id, instance string, kinds ...string) {
	e.t.Helper()
	k, _ := json.Marshal(kinds)
	e.want("PUT", "/api/v1/workers/"+id, fmt.Sprintf(`{"instance":%q,"kinds":%s,"concurrency":4}`, instance, k), 200, `"heartbeat_ms"`)
}

// claim claims up to max tasks for id's instance, waiting up to wait.
func (e *env) claim(id, instance string, max int, wait time.Duration) []claimedJob {
	e.t.Helper()
	out := e.want("POST", "/api/v1/workers/"+id+"/claim",
		fmt.Sprintf(`{"instance":%q,"max":%d,"wait_ms":%d}`, instance, max, wait.Milliseconds()), 200, `"jobs"`)
	var b struct{ Jobs []claimedJob }
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		e.t.Fatal(err)
	}
	return b.Jobs
}

func (e *env) post(body string) {
	e.t.Helper()
	e.want("POST", "/api/v1/tasks", body, 201, `"inserted"`)
}

func (e *env) task(key string) *task.Task {
	e.t.Helper()
	t, err := e.store.Get(e.t.Context(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	return t
}

func finishPath(id, key string) string { return "/api/v1/workers/" + id + "/jobs/" + key + "/finish" }
func renewPath(id, key string) string  { return "/api/v1/workers/" + id + "/jobs/" + key + "/renew" }

func TestRemoteWorkerRunsATask(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.post(`{"key":"img/7","kind":"resize","payload":{"src":"a.png"}}`)
	e.register("w1", "i1", "resize")
	jobs := e.claim("w1", "i1", 4, time.Second)
	if len(jobs) != 1 || jobs[0].Key != "img/7" || jobs[0].Attempt != 1 || string(jobs[0].Payload) != `{"src":"a.png"}` {
		t.Fatalf("claimed %+v, want img/7 attempt 1 with its payload", jobs)
	}
	if jobs[0].LeaseMS <= 0 || jobs[0].RenewMS <= 0 || jobs[0].RenewMS >= jobs[0].LeaseMS {
		t.Errorf("lease_ms %d, renew_ms %d: want 0 < renew < lease", jobs[0].LeaseMS, jobs[0].RenewMS)
	}
	key := "img%2F7" // a key is one path segment
	e.want("POST", renewPath("w1", key), `{"instance":"i1","attempt":1,"log":["resized 3 of 9"]}`, 200, `"lease_until"`)
	// Another instance of the same worker id, a wrong attempt number: refused, nothing written.
	before := e.task("img/7").Version
	e.want("POST", finishPath("w1", key), `{"instance":"i2","attempt":1,"outcome":"succeeded"}`, 409, `"code":"lease_lost"`)
	e.want("POST", finishPath("w1", key), `{"instance":"i1","attempt":2,"outcome":"succeeded"}`, 409, `"code":"lease_lost"`)
	e.want("POST", finishPath("w2", key), `{"instance":"i1","attempt":1,"outcome":"succeeded"}`, 409, `"code":"lease_lost"`)
	if v := e.task("img/7").Version; v != before {
		t.Fatalf("refused finishes wrote: version %d, want %d", v, before)
	}
	e.want("POST", finishPath("w1", key), `{"instance":"i1","attempt":1,"outcome":"succeeded","result":{"w":640},"log":["done"]}`,
		200, `"outcome":"succeeded"`)
	got := e.task("img/7")
	w := got.Attempts[0]
	if got.State != task.StateSucceeded || string(w.Result) != `{"w":640}` || len(w.Log) != 2 || w.Log[0].Msg != "resized 3 of 9" || w.Log[1].Msg != "done" {
		t.Fatalf("stored %s, result %s, log %+v; want succeeded, the result and both lines", got.State, w.Result, w.Log)
	}
	e.want("POST", finishPath("w1", key), `{"instance":"i1","attempt":1,"outcome":"succeeded"}`, 409, `"code":"task_done"`)
}

func TestRemoteFinishAfterLeaseIsRefused(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.post(`{"key":"slow","kind":"k","worker_timeout":"300ms","ping_interval":"100ms"}`)
	e.register("frozen", "i1", "k")
	e.register("alive", "i2", "k")
	jobs := e.claim("frozen", "i1", 1, time.Second)
	if len(jobs) != 1 {
		t.Fatalf("claimed %d jobs, want 1", len(jobs))
	}
	testutil.Eventually(t, 5*time.Second, "the frozen worker's lease ends", func() bool {
		return e.store.Now().After(jobs[0].LeaseUntil)
	})
	// Expired, not yet taken over: still refused, nothing written.
	before := e.task("slow").Version
	e.want("POST", renewPath("frozen", "slow"), `{"instance":"i1","attempt":1}`, 409, `"code":"lease_lost"`)
	e.want("POST", finishPath("frozen", "slow"), `{"instance":"i1","attempt":1,"outcome":"succeeded"}`, 409, `"code":"lease_lost"`)
	if v := e.task("slow").Version; v != before {
		t.Fatalf("refused finish wrote: version %d, want %d", v, before)
	}
	next := e.claim("alive", "i2", 1, 5*time.Second)
	if len(next) != 1 || next[0].Attempt != 2 {
		t.Fatalf("takeover claimed %+v, want attempt 2", next)
	}
	e.want("POST", finishPath("frozen", "slow"), `{"instance":"i1","attempt":1,"outcome":"succeeded"}`, 409, `"code":"lease_lost"`)
	e.want("POST", finishPath("alive", "slow"), `{"instance":"i2","attempt":2,"outcome":"succeeded"}`, 200, `"succeeded"`)
	got := e.task("slow")
	for _, w := range got.Attempts {
		if w.WorkerID == "frozen" && w.State == task.AttemptSuccess {
			t.Fatalf("the frozen worker's finish was recorded: %+v", got.Attempts)
		}
	}
}

func TestRemoteClaimFollowsTheRules(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.register("w1", "i1", "k")
	e.post(`{"key":"low","kind":"k","priority":1}`)
	e.post(`{"key":"high","kind":"k","priority":9}`)
	e.post(`{"key":"pinned-elsewhere","kind":"k","priority":10,"specific_worker_ids":["w9"]}`)
	e.post(`{"key":"later","kind":"k","priority":10,"delay":"1h"}`)
	e.post(`{"key":"other-kind","kind":"x","priority":10}`)
	e.post(`{"key":"lock-a","kind":"k","priority":5,"lock_keys":["db"]}`)
	e.post(`{"key":"lock-b","kind":"k","priority":4,"lock_keys":["db"]}`)
	jobs := e.claim("w1", "i1", 10, 0)
	var keys []string
	for _, j := range jobs {
		keys = append(keys, j.Key)
	}
	if got := strings.Join(keys, ","); got != "high,lock-a,low" {
		t.Fatalf("claimed %s, want high,lock-a,low (by priority; not the pinned, delayed, other-kind or second lock holder)", got)
	}

	// A pause holds the kind back; resuming lets it through.
	if _, err := control.Pause(t.Context(), e.store, control.Kind("p")); err != nil {
		t.Fatal(err)
	}
	e.register("w2", "i2", "p")
	e.post(`{"key":"paused","kind":"p"}`)
	if jobs := e.claim("w2", "i2", 1, 0); len(jobs) != 0 {
		t.Fatalf("claimed %+v under a pause", jobs)
	}
	if _, err := control.Resume(t.Context(), e.store, control.Kind("p")); err != nil {
		t.Fatal(err)
	}
	if jobs := e.claim("w2", "i2", 1, 5*time.Second); len(jobs) != 1 || jobs[0].Key != "paused" {
		t.Fatalf("after resume claimed %+v, want paused", jobs)
	}
}

func TestRemoteClaimWaitsForAPublish(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.register("w1", "i1", "k")
	got := make(chan []claimedJob, 1)
	go func() { got <- e.claim("w1", "i1", 1, 30*time.Second) }()
	// The claim is waiting: its registration was read, nothing to claim.
	e.post(`{"key":"late","kind":"k"}`)
	select {
	case jobs := <-got:
		if len(jobs) != 1 || jobs[0].Key != "late" {
			t.Fatalf("claimed %+v, want late", jobs)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a waiting claim did not get the task published meanwhile")
	}
}

// Claims racing from several workers over one store never hand a task
// out twice.
func TestRemoteClaimsNeverCollide(t *testing.T) {
	e := newEnv(t, web.Config{})
	const n = 60
	for i := range n {
		e.post(fmt.Sprintf(`{"key":"t%02d","kind":"k"}`, i))
	}
	var mu sync.Mutex
	claims := map[string]int{}
	var wg sync.WaitGroup
	for w := range 4 {
		id := fmt.Sprintf("w%d", w)
		e.register(id, "i", "k")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				jobs := e.claim(id, "i", 7, 0)
				if len(jobs) == 0 {
					return
				}
				mu.Lock()
				for _, j := range jobs {
					claims[j.Key]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	var twice []string
	for k, c := range claims {
		if c != 1 {
			twice = append(twice, k)
		}
	}
	sort.Strings(twice)
	if len(claims) != n || len(twice) > 0 {
		t.Fatalf("%d of %d tasks claimed; claimed more than once: %v", len(claims), n, twice)
	}
}

func TestRemoteWorkerLearnsOfLoss(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.post(`{"key":"c","kind":"k"}`)
	e.register("w1", "i1", "k")
	if jobs := e.claim("w1", "i1", 1, time.Second); len(jobs) != 1 {
		t.Fatalf("claimed %d, want 1", len(jobs))
	}
	e.want("POST", "/api/v1/tasks/c/cancel", "", 200, `"cancelled"`)
	e.want("POST", renewPath("w1", "c"), `{"instance":"i1","attempt":1}`, 409, `"code":"cancelled"`)
	e.want("PUT", "/api/v1/workers/w1", `{"instance":"i1","kinds":["k"],"held":[{"key":"c","attempt":1},{"key":"gone","attempt":1}]}`,
		200, `"lost":[{"key":"c","attempt":1,"reason":"cancelled"},{"key":"gone","attempt":1,"reason":"not_found"}]`)
}

func TestRemoteRegistration(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1"}`, 409, `"code":"not_registered"`)
	e.register("w1", "i1", "k")
	e.want("PUT", "/api/v1/workers/w1", `{"instance":"i2","kinds":["k"]}`, 409, `"code":"worker_id_taken"`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i2"}`, 409, `"code":"not_registered"`)
	e.want("DELETE", "/api/v1/workers/w1?instance=i2", "", 409, `"code":"not_registered"`)
	e.want("DELETE", "/api/v1/workers/w1?instance=i1", "", 200, `"unregistered":true`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1"}`, 409, `"code":"not_registered"`)
}

func TestRemoteBadInput(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.register("w1", "i1", "k")
	e.post(`{"key":"t","kind":"k"}`)
	e.want("PUT", "/api/v1/workers/w1", `{"instance":"i1"}`, 400, `kinds`)
	e.want("PUT", "/api/v1/workers/bad%07id", `{"instance":"i1","kinds":["k"]}`, 400, `worker id`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","max":0}`, 400, `{"error":"max: must be 1 to 256, not 0"}`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","max":1000}`, 400, `max`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","wait_ms":-1}`, 400, `wait_ms`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","bogus":1}`, 400, `bogus`)
	e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","kinds":["leasepool.flow-timer"]}`, 400, `kinds[0]`)
	e.want("PUT", "/api/v1/workers/w1", `{"instance":"i1","kinds":["k","leasepool.x"]}`, 400, `kinds[1]`)
	if jobs := e.claim("w1", "i1", 1, 0); len(jobs) != 1 {
		t.Fatalf("claimed %d, want 1", len(jobs))
	}
	before := e.task("t").Version
	e.want("POST", finishPath("w1", "t"), `{"instance":"i1","attempt":1,"outcome":"done"}`, 400, `outcome`)
	e.want("POST", finishPath("w1", "t"), `{"instance":"i1","attempt":1,"outcome":"failed"}`, 400, `error`)
	e.want("POST", finishPath("w1", "t"), `{"instance":"i1","attempt":0,"outcome":"succeeded"}`, 400, `attempt`)
	e.want("POST", finishPath("w1", "t"), `{"instance":"i1","attempt":1,"outcome":"succeeded","result":"`+strings.Repeat("x", 17<<10)+`"}`, 400, `result`)
	if v := e.task("t").Version; v != before {
		t.Fatalf("refused input wrote: version %d, want %d", v, before)
	}
	e.want("POST", finishPath("w1", "t"), `{"instance":"i1","attempt":1,"outcome":"failed","error":"boom"}`, 200, `"outcome":"retried"`)
}

func TestRemoteSnoozeAndRelease(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.register("w1", "i1", "k")
	e.post(`{"key":"s","kind":"k"}`)
	e.post(`{"key":"r","kind":"k"}`)
	if jobs := e.claim("w1", "i1", 2, 0); len(jobs) != 2 {
		t.Fatalf("claimed %d, want 2", len(jobs))
	}
	e.want("POST", finishPath("w1", "s"), `{"instance":"i1","attempt":1,"outcome":"snoozed","snooze_ms":3600000}`, 200, `"snoozed"`)
	e.want("POST", finishPath("w1", "r"), `{"instance":"i1","attempt":1,"outcome":"released"}`, 200, `"released"`)
	jobs := e.claim("w1", "i1", 2, 0)
	if len(jobs) != 1 || jobs[0].Key != "r" || jobs[0].Attempt != 2 {
		t.Fatalf("claimed %+v, want only the released r again (s sleeps an hour)", jobs)
	}
	if s := e.task("s"); s.State != task.StatePending || s.NextClaimAt.Before(e.store.Now().Add(50*time.Minute)) {
		t.Fatalf("snoozed task is %s, next claim %s: want pending an hour out", s.State, s.NextClaimAt)
	}
}

func TestRemoteWorkerToken(t *testing.T) {
	e := newEnv(t, web.Config{Token: "full", WorkerToken: "wtok", WorkerKinds: []string{"k"}})
	wk := "Bearer wtok"
	// The full token publishes and claims a task of another kind.
	e.post(`{"key":"mine","kind":"k"}`)
	e.post(`{"key":"theirs","kind":"x"}`)
	e.register("full", "f1", "x")
	if jobs := e.claim("full", "f1", 1, 0); len(jobs) != 1 || jobs[0].Key != "theirs" {
		t.Fatalf("full token claimed %+v, want theirs", jobs)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/api/v1/tasks", ""},
		{"GET", "/api/v1/tasks/mine", ""},
		{"POST", "/api/v1/tasks", `{"key":"n","kind":"k"}`},
		{"GET", "/api/v1/workers", ""},
		{"POST", "/api/v1/pauses", `{"scope":"all"}`},
	} {
		if code, body := e.doAuth(c.method, c.path, c.body, wk); code != http.StatusForbidden {
			t.Errorf("worker token %s %s = %d %s, want 403", c.method, c.path, code, body)
		}
	}
	if code, body := e.doAuth("PUT", "/api/v1/workers/w", `{"instance":"i","kinds":["x"]}`, wk); code != 403 || !strings.Contains(body, "kinds[0]") {
		t.Errorf("registering for kind x = %d %s, want 403 naming kinds[0]", code, body)
	}
	if code, body := e.doAuth("PUT", "/api/v1/workers/w", `{"instance":"i","kinds":["k"]}`, wk); code != 200 {
		t.Fatalf("register = %d %s", code, body)
	}
	if code, body := e.doAuth("POST", "/api/v1/workers/w/claim", `{"instance":"i","kinds":["x"]}`, wk); code != 403 {
		t.Errorf("claiming kind x = %d %s, want 403", code, body)
	}
	if code, body := e.doAuth("POST", "/api/v1/workers/w/claim", `{"instance":"i","max":5,"wait_ms":0}`, wk); code != 200 || !strings.Contains(body, `"key":"mine"`) || strings.Contains(body, "theirs") {
		t.Errorf("claim = %d %s, want mine only", code, body)
	}
	// Even naming the right holder, another kind's attempt is out of reach.
	if code, body := e.doAuth("POST", finishPath("full", "theirs"), `{"instance":"f1","attempt":1,"outcome":"succeeded"}`, wk); code != 403 || !strings.Contains(body, "kind_not_allowed") {
		t.Errorf("finishing kind x = %d %s, want 403 kind_not_allowed", code, body)
	}
	if s := e.task("theirs"); s.State == task.StateSucceeded {
		t.Fatal("the worker token finished a task of another kind")
	}
	if code, body := e.doAuth("POST", finishPath("w", "mine"), `{"instance":"i","attempt":1,"outcome":"succeeded"}`, wk); code != 200 {
		t.Errorf("finish = %d %s", code, body)
	}
	if _, err := web.NewHandler(web.Config{Store: e.store, Token: "a", WorkerToken: "a"}); err == nil {
		t.Error("a worker token equal to the full token was accepted")
	}
	if _, err := web.NewHandler(web.Config{Store: e.store, WorkerKinds: []string{"k"}}); err == nil {
		t.Error("worker kinds without a worker token were accepted")
	}
}

// One claim's answer is bounded in bytes: tasks of large payloads come a
// few per call, never hundreds of MiB in one answer.
func TestRemoteClaimBoundsBytes(t *testing.T) {
	e := newEnv(t, web.Config{})
	big := strings.Repeat("x", 1000<<10)
	var ps []task.PublishParams
	for i := range 12 {
		ps = append(ps, task.PublishParams{Key: fmt.Sprintf("big%02d", i), Kind: "k", Payload: []byte(`"` + big + `"`)})
	}
	if _, err := task.PublishMany(t.Context(), e.store, ps); err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, want := range []int{8, 4} {
		e.register("w1", "i1", "k") // a heartbeat: publishing 12 MB may take long on a busy machine
		jobs := e.claim("w1", "i1", 12, 0)
		if len(jobs) != want {
			t.Fatalf("claim %d: %d tasks of 1 MB, want %d (8 MiB a call)", got, len(jobs), want)
		}
		got += len(jobs)
	}
}

// Many outcomes in one call, then a claim in the same round trip; each
// outcome answered as its own finish would be.
func TestRemoteFinishMany(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.register("w1", "i1", "k")
	for i := range 4 {
		e.post(fmt.Sprintf(`{"key":"t%d","kind":"k"}`, i))
	}
	if jobs := e.claim("w1", "i1", 3, 0); len(jobs) != 3 {
		t.Fatalf("claimed %d, want 3", len(jobs))
	}
	out := e.want("POST", "/api/v1/workers/w1/finish", `{"instance":"i1","outcomes":[
		{"key":"t0","attempt":1,"outcome":"succeeded","result":{"n":0}},
		{"key":"t1","attempt":1,"outcome":"failed","error":"boom"},
		{"key":"t2","attempt":7,"outcome":"succeeded"},
		{"key":"t2","attempt":1,"outcome":"bogus"},
		{"key":"","attempt":1,"outcome":"succeeded"}],
		"claim":{"max":5,"wait_ms":0}}`, 200, `"results"`)
	var b struct {
		Results []struct {
			Key, State, Outcome, Code, Error string
			Status                           int
		}
		Jobs []claimedJob
	}
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	r := b.Results
	if len(r) != 5 || r[0].Outcome != "succeeded" || r[1].Outcome != "retried" || r[2].Code != "lease_lost" ||
		r[3].Status != 400 || !strings.Contains(r[3].Error, "outcome") || r[4].Status != 400 || !strings.Contains(r[4].Error, "key") {
		t.Fatalf("results %+v", r)
	}
	// t3 was never claimed, t1 waits for its retry backoff, t2 is still held.
	if len(b.Jobs) != 1 || b.Jobs[0].Key != "t3" {
		t.Fatalf("claimed in the same call %+v, want t3", b.Jobs)
	}
	if s := e.task("t0"); s.State != task.StateSucceeded || string(s.Attempts[0].Result) != `{"n":0}` {
		t.Fatalf("t0 %s %s", s.State, s.Attempts[0].Result)
	}
	e.want("POST", "/api/v1/workers/w1/finish", `{"instance":"i1","outcomes":[]}`, 200, `"results":[]`)
	e.want("POST", "/api/v1/workers/w1/finish", `{"instance":"i9","outcomes":[],"claim":{"max":1}}`, 200,
		`"claim_error":{"code":"not_registered","error":"worker w1 instance i9: worker not registered","status":409},"jobs":[]`)
	big := strings.Repeat(`{"key":"x","attempt":1,"outcome":"released"},`, 257)
	e.want("POST", "/api/v1/workers/w1/finish", `{"instance":"i1","outcomes":[`+big[:len(big)-1]+`]}`, 400, `outcomes`)
}

// TestRemoteClaimHoldsConcurrency: remote workers claim by the same rules:
// a group limited to 2 hands out 2 jobs, renewals keep the slots, and a
// finish frees its slot for the next claim.
func TestRemoteClaimHoldsConcurrency(t *testing.T) {
	e := newEnv(t, web.Config{})
	if err := control.SetLimit(t.Context(), e.store, control.Limit{Target: control.Group("acme"), Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		e.post(fmt.Sprintf(`{"key":"g%d","kind":"k","group":"acme"}`, i))
	}
	e.register("w1", "i1", "k")
	jobs := e.claim("w1", "i1", 4, 0)
	if len(jobs) != 2 {
		t.Fatalf("claimed %d jobs of a group limited to 2", len(jobs))
	}
	for _, j := range jobs {
		if s := e.task(j.Key).Attempts[0].Slots; len(s) != 1 || !strings.HasPrefix(s[0], "group:acme#") {
			t.Fatalf("%s holds slots %v; want one of group:acme's", j.Key, s)
		}
		e.want("POST", renewPath("w1", j.Key), `{"instance":"i1","attempt":1}`, 200, `"lease_until"`)
	}
	if more := e.claim("w1", "i1", 4, 0); len(more) != 0 {
		t.Fatalf("claimed %+v beside 2 running of a group limited to 2", more)
	}
	e.want("POST", finishPath("w1", jobs[0].Key), `{"instance":"i1","attempt":1,"outcome":"succeeded"}`, 200, `"outcome":"succeeded"`)
	if more := e.claim("w1", "i1", 4, 5*time.Second); len(more) != 1 {
		t.Fatalf("after a finish claimed %d jobs, want 1 (its slot freed)", len(more))
	}
}

// TestRemoteWorkerRunsAFlowStep: a flow step's task claimed over the
// protocol is answered with the step's own payload and its flow_step (the
// flow, step, shared parameters and timeout), not the envelope; a failure
// that leaves retries does not move the flow on, and the success of the
// retry does at once (no reconciler runs here): the next step is claimed
// with the first's result in its parameters.
func TestRemoteWorkerRunsAFlowStep(t *testing.T) {
	e := newEnv(t, web.Config{})
	e.want("POST", "/api/v1/flows", `{"key":"f","params":{"order":7},"steps":[
		{"name":"a","kind":"step-a","payload":{"x":1},"timeout":"2s","retries":1},
		{"name":"b","kind":"step-b","needs":["a"]}]}`, 201, `"key":"f"`)
	e.register("w1", "i1", "step-a", "step-b")
	type stepJob struct {
		Key      string          `json:"key"`
		Attempt  int             `json:"attempt"`
		Payload  json.RawMessage `json:"payload"`
		FlowStep struct {
			Flow      string                     `json:"flow"`
			Step      string                     `json:"step"`
			Params    map[string]json.RawMessage `json:"params"`
			TimeoutMS int64                      `json:"timeout_ms"`
		} `json:"flow_step"`
	}
	claim := func() stepJob {
		t.Helper()
		out := e.want("POST", "/api/v1/workers/w1/claim", `{"instance":"i1","max":1,"wait_ms":5000}`, 200, `"jobs"`)
		var b struct{ Jobs []stepJob }
		if err := json.Unmarshal([]byte(out), &b); err != nil || len(b.Jobs) != 1 {
			t.Fatalf("claim answered %s, want one job", out)
		}
		return b.Jobs[0]
	}
	a := claim()
	if string(a.Payload) != `{"x":1}` || a.FlowStep.Flow != "f" || a.FlowStep.Step != "a" || a.FlowStep.TimeoutMS != 2000 ||
		string(a.FlowStep.Params["order"]) != `7` {
		t.Fatalf("step a's job %+v: want its own payload, flow f, step a, timeout 2000 ms and the flow's params", a)
	}
	path := finishPath("w1", strings.ReplaceAll(a.Key, "/", "%2F"))
	e.want("POST", path, `{"instance":"i1","attempt":1,"outcome":"failed","error":"not yet"}`, 200, `"outcome":"retried"`)
	if f := e.want("GET", "/api/v1/flows/f", "", 200, `"state":"running"`); strings.Contains(f, `"b/do"`) {
		t.Fatalf("flow after a retried failure: %s, want step b not published", f)
	}
	a = claim() // after the retry's backoff
	if a.Attempt != 2 || a.FlowStep.Step != "a" {
		t.Fatalf("second claim %+v, want step a's attempt 2", a)
	}
	e.want("POST", path, `{"instance":"i1","attempt":2,"outcome":"succeeded","result":{"y":2}}`, 200, `"outcome":"succeeded"`)
	b := claim()
	if b.FlowStep.Step != "b" || string(b.FlowStep.Params["a"]) != `{"y":2}` || b.FlowStep.TimeoutMS != 0 || string(b.Payload) != "null" {
		t.Fatalf("step b's job %+v: want step b with a's result in its parameters, no timeout, no payload", b)
	}
}
