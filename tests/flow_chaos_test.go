package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// flowChaosFlows is the size of TestFlowChaos (issue 12's proof).
const flowChaosFlows = 200

// flowStepPayload is an exec step that sleeps a little (so SIGKILLs land
// mid-step), appends its side effect, one line "flow gen step dir attempt
// worker end-micros start-micros", to logPath, writes its result, and exits with status exit.
func flowStepPayload(logPath string, sleep time.Duration, exit int) json.RawMessage {
	script := fmt.Sprintf(`began=${EPOCHREALTIME/./}
sleep %.3f
echo "$LEASEPOOL_FLOW_KEY $LEASEPOOL_FLOW_GEN $LEASEPOOL_FLOW_STEP $LEASEPOOL_FLOW_DIR $LEASEPOOL_ATTEMPT $LEASEPOOL_WORKER_ID ${EPOCHREALTIME/./} $began" >> %q
echo "{\"n\":$LEASEPOOL_FLOW_STEP_N}" > "$LEASEPOOL_FLOW_RESULT"
exit %d`, sleep.Seconds(), logPath, exit)
	b, _ := json.Marshal(map[string]any{"argv": []string{"bash", "-c", script}})
	return b
}

// chaosFlowSpec is a three-step flow with rollbacks; one in ten fails at
// its second step (after two retries), so its rollbacks run under the
// chaos too. Retries are generous elsewhere: a SIGKILLed attempt counts as
// a failure.
func chaosFlowSpec(i int, logPath string) (flow.Spec, bool) {
	many, two := 30, 2
	sleep := time.Duration(50+i%6*50) * time.Millisecond
	fails := i%10 == 4
	exit2, retries2 := 0, &many
	if fails {
		exit2, retries2 = 3, &two
	}
	step := func(name string, exit int, retries *int) flow.Step {
		return flow.Step{Name: name,
			Action:   flow.Action{Kind: "exec", Payload: flowStepPayload(logPath, sleep, exit), Retries: retries},
			Rollback: &flow.Action{Kind: "exec", Payload: flowStepPayload(logPath, sleep, 0), Retries: &many}}
	}
	return flow.Spec{Key: fmt.Sprintf("f%03d", i), Params: json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`),
		Steps: []flow.Step{step("check", 0, &many), step("init", exit2, retries2), step("deduct", 0, &many)}}, fails
}

// TestFlowChaos runs 200 flows of exec steps on three `leasepool worker`
// processes sharing one embedded store, SIGKILLing a random worker every
// 1.5-3 s (restarted 300 ms later). Every flow must end as planned
// (succeeded, or failed with steps 2 and 1 rolled back in reverse), and,
// from the side effects the steps append: no step ran twice under one
// task attempt, and none ran again once the flow had recorded it.
func TestFlowChaos(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	dbPath := filepath.Join(t.TempDir(), "store.db")
	store, err := sqlitestore.Open(ctx, dbPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	runLog := filepath.Join(t.TempDir(), "steps.log")
	mark := commitMark(t, ctx, store)
	failing := map[string]bool{}
	for i := range flowChaosFlows {
		spec, fails := chaosFlowSpec(i, runLog)
		failing[spec.Key] = fails
		if _, _, err := flow.Publish(ctx, store, spec); err != nil {
			t.Fatal(err)
		}
	}
	ids := []string{"w1", "w2", "w3"}
	workers := map[string]*workerProc{}
	start := func(id string) {
		workers[id] = startWorker(t, "sqlite:"+dbPath, id, "--concurrency", "8", "--kinds", "exec", "--backoff", "100ms")
	}
	for _, id := range ids {
		start(id)
	}
	finished := func() int {
		active, err := flow.List(ctx, store, flow.ListQuery{Active: true})
		if err != nil {
			t.Fatal(err)
		}
		return flowChaosFlows - len(active)
	}
	began, kills := time.Now(), map[string][]time.Time{}
	chaosUntil := began.Add(3 * time.Minute)
	for finished() < flowChaosFlows*95/100 && time.Now().Before(chaosUntil) {
		time.Sleep(1500*time.Millisecond + rand.N(1500*time.Millisecond)) // kills at random times: the chaos
		id := ids[rand.N(len(ids))]
		kills[id] = append(kills[id], workers[id].kill(t))
		time.Sleep(300 * time.Millisecond) // the restart's gap: part of the chaos
		start(id)
	}
	eventually(t, 3*time.Minute, "every flow to finish after the chaos", func() bool { return finished() == flowChaosFlows })
	elapsed := time.Since(began)

	flows, err := flow.List(ctx, store, flow.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != flowChaosFlows {
		t.Fatalf("%d flows stored, %d published", len(flows), flowChaosFlows)
	}
	reruns, afterKill := checkFlowSideEffects(t, ctx, store, flows, readStepLog(t, runLog), kills, failing, commitsSince(t, ctx, store, mark))
	for _, f := range flows {
		checkChaosFlowEnd(t, f, failing[f.Key])
	}
	t.Logf("flow chaos: %d flows (%d failing by design) finished in %s with %d SIGKILLs; %d step runs repeated under a new attempt (%d within 5s before a SIGKILL of their worker, the rest after a lost lease), none after a success",
		len(flows), flowChaosFlows/10, elapsed.Round(time.Second), len(slices.Concat(slices.Collect(maps.Values(kills))...)), reruns, afterKill)
	if len(kills) == 0 {
		t.Errorf("no worker was killed: the run was too short to test anything")
	}
}

// stepRun is one line of the step log.
type stepRun struct {
	flow, step, dir, worker string
	gen, attempt            int
	at, began               time.Time
}

func readStepLog(t *testing.T, path string) []stepRun {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []stepRun
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 8 {
			t.Fatalf("step log line %q", sc.Text())
		}
		gen, _ := strconv.Atoi(fs[1])
		attempt, _ := strconv.Atoi(fs[4])
		us, _ := strconv.ParseInt(fs[6], 10, 64)
		began, _ := strconv.ParseInt(fs[7], 10, 64)
		out = append(out, stepRun{flow: fs[0], gen: gen, step: fs[2], dir: fs[3], attempt: attempt, worker: fs[5],
			at: time.UnixMicro(us), began: time.UnixMicro(began)})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkFlowSideEffects checks that no (flow, run, step, direction, task
// attempt) has two side effects, that no step ran under a later attempt
// than the one the flow recorded whose claim the store committed after
// the flow's record (the middleware does not run a recorded step again),
// and that a step ran again under a new attempt only after an
// attempt that did not succeed (its worker was killed or lost its lease
// before the flow recorded it: at-least-once). It returns how many repeats
// there were, and how many of those followed a SIGKILL of the worker.
func checkFlowSideEffects(t *testing.T, ctx context.Context, store task.Store, flows []*flow.Flow, runs []stepRun,
	kills map[string][]time.Time, failing map[string]bool, order commitOrder) (reruns, afterKill int) {
	t.Helper()
	recorded := map[string]int{}    // flow/step/dir -> attempt the flow recorded
	taskKeys := map[string]string{} // flow/step/dir -> the step task's key
	for _, f := range flows {
		for i, st := range f.Steps {
			for _, dir := range []string{"do", "undo"} {
				r := f.Progress[i].Do
				if dir == "undo" {
					r = f.Progress[i].Undo
				}
				if r.Attempt > 0 {
					recorded[f.Key+"/"+st.Name+"/"+dir] = r.Attempt
					taskKeys[f.Key+"/"+st.Name+"/"+dir] = r.Task
				}
			}
		}
	}
	seen := map[string]bool{}
	byStep := map[string][]stepRun{}
	for _, r := range runs {
		if r.gen != 1 {
			t.Errorf("%s ran in generation %d; nothing retried the flow", r.flow, r.gen)
		}
		id := fmt.Sprintf("%s/%s/%s attempt %d", r.flow, r.step, r.dir, r.attempt)
		if seen[id] {
			t.Errorf("side effect of %s recorded twice", id)
		}
		seen[id] = true
		key := r.flow + "/" + r.step + "/" + r.dir
		byStep[key] = append(byStep[key], r)
		// A later attempt may have read the flow before a lease-lost
		// earlier one's record landed (see checkDAGSideEffects); one whose
		// claim committed after the record read it and must not run.
		if a, ok := recorded[key]; ok && r.attempt > a {
			claim, record := order.claim[claimAt{taskKeys[key], r.attempt}], order.record[runAt{r.flow, r.step, r.dir}]
			if claim == 0 || record == 0 || claim > record {
				t.Errorf("%s ran under attempt %d, claimed in write %d; the flow recorded attempt %d in write %d (0: not in the change stream)",
					key, r.attempt, claim, a, record)
			}
		}
	}
	for key, rs := range byStep {
		if len(rs) <= 1 || (failing[strings.Split(key, "/")[0]] && strings.HasSuffix(key, "/init/do")) {
			continue // each attempt of a step failing by design runs
		}
		tk, err := store.Get(ctx, taskKeys[key])
		if err != nil {
			t.Fatalf("%s: step task %q: %v", key, taskKeys[key], err)
		}
		for _, r := range rs {
			if r.attempt == recorded[key] {
				continue
			}
			reruns++
			if killedAfter(kills[r.worker], r.at, 5*time.Second) {
				afterKill++
			}
			for _, w := range tk.AttemptHistory() {
				if w.Attempt == r.attempt && w.State == task.AttemptSuccess {
					t.Errorf("%s ran again after attempt %d succeeded", key, r.attempt)
				}
			}
		}
	}
	return reruns, afterKill
}

// checkChaosFlowEnd checks a flow's end: succeeded with every result, or,
// for a failing one, failed with init and check undone in that order and
// deduct never started.
func checkChaosFlowEnd(t *testing.T, f *flow.Flow, fails bool) {
	t.Helper()
	if !fails {
		if f.State != flow.StateSucceeded || string(f.Params["init"]) != `{"n":2}` || string(f.Params["deduct"]) != `{"n":3}` {
			t.Errorf("%s: %s (%s), params %v", f.Key, f.State, f.Error, f.Params)
		}
		for i := 1; i < len(f.Steps); i++ {
			if f.Progress[i].Do.StartedAt.Before(f.Progress[i-1].Do.EndedAt) {
				t.Errorf("%s: step %d started before step %d ended", f.Key, i+1, i)
			}
		}
		return
	}
	p := f.Progress
	switch {
	case f.State != flow.StateFailed:
		t.Errorf("%s: %s, want failed (%s)", f.Key, f.State, f.Error)
	case p[2].Do.State != flow.RunNone || p[1].Do.State != flow.RunFailed:
		t.Errorf("%s: progress %+v", f.Key, p)
	case p[1].Undo.State != flow.RunSucceeded || p[0].Undo.State != flow.RunSucceeded || p[0].Undo.StartedAt.Before(p[1].Undo.EndedAt):
		t.Errorf("%s: rollbacks not run in reverse: %+v", f.Key, p)
	}
}

// killedAfter reports whether one of kills came within d after at.
func killedAfter(kills []time.Time, at time.Time, d time.Duration) bool {
	for _, k := range kills {
		if !k.Before(at) && k.Sub(at) < d {
			return true
		}
	}
	return false
}
