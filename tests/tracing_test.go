package tests

import (
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/credential"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// span is one span as an OTLP receiver got it.
type span struct {
	service        string
	traceID        string
	id, parent     string
	name           string
	kind           tracepb.Span_SpanKind
	attrs          map[string]string
	events         []string
	status         tracepb.Status_StatusCode
	statusMessage  string
	start, end     time.Time
	eventAttrs     []map[string]string
	scope, version string
}

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes each export's
// protobuf (ExportTraceServiceRequest) as a collector does and keeps the
// spans.
type otlpReceiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	spans   []span
	exports int
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(r.export)}}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	return r
}

// endpoint is the value of OTEL_EXPORTER_OTLP_TRACES_ENDPOINT.
func (r *otlpReceiver) endpoint() string { return r.srv.URL + "/v1/traces" }

func (r *otlpReceiver) export(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST /v1/traces of application/x-protobuf", http.StatusBadRequest)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []span
	for _, rs := range msg.GetResourceSpans() {
		service := attrMap(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := span{
					service: service, scope: ss.GetScope().GetName(), version: ss.GetScope().GetVersion(),
					traceID: hex.EncodeToString(s.GetTraceId()), id: hex.EncodeToString(s.GetSpanId()),
					parent: hex.EncodeToString(s.GetParentSpanId()), name: s.GetName(), kind: s.GetKind(),
					attrs: attrMap(s.GetAttributes()), status: s.GetStatus().GetCode(), statusMessage: s.GetStatus().GetMessage(),
					start: time.Unix(0, int64(s.GetStartTimeUnixNano())), end: time.Unix(0, int64(s.GetEndTimeUnixNano())),
				}
				for _, e := range s.GetEvents() {
					sp.events = append(sp.events, e.GetName())
					sp.eventAttrs = append(sp.eventAttrs, attrMap(e.GetAttributes()))
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	r.exports++
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// attrMap renders attributes as strings, the way the assertions compare
// them.
func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(v.GetIntValue())
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(v.GetDoubleValue())
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(v.GetBoolValue())
		default:
			m[kv.GetKey()] = v.GetStringValue()
		}
	}
	return m
}

// trace returns the spans received of trace id.
func (r *otlpReceiver) trace(id string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.spans {
		if s.traceID == id {
			out = append(out, s)
		}
	}
	return out
}

// find returns the spans of trace that match.
func find(spans []span, match func(span) bool) []span {
	var out []span
	for _, s := range spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

func named(name string, attrs ...string) func(span) bool {
	return func(s span) bool {
		if s.name != name {
			return false
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if s.attrs[attrs[i]] != attrs[i+1] {
				return false
			}
		}
		return true
	}
}

// tracingEnv is what turns tracing on in a leasepool process: an exporter
// endpoint (the receiver), exported in batches every 50 ms so that the
// test waits for little.
func tracingEnv(r *otlpReceiver, service string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=" + r.endpoint(),
		"OTEL_SERVICE_NAME=" + service,
		"OTEL_BSP_SCHEDULE_DELAY=50",
	}
}

// TestTracingAcrossProcesses follows one task from a publish by the CLI
// (continuing a TRACEPARENT) through a worker process: its first attempt
// fails, its retry runs an exec program, which publishes a device command
// with the CLI (continuing the TRACEPARENT it was given); a worker sends
// the command to a simulated device over the embedded broker and records
// its ack and result. Every span reaches a real OTLP/HTTP receiver as one
// trace, each a child of the one before.
func TestTracingAcrossProcesses(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	bin := leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	recv := startOTLPReceiver(t)

	brk, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Credentials: credential.Source(store)})
	if err != nil {
		t.Fatalf("embedded broker did not start: %v", err)
	}
	t.Cleanup(func() { brk.Close() })
	prefix := "lp" + randomSuffix(t)
	sim := startSim(t, ctx, provisioned(t, ctx, store, device.Config{
		BrokerURL: brk.URL(), Prefix: prefix, IDPrefix: "pump-", Count: 1, Heartbeat: time.Minute}))

	dir := t.TempDir()
	seen := filepath.Join(dir, "traceparent")
	// Attempt 1 fails; attempt 2 writes its TRACEPARENT and publishes the
	// device command, traced as the worker would be (its env, given in
	// the payload: an exec program gets a minimal environment).
	script := fmt.Sprintf(`set -e
if [ "$LEASEPOOL_ATTEMPT" = 1 ]; then echo "first attempt fails" >&2; exit 3; fi
printf '%%s' "$TRACEPARENT" > %s
%s --store %s publish cmd-1 --kind device --retries 0 --payload '{"device":"pump-0","command":"reboot","ack_timeout":"2s","result_timeout":"5s"}'
`, shellQuote(seen), shellQuote(bin), shellQuote(storeURL))
	payloadEnv := map[string]string{}
	for _, kv := range tracingEnv(recv, "exec-program") {
		k, v, _ := strings.Cut(kv, "=")
		payloadEnv[k] = v
	}
	pb, err := json.Marshal(map[string]any{"argv": []string{"sh", "-c", script}, "env": payloadEnv})
	if err != nil {
		t.Fatal(err)
	}
	payload := string(pb)

	w := exec.Command(bin, "--store", storeURL, "--log-level", "info", "worker", "--id", "traced-w",
		"--kinds", "exec,device", "--mqtt", brk.URL(), "--prefix", prefix, "--shutdown-timeout", "2s")
	w.Env = append(append(os.Environ(), raceGuardEnv()...), tracingEnv(recv, "worker")...)
	startLogged(t, "worker", w)
	awaitOnline(t, ctx, store, 1)

	// The caller's own span: the trace every span below belongs to.
	const traceID = "5b8efff798038103d269b633813fc60c"
	root := "00-" + traceID + "-eee19b7ec3c1b174-01"
	pub := exec.Command(bin, "--store", storeURL, "publish", "job-1", "--kind", "exec", "--retries", "2", "--payload", payload)
	pub.Env = append(append(os.Environ(), tracingEnv(recv, "publisher")...), "TRACEPARENT="+root, "TRACESTATE=vendor=1")
	if out, err := pub.CombinedOutput(); err != nil {
		t.Fatalf("publish: %v\n%s", err, out)
	}

	var spans []span
	// Spans are exported as they end, by three processes: the exec
	// program's retry may end after the device command it published.
	eventually(t, time.Minute, "the five spans of the trace to be exported", func() bool {
		spans = recv.trace(traceID)
		for _, m := range []func(span) bool{
			named("publish exec"), named("publish device"), named("process device"),
			named("process exec", "leasepool.attempt", "1"), named("process exec", "leasepool.attempt", "2"),
		} {
			if len(find(spans, m)) == 0 {
				return false
			}
		}
		return true
	})
	byID := map[string]span{}
	for _, s := range spans {
		byID[s.id] = s
	}
	one := func(what string, match func(span) bool) span {
		t.Helper()
		got := find(spans, match)
		if len(got) != 1 {
			t.Fatalf("%s: %d spans; want 1; the trace has:\n%s", what, len(got), describe(spans))
		}
		return got[0]
	}
	childOf := func(child, parent span, what string) {
		t.Helper()
		if child.parent != parent.id {
			t.Errorf("%s: parent span %s; want %s (%s)", what, child.parent, parent.id, parent.name)
		}
	}

	publish := one("the CLI's publish of job-1", named("publish exec", "messaging.message.id", "job-1"))
	if publish.parent != "eee19b7ec3c1b174" || publish.kind != tracepb.Span_SPAN_KIND_PRODUCER || publish.service != "publisher" {
		t.Errorf("publish span: parent %s, kind %s, service %s; want the TRACEPARENT's span, producer, publisher", publish.parent, publish.kind, publish.service)
	}
	first := one("attempt 1 of job-1", named("process exec", "messaging.message.id", "job-1", "leasepool.attempt", "1"))
	retry := one("attempt 2 of job-1", named("process exec", "messaging.message.id", "job-1", "leasepool.attempt", "2"))
	childOf(first, publish, "attempt 1")
	childOf(retry, publish, "the retry")
	for _, c := range []struct {
		s               span
		outcome         string
		status          tracepb.Status_StatusCode
		messageContains string
	}{
		{first, "retried", tracepb.Status_STATUS_CODE_ERROR, "first attempt fails"},
		{retry, "succeeded", tracepb.Status_STATUS_CODE_UNSET, ""},
	} {
		a := c.s.attrs
		if c.s.kind != tracepb.Span_SPAN_KIND_CONSUMER || c.s.service != "worker" || a["leasepool.outcome"] != c.outcome || c.s.status != c.status ||
			!strings.Contains(c.s.statusMessage, c.messageContains) {
			t.Errorf("attempt %s: kind %s, service %s, outcome %q, status %s %q; want consumer, worker, %s, %s containing %q",
				a["leasepool.attempt"], c.s.kind, c.s.service, a["leasepool.outcome"], c.s.status, c.s.statusMessage, c.outcome, c.status, c.messageContains)
		}
		for k, v := range map[string]string{"messaging.system": "leasepool", "messaging.operation.name": "process", "messaging.operation.type": "process",
			"messaging.destination.name": "exec", "messaging.client.id": "traced-w"} {
			if a[k] != v {
				t.Errorf("attempt %s: %s = %q; want %q", a["leasepool.attempt"], k, a[k], v)
			}
		}
		if _, ok := a["leasepool.wait"]; !ok {
			t.Errorf("attempt %s has no leasepool.wait", a["leasepool.attempt"])
		}
	}
	if !retry.start.After(first.end) {
		t.Errorf("the retry started (%s) before the failed attempt ended (%s)", retry.start, first.end)
	}

	// The exec program's TRACEPARENT is its attempt's span.
	b, err := os.ReadFile(seen)
	if err != nil {
		t.Fatal(err)
	}
	if want := "00-" + traceID + "-" + retry.id + "-01"; string(b) != want {
		t.Errorf("the exec program's TRACEPARENT is %q; want its attempt's span %q", b, want)
	}

	// The program's publish continues the TRACEPARENT it was given; the
	// device command's attempt is a child of that publish.
	devPub := one("the program's publish of cmd-1", named("publish device", "messaging.message.id", "cmd-1"))
	childOf(devPub, retry, "the program's publish")
	if devPub.service != "exec-program" {
		t.Errorf("the program's publish came from service %q", devPub.service)
	}
	dev := one("the device command's attempt", named("process device", "messaging.message.id", "cmd-1"))
	childOf(dev, devPub, "the device command's attempt")
	if dev.attrs["leasepool.outcome"] != "succeeded" {
		t.Errorf("device attempt outcome %q", dev.attrs["leasepool.outcome"])
	}
	for _, ev := range []string{"device.command", "device.ack", "device.result"} {
		if !slices.Contains(dev.events, ev) {
			t.Errorf("the device attempt's events %v lack %s", dev.events, ev)
		}
	}
	if i := slices.Index(dev.events, "device.result"); i >= 0 && dev.eventAttrs[i]["leasepool.device.ok"] != "true" {
		t.Errorf("device.result event attributes %v", dev.eventAttrs[i])
	}
	// The device got the attempt's span as its command's traceparent.
	runs := sim.Report().Runs
	if len(runs) != 1 || runs[0].Traceparent != "00-"+traceID+"-"+dev.id+"-01" {
		t.Errorf("device runs %+v; want one carrying the attempt's span %s", runs, dev.id)
	}

	// Every span of the trace is one of these, and names a parent in it
	// (the publish's being the caller's).
	for _, s := range spans {
		if _, ok := byID[s.parent]; !ok && s.id != publish.id {
			t.Errorf("span %s (%s) has a parent %s outside the trace", s.name, s.id, s.parent)
		}
	}
	t.Logf("the trace:\n%s", describe(spans))
	stored, err := store.Get(ctx, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := (task.Trace{Traceparent: "00-" + traceID + "-" + publish.id + "-01", Tracestate: "vendor=1"}); stored.Trace != want {
		t.Errorf("job-1 stored trace %+v; want %+v", stored.Trace, want)
	}
}

