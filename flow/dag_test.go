package flow

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// TestDAGRefusedAtPublish: what a DAG may not be, refused by ParseSpec or
// Validate with the field named.
func TestDAGRefusedAtPublish(t *testing.T) {
	t.Parallel()
	k := `"kind":"k"`
	many := func(n int, needs func(i int) string) string {
		var b strings.Builder
		b.WriteString(`{"key":"f","steps":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"s%d",%s%s}`, i, k, needs(i))
		}
		b.WriteString(`]}`)
		return b.String()
	}
	for _, tt := range []struct{ file, want string }{
		{`{"key":"f","steps":[{"name":"a",` + k + `,"needs":["b"]},{"name":"b",` + k + `,"needs":["a"]}]}`,
			"invalid: steps[0].needs: a cycle: a needs b needs a"},
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `,"needs":["c"]},{"name":"c",` + k + `,"needs":["d"]},{"name":"d",` + k + `,"needs":["b","a"]}]}`,
			"invalid: steps[1].needs: a cycle: b needs c needs d needs b"},
		{`{"key":"f","steps":[{"name":"a",` + k + `,"needs":["nope"]}]}`, `invalid: steps[0].needs: "nope" names no step`},
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `,"needs":["b"]}]}`, `invalid: steps[1].needs: "b" needs itself`},
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `,"needs":["a","a"]}]}`, `invalid: steps[1].needs: "a" named twice`},
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"a",` + k + `}]}`, `invalid: steps[1].name: "a" names two steps`},
		{`{"key":"f","steps":[{"name":"a",` + k + `,"needs":"a"}]}`, "invalid: steps.needs: want a JSON []string, got string"},
		{many(MaxSteps+1, func(int) string { return "" }), "invalid: steps: more than 10000"},
		{many(MaxSteps+1, func(i int) string { return fmt.Sprintf(`,"needs":["s%d"]`, (i+1)%10000) }), "invalid: steps: more than 10000"},
		{many(MaxSteps, func(i int) string { return fmt.Sprintf(`,"needs":["s%d"]`, (i+1)%MaxSteps) }),
			"invalid: steps[0].needs: a cycle: s0 needs s1 needs s2 needs s3 needs s4 needs (9991 more) needs s9996 needs s9997 needs s9998 needs s9999 needs s0"},
		{`{"key":"f","steps":[{"name":"a","type":"webhook",` + k + `}]}`, `invalid: steps[0].type: unknown type "webhook" (want task, signal or sleep)`},
		{`{"key":"f","steps":[{"name":"a","sleep":"-1s"}]}`, "invalid: steps[0].sleep: must be positive"},
		{`{"key":"f","steps":[{"name":"a","sleep":"100000h"}]}`, "invalid: steps[0].sleep: longer than 87840h0m0s"},
		{`{"key":"f","steps":[{"name":"a","sleep":"soon"}]}`, `invalid: steps[0].sleep: flow JSON: time: invalid duration "soon"`},
		{`{"key":"f","steps":[{"name":"a","until":"1999-12-31T23:59:59Z"}]}`, "invalid: steps[0].until: must lie between 2000 and 2200"},
		{`{"key":"f","steps":[{"name":"a","until":"2200-01-01T00:00:01Z"}]}`, "invalid: steps[0].until: must lie between 2000 and 2200"},
		{`{"key":"f","steps":[{"name":"a","until":"tomorrow"}]}`, `invalid: steps[0].until: flow JSON: parsing time "tomorrow" as "2006-01-02T15:04:05Z07:00": cannot parse "tomorrow" as "2006"`},
		{`{"key":"f","steps":[{"name":"a","sleep":"1m","until":"2100-01-01T00:00:00Z"}]}`, "invalid: steps[0].sleep: give sleep or until, not both"},
		{`{"key":"f","steps":[{"name":"a","type":"sleep"}]}`, `invalid: steps[0].sleep: a sleep step needs sleep (a duration, "10m") or until (an RFC 3339 time)`},
		{`{"key":"f","steps":[{"name":"a","sleep":"1m",` + k + `}]}`, "invalid: steps[0].kind: a sleep step runs no task"},
		{`{"key":"f","steps":[{"name":"a","type":"task","sleep":"1m",` + k + `}]}`, "invalid: steps[0].sleep: only a sleep step sleeps"},
		{`{"key":"f","steps":[{"name":"a","sleep":"1m","rollback":{` + k + `}}]}`, "invalid: steps[0].rollback: a sleep step has nothing to undo"},
		{`{"key":"f","steps":[{"name":"a","sleep":"1m","timeout":"1s"}]}`, "invalid: steps[0].timeout: a sleep step has no timeout: it ends at its time"},
		{`{"key":"f","steps":[{"name":"a","type":"signal",` + k + `}]}`, "invalid: steps[0].kind: a signal step runs no task"},
		{`{"key":"f","steps":[{"name":"a","type":"signal","retries":1}]}`, "invalid: steps[0].retries: a signal step runs no task"},
		{`{"key":"f","steps":[{"name":"a","type":"signal","default":{"ok":true}}]}`, "invalid: steps[0].default: is taken when the timeout passes: give a timeout"},
		{`{"key":"f","steps":[{"name":"a","type":"signal","timeout":"1s","default":` + deepJSON(65) + `}]}`, "invalid: steps[0].default: nested deeper than 64 levels"},
		{`{"key":"f","steps":[{"name":"a","type":"signal","timeout":"-1s"}]}`, "invalid: steps[0].timeout: must not be negative"},
		{`{"key":"f","steps":[{"name":"a",` + k + `,"default":1}]}`, "invalid: steps[0].default: only a signal step takes a default"},
		{`{"key":"f","steps":[{"name":".",` + k + `}]}`, `invalid: steps[0].name: "." makes the step's task key "f/1/./do", which cannot be named in a URL path`},
		{`{"key":"f/","steps":[{"name":"a",` + k + `}]}`, `invalid: steps[0].name: "a" makes the step's task key "f//1/a/do", which cannot be named in a URL path`},
	} {
		spec, err := ParseSpec(strings.NewReader(tt.file))
		if err == nil {
			err = spec.Validate()
		}
		if !errors.Is(err, task.ErrInvalid) || err.Error() != tt.want {
			t.Errorf("%.90s: %v; want %q", tt.file, err, tt.want)
		}
	}
	// At the bounds: 100 steps each needing the one before (a chain as deep
	// as the limit), and one step needing all 99 others.
	for _, file := range []string{
		many(MaxSteps, func(i int) string {
			if i == 0 {
				return ""
			}
			return fmt.Sprintf(`,"needs":["s%d"]`, i-1)
		}),
		many(MaxSteps, func(i int) string {
			if i < MaxSteps-1 {
				return ""
			}
			names := make([]string, MaxSteps-1)
			for j := range names {
				names[j] = fmt.Sprintf("%q", fmt.Sprintf("s%d", j))
			}
			return `,"needs":[` + strings.Join(names, ",") + `]`
		}),
		`{"key":"f","steps":[{"name":"a","until":"2000-01-01T00:00:00Z"},{"name":"b","type":"signal","timeout":"24h","default":{"approved":false}}]}`,
	} {
		spec, err := ParseSpec(strings.NewReader(file))
		if err == nil {
			err = spec.Validate()
		}
		if err != nil {
			t.Errorf("%.90s: %v; want it valid", file, err)
		}
	}
}

