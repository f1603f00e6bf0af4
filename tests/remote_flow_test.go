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
func TestRemoteWorkersRunFlowSteps(t *testing.T) {
	needClients(t)
	ctx := testContext(t, 2*time.Minute)
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	url := "http://" + startServeProc(t, storeURL).addr

	resp, err := http.Post(url+"/api/v1/flows", "application/json", strings.NewReader(`{"key":"rf","steps":[
		{"name":"a","kind":"fa-py","payload":{"x":5}},
		{"name":"b","kind":"fb-ts","needs":["a"],"payload":{"factor":3}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("publish flow: %s %s", resp.Status, body)
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
Worker(sys.argv[2], "py-flow", {"fa-py": handle}, concurrency=1).run()
`, filepath.Join(clientDir("python"), "src"), url))
	startLogged(t, "ts worker", exec.CommandContext(ctx, "node", "-e", `
const { Worker } = require(process.argv[1]);
const w = new Worker({ url: process.argv[2], id: "ts-flow", concurrency: 1, handlers: {
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

	var flow struct {
		State  string                     `json:"state"`
		Params map[string]json.RawMessage `json:"params"`
	}
	var raw []byte
	eventually(t, time.Minute, "flow rf to end", func() bool {
		resp, err := http.Get(url + "/api/v1/flows/rf")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		raw, _ = io.ReadAll(resp.Body)
		return json.Unmarshal(raw, &flow) == nil && flow.State != "" && flow.State != "running"
	})
	if flow.State != "succeeded" || string(flow.Params["a"]) != `{"n":6}` || string(flow.Params["b"]) != `{"m":18}` {
		t.Fatalf("flow rf: %s, want succeeded with a's result {\"n\":6} and b's {\"m\":18}", raw)
	}
}
