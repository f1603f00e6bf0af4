package tests

import (
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRemoteWorkersRunFlowSteps: a flow whose steps only remote workers
// run, through `serve` with no Go worker anywhere (so no flow middleware
// and no reconciler): the Python worker's step gets its own payload and
// the flow's step, the TypeScript worker's next step reads the first
// one's result from the flow's shared parameters, and the flow succeeds
// with both results recorded, moved on by serve as each finish lands.
// Two more flows have a step with a 300 ms timeout, one per language,
// whose handler waits to be stopped: each worker stops it when the time
// passes, and the flow fails naming the step's timeout.
func TestRemoteWorkersRunFlowSteps(t *testing.T) {
	needClients(t)
	ctx := testContext(t, 2*time.Minute)
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	url := "http://" + startServeProc(t, storeURL).addr

	for _, f := range []string{
		`{"key":"rf","steps":[{"name":"a","kind":"fa-py","payload":{"x":5}},
			{"name":"b","kind":"fb-ts","needs":["a"],"payload":{"factor":3}}]}`,
		`{"key":"rt-py","steps":[{"name":"slow","kind":"ft-py","timeout":"300ms","retries":0}]}`,
		`{"key":"rt-ts","steps":[{"name":"slow","kind":"ft-ts","timeout":"300ms","retries":0}]}`,
	} {
		resp, err := http.Post(url+"/api/v1/flows", "application/json", strings.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("publish flow %s: %s %s", f, resp.Status, body)
		}
	}

	// Each handler returns what it saw; a handler that sees anything but
	// its step's own payload and step fails the attempt, and the flow.
	startLogged(t, "py worker", exec.CommandContext(ctx, "python3", "-c", `
import sys
sys.path.insert(0, sys.argv[1])
from leasepool import Worker
def handle(job):
    st = job.flow_step or {}
    if job.payload != {"x": 5} or st.get("flow") != "rf" or st.get("step") != "a":
        raise RuntimeError("saw payload %r step %r" % (job.payload, st))
    return {"n": job.payload["x"] + 1}
def slow(job):
    job.cancelled.wait(20)
    raise RuntimeError("stopped: %s" % job.cancel_reason)
Worker(sys.argv[2], "py-flow", {"fa-py": handle, "ft-py": slow}, concurrency=2).run()
`, filepath.Join(clientDir("python"), "src"), url))
	startLogged(t, "ts worker", exec.CommandContext(ctx, "node", "-e", `
const { Worker } = require(process.argv[1]);
const w = new Worker({ url: process.argv[2], id: "ts-flow", concurrency: 2, handlers: {
  "ft-ts": (job) => new Promise((_, reject) =>
    job.signal.addEventListener("abort", () => reject(new Error("stopped: " + job.signal.reason)))),
  "fb-ts": async (job) => {
    const st = job.flowStep || {};
    const a = (st.params || {}).a;
    if (job.payload.factor !== 3 || st.flow !== "rf" || st.step !== "b" || !a || a.n !== 6)
      throw new Error("saw payload " + JSON.stringify(job.payload) + " step " + JSON.stringify(st));
    return { m: a.n * job.payload.factor };
  },
} });
w.start({ signals: true }).catch((e) => { console.error(e); process.exit(1); });
`, clientDir("typescript"), url))

	type flowDoc struct {
		State  string                     `json:"state"`
		Error  string                     `json:"error"`
		Params map[string]json.RawMessage `json:"params"`
	}
	ended := func(key string) (flowDoc, []byte) {
		t.Helper()
		var f flowDoc
		var raw []byte
		eventually(t, time.Minute, "flow "+key+" to end", func() bool {
			resp, err := http.Get(url + "/api/v1/flows/" + key)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			raw, _ = io.ReadAll(resp.Body)
			return json.Unmarshal(raw, &f) == nil && f.State != "" && f.State != "running"
		})
		return f, raw
	}
	if f, raw := ended("rf"); f.State != "succeeded" || string(f.Params["a"]) != `{"n":6}` || string(f.Params["b"]) != `{"m":18}` {
		t.Errorf("flow rf: %s, want succeeded with a's result {\"n\":6} and b's {\"m\":18}", raw)
	}
	for _, key := range []string{"rt-py", "rt-ts"} {
		if f, raw := ended(key); f.State != "failed" || !strings.Contains(f.Error, "step timeout 300 ms: stopped: step_timeout") {
			t.Errorf("flow %s: %s, want failed by the step's timeout", key, raw)
		}
	}
}