// dag builds a flow in memory from steps "name<-need,need" of kind k, a
// rollback on each.
func dag(t *testing.T, steps ...string) *Flow {
	t.Helper()
	spec := Spec{Key: "f"}
	for _, s := range steps {
		name, needs, _ := strings.Cut(s, "<-")
		st := Step{Name: name, Action: Action{Kind: "k"}, Rollback: &Action{Kind: "k"}}
		if needs != "" {
			st.Needs = strings.Split(needs, ",")
		}
		spec.Steps = append(spec.Steps, st)
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	return &Flow{Key: "f", Steps: spec.Steps, Params: map[string]json.RawMessage{}, State: StatePending,
		Gen: 1, Progress: make([]Progress, len(spec.Steps))}
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// active lists the runs active as "name" or "name/undo".
func active(f *Flow) []string {
	var out []string
	for i, p := range f.Progress {
		if p.Do.State == RunActive {
			out = append(out, f.Steps[i].Name)
		}
		if p.Undo.State == RunActive {
			out = append(out, f.Steps[i].Name+"/undo")
		}
	}
	return out
}

func wantActive(t *testing.T, f *Flow, want ...string) {
	t.Helper()
	if got := active(f); !slices.Equal(got, want) {
		t.Fatalf("active runs %v, want %v (flow %s)", got, want, f.State)
	}
}

func index(f *Flow, name string) int {
	return slices.IndexFunc(f.Steps, func(s Step) bool { return s.Name == name })
}

func done(t *testing.T, f *Flow, name string, undo, ok bool) {
	t.Helper()
	o := outcome{Gen: f.Gen, Step: index(f, name), Undo: undo, Success: ok, Final: true, At: t0, Attempt: 1,
		Result: json.RawMessage(`"` + name + `"`)}
	if !ok {
		o.Error = name + " broke"
	}
	if !f.apply(o) {
		t.Fatalf("outcome of %s (undo %v) not applied", name, undo)
	}
	if f.apply(o) {
		t.Fatalf("outcome of %s (undo %v) applied twice", name, undo)
	}
	f.summarise()
}

// TestDAGRunsAndRollsBack: a diamond a -> b, c, d -> e. Steps ready
// together start together; a failure starts no new step, lets the running
// ones finish, and rolls back each step after every step that needs it.
func TestDAGRunsAndRollsBack(t *testing.T) {
	f := dag(t, "a", "b<-a", "c<-a", "d<-a", "e<-b,c,d")
	f.start(t0)
	wantActive(t, f, "a")
	done(t, f, "a", false, true)
	wantActive(t, f, "b", "c", "d")
	done(t, f, "b", false, true)
	wantActive(t, f, "c", "d") // e needs c and d too
	if f.Progress[4].State != StepWaiting {
		t.Fatalf("e is %s, want waiting", f.Progress[4].State)
	}
	done(t, f, "d", false, false)
	if f.State != StateRollingBack || !strings.Contains(f.Error, "step 4 (d) failed: d broke") {
		t.Fatalf("flow %s %q, want rolling_back for d", f.State, f.Error)
	}
	// c runs on; b and d, which nothing started needs, roll back now; a
	// waits for all three.
	wantActive(t, f, "b/undo", "c", "d/undo")
	done(t, f, "c", false, true)
	wantActive(t, f, "b/undo", "c/undo", "d/undo")
	if f.Params["c"] == nil || f.Progress[2].Order != 4 || f.Progress[3].Order != 3 {
		t.Fatalf("c's result %s, orders %d %d: want c's work ended fourth, d's third", f.Params["c"], f.Progress[2].Order, f.Progress[3].Order)
	}
	done(t, f, "b", true, true)
	done(t, f, "d", true, true)
	wantActive(t, f, "c/undo")
	done(t, f, "c", true, true)
	wantActive(t, f, "a/undo")
	done(t, f, "a", true, true)
	wantActive(t, f)
	if f.State != StateFailed {
		t.Fatalf("flow %s, want failed", f.State)
	}
	var states []string
	for _, p := range f.Progress {
		states = append(states, string(p.State))
	}
	if want := "rolled_back rolled_back rolled_back rolled_back skipped"; strings.Join(states, " ") != want {
		t.Fatalf("step states %v, want %s", states, want)
	}
}

// TestDAGSucceeds: fan-out and fan-in; the last step ends the flow, and
// each step's work sees the results of what it needs and nothing else.
func TestDAGSucceeds(t *testing.T) {
	f := dag(t, "a", "b<-a", "c", "d<-b,c")
	f.Params["req"] = json.RawMessage(`1`)
	f.start(t0)
	wantActive(t, f, "a", "c")
	done(t, f, "c", false, true)
	done(t, f, "a", false, true)
	wantActive(t, f, "b")
	if p := f.paramsFor(index(f, "b"), false); p["a"] == nil || p["c"] != nil || p["req"] == nil {
		t.Fatalf("b sees %v: want req and a, not c", p)
	}
	done(t, f, "b", false, true)
	if p := f.paramsFor(index(f, "d"), false); len(p) != 4 {
		t.Fatalf("d sees %v: want req, a, b and c", p)
	}
	done(t, f, "d", false, true)
	if f.State != StateSucceeded || f.Error != "" {
		t.Fatalf("flow %s %q, want succeeded", f.State, f.Error)
	}
}

// TestLinearFlowKeepsItsOrder: with no needs named, each step needs the
// one before and rolls back strictly in reverse.
func TestLinearFlowKeepsItsOrder(t *testing.T) {
	f := dag(t, "a", "b", "c")
	f.start(t0)
	wantActive(t, f, "a")
	done(t, f, "a", false, true)
	wantActive(t, f, "b")
	done(t, f, "b", false, true)
	done(t, f, "c", false, false)
	wantActive(t, f, "c/undo")
	done(t, f, "c", true, true)
	wantActive(t, f, "b/undo")
	done(t, f, "b", true, true)
	wantActive(t, f, "a/undo")
}

// TestRollbackFailureStopsRollbacks: a failed rollback starts no other;
// the flow is rollback_failed once the running ones end.
func TestRollbackFailureStopsRollbacks(t *testing.T) {
	f := dag(t, "a", "b<-a", "c<-a")
	f.start(t0)
	done(t, f, "a", false, true)
	done(t, f, "b", false, true)
	done(t, f, "c", false, false)
	wantActive(t, f, "b/undo", "c/undo")
	done(t, f, "c", true, false)
	if f.State != StateRollingBack {
		t.Fatalf("flow %s with b's rollback running, want rolling_back", f.State)
	}
	done(t, f, "b", true, true)
	wantActive(t, f) // not a's
	if f.State != StateRollbackFailed || !strings.Contains(f.Error, "rollback of step 3 (c) failed") {
		t.Fatalf("flow %s %q, want rollback_failed for c", f.State, f.Error)
	}
	// Retry runs every step that does not stand: a stands.
	if err := f.retry(t0); err != nil {
		t.Fatal(err)
	}
	wantActive(t, f, "b", "c")
	if f.Gen != 2 || f.Progress[1].Do.Task != "f/2/b/do#2" {
		t.Fatalf("gen %d, b's task %s", f.Gen, f.Progress[1].Do.Task)
	}
}

// TestNonFinalFailureWaits: a failure with retries left changes nothing
// but the count.
func TestNonFinalFailureWaits(t *testing.T) {
	f := dag(t, "a", "b<-a")
	f.start(t0)
	if !f.apply(outcome{Gen: 1, Step: 0, Error: "once", Attempt: 1, At: t0}) {
		t.Fatal("not applied")
	}
	wantActive(t, f, "a")
	if r := f.Progress[0].Do; r.Failures != 1 || r.Attempts != 1 || r.Error != "once" {
		t.Fatalf("run %+v", r)
	}
	if f.apply(outcome{Gen: 2, Step: 0, Success: true, At: t0}) || f.apply(outcome{Gen: 1, Step: 1, Success: true, At: t0}) {
		t.Fatal("an outcome of another generation, or of a step not started, was applied")
	}
}

// TestCancelDAG: every running step is stopped; with rollback each is
// undone after what needs it.
func TestCancelDAG(t *testing.T) {
	f := dag(t, "a", "b<-a", "c<-a")
	f.start(t0)
	done(t, f, "a", false, true)
	if err := f.cancel(true, t0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.stops, []string{"f/2/b/do", "f/3/c/do"}) {
		t.Fatalf("stops %v", f.stops)
	}
	wantActive(t, f, "b/undo", "c/undo")
	if err := f.cancel(true, t0); err != nil {
		t.Fatalf("a second cancel with rollback: %v", err)
	}
	if err := f.cancel(false, t0); err != nil || f.State != StateCancelled {
		t.Fatalf("cancel without rollback while rolling back: %v, %s", err, f.State)
	}
	if err := f.cancel(false, t0); !errors.Is(err, ErrFinished) {
		t.Fatalf("cancel of a cancelled flow: %v", err)
	}
}

func signalFlow(t *testing.T, timeout time.Duration, def string) *Flow {
	t.Helper()
	f := dag(t, "a", "b<-a")
	st := Step{Name: "approval", Type: TypeSignal, Needs: []string{"a"}, Action: Action{Timeout: task.Duration(timeout)}}
	if def != "" {
		st.Default = json.RawMessage(def)
	}
	f.Steps = append(f.Steps, st)
	f.Steps[1].Needs = []string{"approval"}
	f.Progress = append(f.Progress, Progress{})
	if err := (Spec{Key: f.Key, Steps: f.Steps}).Validate(); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestSignalTransitions: a signal sent before its step is ready is kept
// and taken when the step starts; a second is refused, as is one to a
// step that is not a signal step, to no step, or to a finished flow.
func TestSignalTransitions(t *testing.T) {
	f := signalFlow(t, 0, "")
	f.start(t0)
	if err := f.signal("approval", json.RawMessage(`{"by":"ann"}`), t0); err != nil {
		t.Fatal(err)
	}
	wantActive(t, f, "a")
	for _, tt := range []struct {
		step string
		want error
	}{{"approval", ErrAlreadySignalled}, {"a", ErrNotSignalStep}, {"zz", ErrStepNotFound}} {
		if err := f.signal(tt.step, nil, t0); !errors.Is(err, tt.want) {
			t.Fatalf("signal %s: %v, want %v", tt.step, err, tt.want)
		}
	}
	done(t, f, "a", false, true)
	// approval took its signal as it started: b runs.
	wantActive(t, f, "b")
	if string(f.Params["approval"]) != `{"by":"ann"}` || f.Progress[2].State != StepSucceeded {
		t.Fatalf("approval %s (%s), want the payload, succeeded", f.Params["approval"], f.Progress[2].State)
	}
	done(t, f, "b", false, true)
	if err := f.signal("approval", nil, t0); !errors.Is(err, ErrFinished) {
		t.Fatalf("signal to a finished flow: %v", err)
	}

	// Waiting: a timer key only with a timeout; the signal ends the wait
	// and stops the timer.
	f = signalFlow(t, time.Hour, "")
	f.start(t0)
	done(t, f, "a", false, true)
	wantActive(t, f, "approval")
	r := f.Progress[2].Do
	if r.Task != "f/3/approval/do" || !r.Due.Equal(t0.Add(time.Hour)) {
		t.Fatalf("approval waits with timer %q due %s", r.Task, r.Due)
	}
	f.stops = nil
	if err := f.signal("approval", nil, t0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.stops, []string{"f/3/approval/do"}) || string(f.Params["approval"]) != "null" {
		t.Fatalf("stops %v, result %s", f.stops, f.Params["approval"])
	}
	wantActive(t, f, "b")
	// The timer firing late is stale.
	if f.apply(f.timerOutcome(2, t0)) {
		t.Fatal("a timer after the signal was applied")
	}
}

// TestSignalTimeout: the timeout takes the default, or fails the step
// (rollback runs); a signal after it is refused.
func TestSignalTimeout(t *testing.T) {
	f := signalFlow(t, time.Minute, `{"approved":false}`)
	f.start(t0)
	done(t, f, "a", false, true)
	if !f.apply(f.timerOutcome(2, t0.Add(time.Minute))) {
		t.Fatal("timeout not applied")
	}
	wantActive(t, f, "b")
	if string(f.Params["approval"]) != `{"approved":false}` {
		t.Fatalf("approval %s, want the default", f.Params["approval"])
	}
	if err := f.signal("approval", nil, t0); !errors.Is(err, ErrAlreadySignalled) {
		t.Fatalf("signal after the timeout: %v", err)
	}

	f = signalFlow(t, time.Minute, "")
	f.start(t0)
	done(t, f, "a", false, true)
	if !f.apply(f.timerOutcome(2, t0.Add(time.Minute))) {
		t.Fatal("timeout not applied")
	}
	f.summarise()
	wantActive(t, f, "a/undo")
	if f.Progress[2].State != StepFailed || !strings.Contains(f.Error, "no signal within 1m0s") {
		t.Fatalf("approval %s, flow error %q", f.Progress[2].State, f.Error)
	}
	if err := f.signal("approval", nil, t0); !errors.Is(err, ErrFinished) {
		t.Fatalf("signal to a flow rolling back: %v", err)
	}
}

// TestSleepStep: a sleep step's timer is due its sleep after it starts
// (or at its until); a failure elsewhere cancels the wait.
func TestSleepStep(t *testing.T) {
	f := dag(t, "a", "b")
	f.Steps = []Step{f.Steps[0], {Name: "nap", Sleep: task.Duration(10 * time.Minute)},
		{Name: "alarm", Until: t0.Add(time.Hour)}, f.Steps[1]}
	f.Progress = make([]Progress, 4)
	f.start(t0)
	done(t, f, "a", false, true)
	wantActive(t, f, "nap")
	if r := f.Progress[1].Do; !r.Due.Equal(t0.Add(10*time.Minute)) || r.Task != "f/2/nap/do" {
		t.Fatalf("nap %+v", r)
	}
	if !f.apply(f.timerOutcome(1, t0)) {
		t.Fatal("nap's timer not applied")
	}
	wantActive(t, f, "alarm")
	if r := f.Progress[2].Do; !r.Due.Equal(t0.Add(time.Hour)) {
		t.Fatalf("alarm %+v", r)
	}

	g := dag(t, "a", "b<-a")
	g.Steps = append(g.Steps, Step{Name: "nap", Needs: []string{"a"}, Sleep: task.Duration(time.Minute)})
	g.Progress = append(g.Progress, Progress{})
	g.start(t0)
	done(t, g, "a", false, true)
	wantActive(t, g, "b", "nap")
	done(t, g, "b", false, false)
	if g.Progress[2].Do.State != RunCancelled || !slices.Contains(g.stops, "f/3/nap/do") {
		t.Fatalf("nap %s, stops %v: want it cancelled, its timer stopped", g.Progress[2].Do.State, g.stops)
	}
	wantActive(t, g, "b/undo")
}