// describe lists spans, for a failure message.
func describe(spans []span) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %s parent %s [%s] %v %v\n", s.id, s.name, s.parent, s.service, s.attrs, s.events)
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// TestTracingFlows publishes two flows with the CLI (tracing on, no
// TRACEPARENT: each flow's span starts its trace) and runs them on a
// worker process: each flow is one trace, whose steps' tasks, its sleep
// step's and signal step's timers and its signal are children of the
// flow's span, and whose steps' attempts are children of their publishes.
func TestTracingFlows(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	bin := leasepoolBin(t)
	store, storeURL := openTestStore(t, ctx)
	recv := startOTLPReceiver(t)
	cli := func(args ...string) {
		t.Helper()
		c := exec.CommandContext(ctx, bin, append([]string{"--store", storeURL}, args...)...)
		c.Env = append(os.Environ(), tracingEnv(recv, "cli")...)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("leasepool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	spec := filepath.Join(t.TempDir(), "flow.json")
	if err := os.WriteFile(spec, []byte(`{"steps": [
		{"name": "prep", "kind": "noop"},
		{"name": "nap", "sleep": "100ms"},
		{"name": "approval", "type": "signal", "timeout": "1m"},
		{"name": "done", "kind": "noop"}
	]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	w := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "worker", "--id", "flow-w", "--kinds", "noop")
	w.Env = append(os.Environ(), tracingEnv(recv, "worker")...)
	startLogged(t, "worker", w)
	flows := []string{"f1", "f2"}
	for _, key := range flows {
		cli("flow", "publish", key, "--file", spec)
	}
	for _, key := range flows {
		eventually(t, time.Minute, key+"'s approval to wait for its signal", func() bool {
			f, err := flow.Get(ctx, store, key)
			return err == nil && f.Progress[2].State == flow.StepRunning
		})
		cli("flow", "signal", key, "approval")
	}
	for _, key := range flows {
		if f, err := waitFlow(ctx, store, key); err != nil || f.State != flow.StateSucceeded {
			t.Fatalf("flow %s: %v", key, err)
		}
	}

	traces := map[string]string{} // flow key: trace id
	for _, key := range flows {
		var flowSpan span
		eventually(t, time.Minute, key+"'s spans to be exported", func() bool {
			recv.mu.Lock()
			all := slices.Clone(recv.spans)
			recv.mu.Unlock()
			fs := find(all, named("publish flow", "leasepool.flow.key", key))
			if len(fs) != 1 {
				return false
			}
			flowSpan = fs[0]
			// The last step's attempt ends the flow.
			return len(find(recv.trace(flowSpan.traceID), named("process noop", "messaging.message.id", key+"/4/done/do"))) == 1
		})
		stored, err := flow.Get(ctx, store, key)
		if err != nil {
			t.Fatal(err)
		}
		if want := "00-" + flowSpan.traceID + "-" + flowSpan.id + "-01"; stored.Trace.Traceparent != want {
			t.Errorf("flow %s stored trace %+v; want %s", key, stored.Trace, want)
		}
		if flowSpan.parent != "" {
			t.Errorf("flow %s's span has a parent %s: no TRACEPARENT was given", key, flowSpan.parent)
		}
		traces[key] = flowSpan.traceID
		spans := recv.trace(flowSpan.traceID)
		for _, step := range []struct{ key, kind string }{
			{key + "/1/prep/do", "noop"},
			{key + "/2/nap/do", flow.TimerKind},
			{key + "/3/approval/do", flow.TimerKind},
			{key + "/4/done/do", "noop"},
		} {
			pubs := find(spans, named("publish "+step.kind, "messaging.message.id", step.key, "leasepool.publish.result", "inserted"))
			if len(pubs) != 1 {
				t.Errorf("flow %s: %d inserting publishes of %s; want 1:\n%s", key, len(pubs), step.key, describe(spans))
				continue
			}
			if pubs[0].parent != flowSpan.id {
				t.Errorf("flow %s: the publish of %s is a child of %s, not of the flow's span %s", key, step.key, pubs[0].parent, flowSpan.id)
			}
			if step.key == key+"/3/approval/do" {
				continue // the signal's timeout timer, stopped by the signal
			}
			runs := find(spans, named("process "+step.kind, "messaging.message.id", step.key))
			if len(runs) == 0 {
				t.Errorf("flow %s: no attempt span of %s in its trace", key, step.key)
			}
			for _, r := range runs {
				if r.parent != pubs[0].id || r.attrs["leasepool.outcome"] != "succeeded" {
					t.Errorf("flow %s: attempt of %s: parent %s, outcome %s; want %s, succeeded", key, step.key, r.parent, r.attrs["leasepool.outcome"], pubs[0].id)
				}
			}
		}
		sig := find(spans, named("flow signal", "leasepool.flow.key", key, "leasepool.flow.step", "approval"))
		if len(sig) != 1 || sig[0].parent != flowSpan.id {
			t.Errorf("flow %s: signal spans %+v; want one, a child of the flow's span", key, sig)
		}
		for _, s := range spans {
			if k := s.attrs["messaging.message.id"] + s.attrs["leasepool.flow.key"]; !strings.HasPrefix(k, key) {
				t.Errorf("flow %s's trace holds a span of %q (%s)", key, k, s.name)
			}
		}
	}
	if traces["f1"] == traces["f2"] {
		t.Errorf("two flows share one trace %s", traces["f1"])
	}
}

// TestTracingFromClients continues traces that the client packages began:
// a task published by the Python client (and one by the TypeScript
// client) with a W3C traceparent, through `serve` with tracing off, is
// run by a Go worker whose attempt span is a child of that traceparent's
// span, in its trace.
func TestTracingFromClients(t *testing.T) {
	needClients(t)
	ctx := testContext(t, 2*time.Minute)
	bin := leasepoolBin(t)
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	recv := startOTLPReceiver(t)
	srv := startServeProc(t, storeURL)
	url := "http://" + srv.addr

	roots := map[string]string{ // language: traceparent of the caller's span
		"py": "00-" + "1af0c0d3a3b24c44b8f7c1b2d3e4f501" + "-1111111111111111-01",
		"ts": "00-" + "2bf0c0d3a3b24c44b8f7c1b2d3e4f502" + "-2222222222222222-01",
	}
	py := exec.CommandContext(ctx, "python3", "-c", `
import sys
sys.path.insert(0, sys.argv[1])
from leasepool import Client
Client(sys.argv[2]).publish("from-py", "noop", traceparent=sys.argv[3])
`, filepath.Join(clientDir("python"), "src"), url, roots["py"])
	ts := exec.CommandContext(ctx, "node", "-e", `
const { Client } = require(process.argv[1]);
new Client({ url: process.argv[2] }).publish({ key: "from-ts", kind: "noop" }, { traceparent: process.argv[3] })
  .catch((e) => { console.error(e); process.exit(1); });
`, clientDir("typescript"), url, roots["ts"])
	for _, cmd := range []*exec.Cmd{py, ts} {
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s publish: %v\n%s", cmd.Path, err, out)
		}
	}

	w := exec.Command(bin, "--store", storeURL, "--log-level", "warn", "worker", "--id", "traced-go", "--kinds", "noop")
	w.Env = append(append(os.Environ(), raceGuardEnv()...), tracingEnv(recv, "worker")...)
	startLogged(t, "worker", w)
	for lang, root := range roots {
		traceID, parent := root[3:35], root[36:52]
		eventually(t, time.Minute, lang+"'s task to be run in its publisher's trace", func() bool {
			return len(find(recv.trace(traceID), named("process noop"))) > 0
		})
		for _, s := range find(recv.trace(traceID), named("process noop")) {
			if s.parent != parent || s.service != "worker" {
				t.Errorf("%s: attempt span %s of %s has parent %s, want the publisher's span %s", lang, s.name, s.service, s.parent, parent)
			}
		}
	}
}

// TestTracingRemoteAttempts: a remote worker's attempts, which the client
// packages run without a tracer, are spans of the task's trace recorded by
// `serve` (tracing on) as it writes each outcome. A task published over
// HTTP in a caller's trace runs on a Python and a TypeScript worker: the
// first attempt fails, the retry succeeds; each attempt is a consumer span
// of the server's publish span, from the attempt's start to its outcome,
// with its worker, attempt number and outcome, the failure marked as an
// error with its message.
func TestTracingRemoteAttempts(t *testing.T) {
	needClients(t)
	ctx := testContext(t, 2*time.Minute)
	storeURL := "sqlite:" + filepath.Join(t.TempDir(), "s.db")
	recv := startOTLPReceiver(t)
	srv := startServeProcEnv(t, storeURL, tracingEnv(recv, "serve"))
	url := "http://" + srv.addr

	roots := map[string]string{ // language: traceparent of the publishing caller's span
		"py": "00-" + "3cf0c0d3a3b24c44b8f7c1b2d3e4f503" + "-3333333333333333-01",
		"ts": "00-" + "4df0c0d3a3b24c44b8f7c1b2d3e4f504" + "-4444444444444444-01",
	}
	for lang, root := range roots {
		req, err := http.NewRequestWithContext(ctx, "POST", url+"/api/v1/tasks",
			strings.NewReader(fmt.Sprintf(`{"key":"remote-%s","kind":"rk-%s"}`, lang, lang)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", root)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
			t.Fatalf("publish remote-%s: %s", lang, resp.Status)
		}
	}

	workers := map[string]*exec.Cmd{
		"py": exec.CommandContext(ctx, "python3", "-c", `
import sys
sys.path.insert(0, sys.argv[1])
from leasepool import Worker
def handle(job):
    if job.attempt == 1:
        raise RuntimeError("first try fails")
    return {"ok": True}
Worker(sys.argv[2], "py-traced", {"rk-py": handle}, concurrency=1).run()
`, filepath.Join(clientDir("python"), "src"), url),
		"ts": exec.CommandContext(ctx, "node", "-e", `
const { Worker } = require(process.argv[1]);
const w = new Worker({ url: process.argv[2], id: "ts-traced", concurrency: 1, handlers: {
  "rk-ts": async (job) => { if (job.attempt === 1) throw new Error("first try fails"); return { ok: true }; },
} });
w.start({ signals: true }).catch((e) => { console.error(e); process.exit(1); });
`, clientDir("typescript"), url),
	}
	for lang, cmd := range workers {
		startLogged(t, lang+" worker", cmd)
	}

	for lang, root := range roots {
		traceID, caller := root[3:35], root[36:52]
		kind := "rk-" + lang
		var attempts []span
		eventually(t, time.Minute, lang+"'s two attempts as spans of serve", func() bool {
			attempts = find(recv.trace(traceID), named("process "+kind))
			return len(attempts) == 2
		})
		pubs := find(recv.trace(traceID), named("publish "+kind))
		if len(pubs) != 1 || pubs[0].parent != caller || pubs[0].service != "serve" {
			t.Fatalf("%s: publish spans %s, want one of serve, child of the caller's span %s", lang, describe(pubs), caller)
		}
		slices.SortFunc(attempts, func(a, b span) int {
			return strings.Compare(a.attrs["leasepool.attempt"], b.attrs["leasepool.attempt"])
		})
		want := []struct {
			attempt, outcome string
			status           tracepb.Status_StatusCode
			message          string
		}{
			{"1", "retried", tracepb.Status_STATUS_CODE_ERROR, "first try fails"},
			{"2", "succeeded", tracepb.Status_STATUS_CODE_UNSET, ""},
		}
		for i, w := range want {
			s, a := attempts[i], attempts[i].attrs
			if s.service != "serve" || s.kind != tracepb.Span_SPAN_KIND_CONSUMER || s.parent != pubs[0].id ||
				a["leasepool.attempt"] != w.attempt || a["leasepool.outcome"] != w.outcome || a["messaging.client.id"] != lang+"-traced" ||
				a["messaging.message.id"] != "remote-"+lang || s.status != w.status || !strings.Contains(s.statusMessage, w.message) {
				t.Errorf("%s attempt %s: span %+v, want a consumer span of serve, child of publish %s, worker %s-traced, outcome %s, status %v %q",
					lang, w.attempt, s, pubs[0].id, lang, w.outcome, w.status, w.message)
			}
			if !s.start.Before(s.end) || s.start.Before(pubs[0].start) {
				t.Errorf("%s attempt %s: span from %s to %s, publish at %s: want it to start after the publish and end after it starts",
					lang, w.attempt, s.start.Format(time.RFC3339Nano), s.end.Format(time.RFC3339Nano), pubs[0].start.Format(time.RFC3339Nano))
			}
		}
		if attempts[1].start.Before(attempts[0].end) {
			t.Errorf("%s: the retry's span starts at %s, before the first attempt's ends at %s", lang, attempts[1].start, attempts[0].end)
		}
	}
}
