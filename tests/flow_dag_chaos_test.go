package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// dagChaosFlows is the size of TestFlowDAGChaos in CI, where it must stay
// near 90 s on a loaded 2-core machine; LEASEPOOL_TEST_DAG_FLOWS=200 runs
// the full size on demand.
const dagChaosFlows = 50

// dagFlow is what TestFlowDAGChaos planned for one flow.
type dagFlow struct {
	spec   flow.Spec
	fails  string // the branch step that fails by design, or ""
	signal bool   // has the signal step "approve"
	timer  bool   // has the sleep step "cool"
}

// dagChaosSpec is flow i: "prep", then 3 to 5 branches b0.. that need it,
// then "merge", which needs every branch. One flow in ten fails in a
// branch (after two retries); one in four of the others also waits for
// the signal step "approve"; those timed hold the sleep step "cool" (a
// root) until coolUntil. Every exec step has a rollback.
func dagChaosSpec(i int, logPath string, timed bool, coolUntil time.Time) dagFlow {
	many, two := 30, 2
	sleep := time.Duration(20+i%4*20) * time.Millisecond
	fan := 3 + i%3
	d := dagFlow{spec: flow.Spec{Key: fmt.Sprintf("d%03d", i), Params: json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`)}}
	if i%10 == 7 {
		d.fails = fmt.Sprintf("b%d", i%fan)
	}
	d.signal = d.fails == "" && i%4 == 1
	d.timer = timed
	step := func(name string, needs ...string) flow.Step {
		exit, retries := 0, &many
		if name == d.fails {
			exit, retries = 3, &two
		}
		return flow.Step{Name: name, Needs: needs,
			Action:   flow.Action{Kind: "exec", Payload: flowStepPayload(logPath, sleep, exit), Retries: retries},
			Rollback: &flow.Action{Kind: "exec", Payload: flowStepPayload(logPath, sleep, 0), Retries: &many}}
	}
	steps := []flow.Step{step("prep")}
	var branches []string
	for j := range fan {
		b := fmt.Sprintf("b%d", j)
		branches = append(branches, b)
		steps = append(steps, step(b, "prep"))
	}
	if d.signal {
		steps = append(steps, flow.Step{Name: "approve", Type: flow.TypeSignal, Needs: []string{"prep"}})
		branches = append(branches, "approve")
	}
	if d.timer {
		// A root: its timer is published with the flow, long before due.
		steps = append(steps, flow.Step{Name: "cool", Until: coolUntil})
		branches = append(branches, "cool")
	}
	d.spec.Steps = append(steps, step("merge", branches...))
	return d
}

// TestFlowDAGChaos runs DAG flows (fan-out of 3 to 5, then fan-in; one
// in ten failing in a branch; some waiting for a signal, some for a
// timer) on three `leasepool worker` processes sharing one embedded store,
// SIGKILLing a random worker (restarted 300 ms later) or freezing one
// past its leases every 1-2 s, while the test sends the signals, each
// twice. It checks every flow ended as planned, no step started before
// all it needs had succeeded, no attempt claimed after the flow recorded
// the step ran it (told by the order of the store's commits), rollbacks
// ran in reverse completion order along every chain of needs, each
// signal landed once (the second refused), and the timers, whose workers
// were all restarted between publish and due time, fired within 1 s of
// it.
func TestFlowDAGChaos(t *testing.T) {
	n := dagChaosFlows
	if v := os.Getenv("LEASEPOOL_TEST_DAG_FLOWS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 20 {
			t.Fatalf("LEASEPOOL_TEST_DAG_FLOWS=%q: want a number of at least 20", v)
		}
	}
	ctx := testContext(t, 5*time.Minute)
	store, storeURL := openTestStore(t, ctx)
	runLog := filepath.Join(t.TempDir(), "steps.log")
	mark := commitMark(t, ctx, store)

	// Published before the workers start, as fast as the store takes them.
	plan := map[string]dagFlow{}
	timed := func(i int) bool { return i%(n/5) == 3 }
	for i := range n {
		if !timed(i) {
			d := dagChaosSpec(i, runLog, false, time.Time{})
			plan[d.spec.Key] = d
			if _, _, err := flow.Publish(ctx, store, d.spec); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := []string{"w1", "w2", "w3"}
	workers := map[string]*workerProc{}
	start := func(id string) {
		workers[id] = startWorker(t, storeURL, id, "--concurrency", "8", "--kinds", "exec", "--backoff", "100ms")
	}
	for _, id := range ids {
		start(id)
	}
	began := time.Now()
	kills := map[string][]time.Time{}
	kill := func(id string) {
		kills[id] = append(kills[id], workers[id].kill(t))
		time.Sleep(300 * time.Millisecond) // the restart's gap: part of the chaos
		start(id)
	}
	// The timed flows, their timers due 25 s on; then every worker is
	// killed and restarted in turn before they are due.
	coolUntil := time.Now().Add(25 * time.Second).UTC().Truncate(time.Millisecond)
	for i := range n {
		if timed(i) {
			d := dagChaosSpec(i, runLog, true, coolUntil)
			plan[d.spec.Key] = d
			if _, _, err := flow.Publish(ctx, store, d.spec); err != nil {
				t.Fatal(err)
			}
		}
	}
	published := time.Now()
	for _, id := range ids {
		time.Sleep(rand.N(time.Second)) // kills at random times: the chaos
		kill(id)
	}
	if restarted := time.Now(); restarted.After(coolUntil.Add(-2500 * time.Millisecond)) {
		t.Fatalf("restarting the three workers took until %s after the timers' publish: too slow a machine for their due time", restarted.Sub(published))
	}

	// The signals: each sent at a random moment of the chaos, then again
	// with another payload, which must be refused.
	sent := map[string]json.RawMessage{}
	var sentMu sync.Mutex
	var wg sync.WaitGroup
	for key, d := range plan {
		if !d.signal {
			continue
		}
		wg.Go(func() {
			time.Sleep(rand.N(15 * time.Second)) // an operator's signal at a random time: the chaos
			payload := json.RawMessage(fmt.Sprintf(`{"by":"op","flow":%q}`, key))
			for {
				_, err := flow.Signal(ctx, store, key, "approve", payload)
				if err == nil || errors.Is(err, flow.ErrAlreadySignalled) {
					// A retry after an error that came once the write had
					// landed is refused: the check below finds the payload.
					break
				}
				if ctx.Err() != nil {
					t.Errorf("signal %s: %v", key, err)
					return
				}
				time.Sleep(50 * time.Millisecond) // the operator's retry pace
			}
			sentMu.Lock()
			sent[key] = payload
			sentMu.Unlock()
			if _, err := flow.Signal(ctx, store, key, "approve", json.RawMessage(`"again"`)); !errors.Is(err, flow.ErrAlreadySignalled) {
				t.Errorf("second signal to %s: %v, want ErrAlreadySignalled", key, err)
			}
		})
	}

	finished := func() int {
		active, err := flow.List(ctx, store, flow.ListQuery{Active: true})
		if err != nil {
			t.Fatal(err)
		}
		return n - len(active)
	}
	// No strike from 2.5 s before the timers' time to 2 s after: a worker
	// killed holding a timer's task leaves it to the lease's end (4 s),
	// and one frozen holds the timers back with the store's write lock.
	calm := func(from, to time.Time) bool {
		return to.Before(coolUntil.Add(-2500*time.Millisecond)) || from.After(coolUntil.Add(2*time.Second))
	}
	// Every other strike freezes a worker past its leases (4 s) instead:
	// alive, its leases lapse and peers take its steps over, and, stopped
	// inside a write, it holds the store's write lock, so the records it
	// and its peers were writing land after the next holders read the
	// flows, as on a starved machine: the repeats the commit-order check
	// tells from a step run after it was recorded.
	freezes := 0
	chaosUntil := began.Add(40 * time.Second)
	for strike := 0; (finished() < n*95/100 || time.Now().Before(coolUntil.Add(2*time.Second))) && time.Now().Before(chaosUntil); {
		time.Sleep(time.Second + rand.N(time.Second)) // strikes at random times: the chaos
		id, now, frozen := ids[rand.N(len(ids))], time.Now(), 4*time.Second+rand.N(600*time.Millisecond)
		switch {
		case strike%2 == 0 && calm(now, now.Add(frozen+time.Second)):
			freeze(t, workers[id], frozen)
			freezes++
		case calm(now, now.Add(time.Second)):
			kill(id)
		default:
			continue
		}
		strike++
	}
	if !testutil.WithinEvery(2*time.Minute, 100*time.Millisecond, func() bool { return finished() >= n }) {
		dumpActiveFlows(t, ctx, store)
		t.Fatalf("%d of %d DAG flows still moving 2 minutes after the chaos", n-finished(), n)
	}
	elapsed := time.Since(began)
	wg.Wait()

	flows, err := flow.List(ctx, store, flow.ListQuery{})
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != n {
		t.Fatalf("%d flows stored, %d published", len(flows), n)
	}
	runs := readStepLog(t, runLog)
	reruns, overtaken := checkDAGSideEffects(t, ctx, store, flows, runs, plan, commitsSince(t, ctx, store, mark))
	signals, timers, failing, late := 0, 0, 0, time.Duration(0)
	for _, f := range flows {
		d := plan[f.Key]
		checkDAGFlowEnd(t, f, d)
		if d.signal {
			signals++
			p := f.Progress[slices.IndexFunc(f.Steps, func(s flow.Step) bool { return s.Name == "approve" })]
			if want := sent[f.Key]; string(f.Params["approve"]) != string(want) || p.Signal == nil || string(p.Signal.Payload) != string(want) {
				t.Errorf("%s: approve's result %s (signal %+v), want %s", f.Key, f.Params["approve"], p.Signal, want)
			}
		}
		if d.timer {
			// Fired: its timer task's first attempt began within 1 s of
			// the time (store time); the flow recorded it after.
			timers++
			do := f.Progress[slices.IndexFunc(f.Steps, func(s flow.Step) bool { return s.Name == "cool" })].Do
			tk, err := store.Get(ctx, do.Task)
			if err != nil {
				t.Fatalf("%s: cool's timer %s: %v", f.Key, do.Task, err)
			}
			attempts := tk.AttemptHistory()
			if len(attempts) == 0 || !do.Due.Equal(coolUntil) || attempts[0].StartedAt.Before(coolUntil) ||
				attempts[0].StartedAt.Sub(coolUntil) > time.Second || do.EndedAt.Before(coolUntil) {
				t.Errorf("%s: cool due %s, its timer's attempts %+v, ended %s: want it fired within 1 s after %s", f.Key, do.Due, attempts, do.EndedAt, coolUntil)
			} else {
				late = max(late, attempts[0].StartedAt.Sub(coolUntil))
			}
		}
		if d.fails != "" {
			failing++
		}
	}
	t.Logf("DAG chaos: %d flows (%d failing by design, %d waiting for a signal, %d for a timer, fired at most %s late) finished in %s with %d SIGKILLs and %d freezes; %d step runs, %d repeated under a new attempt (%d claimed before the flow recorded an earlier one)",
		n, failing, signals, timers, late.Round(time.Millisecond), elapsed.Round(time.Second), len(slices.Concat(slices.Collect(maps.Values(kills))...)), freezes, len(runs), reruns, overtaken)
	if freezes == 0 {
		t.Errorf("no worker was frozen: the chaos was too short to test a record landing after the next holder read the flow")
	}
}

// ancestors returns, for each step of f, the steps it needs directly or
// through others.
func ancestors(f *flow.Flow) [][]int {
	needs := flow.Needs(f.Steps)
	out := make([][]int, len(needs))
	for i := range needs {
		seen := map[int]bool{}
		stack := slices.Clone(needs[i])
		for len(stack) > 0 {
			k := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if !seen[k] {
				seen[k] = true
				out[i] = append(out[i], k)
				stack = append(stack, needs[k]...)
			}
		}
	}
	return out
}

// checkDAGSideEffects checks the side effects the steps appended: none
// twice under one attempt; none of a step's work begun before the
// recorded side effect of every step it needs was written; none under a
// later attempt than the recorded one whose claim the store committed
// after the flow's record; and no rollback begun before the recorded
// rollback of every step that needs it ended. It returns how many runs
// repeated under a new attempt, and how many of those ran under an
// attempt claimed before the flow recorded an earlier one.
func checkDAGSideEffects(t *testing.T, ctx context.Context, store task.Store, flows []*flow.Flow, runs []stepRun, plan map[string]dagFlow,
	order commitOrder) (reruns, overtaken int) {
	t.Helper()
	type run struct{ flow, step, dir string }
	byRun := map[run][]stepRun{}
	seen := map[string]bool{}
	for _, r := range runs {
		id := fmt.Sprintf("%s/%s/%s attempt %d", r.flow, r.step, r.dir, r.attempt)
		if seen[id] {
			t.Errorf("side effect of %s written twice", id)
		}
		seen[id] = true
		if r.gen != 1 {
			t.Errorf("%s ran in generation %d; nothing retried the flow", id, r.gen)
		}
		byRun[run{r.flow, r.step, r.dir}] = append(byRun[run{r.flow, r.step, r.dir}], r)
	}
	// recordedEnd is when the side effect of the attempt the flow recorded
	// was written (zero: none recorded).
	recorded := func(f *flow.Flow, i int, dir string) (flow.Run, time.Time) {
		r := f.Progress[i].Do
		if dir == "undo" {
			r = f.Progress[i].Undo
		}
		for _, sr := range byRun[run{f.Key, f.Steps[i].Name, dir}] {
			if sr.attempt == r.Attempt && r.State == flow.RunSucceeded {
				return r, sr.at
			}
		}
		return r, time.Time{}
	}
	attempts := map[string][]task.Attempt{}
	history := func(key string) []task.Attempt {
		if _, ok := attempts[key]; !ok {
			tk, err := store.Get(ctx, key)
			if err != nil {
				t.Fatalf("step task %q: %v", key, err)
			}
			attempts[key] = tk.AttemptHistory()
		}
		return attempts[key]
	}
	for _, f := range flows {
		anc := ancestors(f)
		for i, st := range f.Steps {
			if st.StepType() != flow.TypeTask {
				continue
			}
			for _, dir := range []string{"do", "undo"} {
				rec, _ := recorded(f, i, dir)
				mine := byRun[run{f.Key, st.Name, dir}]
				for _, sr := range mine {
					// The middleware reads the flow after its claim has
					// committed: an attempt claimed after the flow's record
					// of another committed must not run. One claimed before
					// may: the earlier attempt's worker, its lease lapsed in
					// a stalled store, records its outcome after the next
					// holder read the flow (at-least-once; the record's
					// ended_at is taken before its write, so no time
					// bounds this). Commit order, not time, tells them apart.
					if rec.Attempt > 0 && sr.attempt > rec.Attempt {
						claim, record := order.claim[claimAt{rec.Task, sr.attempt}], order.record[runAt{f.Key, st.Name, dir}]
						switch {
						case claim == 0 || record == 0:
							t.Errorf("%s/%s/%s: the change stream lacks attempt %d's claim (write %d) or the flow's record of attempt %d (write %d)",
								f.Key, st.Name, dir, sr.attempt, claim, rec.Attempt, record)
						case claim > record:
							t.Errorf("%s/%s/%s ran under attempt %d, whose claim (write %d) committed after the flow recorded attempt %d (write %d)",
								f.Key, st.Name, dir, sr.attempt, claim, rec.Attempt, record)
						default:
							overtaken++
						}
					}
					if sr.attempt != rec.Attempt && !(dir == "do" && st.Name == plan[f.Key].fails) {
						reruns++
					}
				}
				if dir == "do" {
					for _, k := range anc[i] {
						if f.Steps[k].StepType() != flow.TypeTask {
							continue // no side effect: checkDAGFlowEnd checks it in the document
						}
						_, needEnd := recorded(f, k, "do")
						for _, sr := range mine {
							if needEnd.IsZero() || sr.began.Before(needEnd) {
								t.Errorf("%s: %s began at %s before %s, which it needs, succeeded (its side effect at %s)", f.Key, st.Name,
									sr.began.Format("15:04:05.000"), f.Steps[k].Name, needEnd.Format("15:04:05.000"))
							}
						}
					}
					continue
				}
				// Undo: after every rollback of a step that needs this one.
				for j := range f.Steps {
					if !slices.Contains(anc[j], i) || f.Steps[j].Rollback == nil || f.Progress[j].Do.State == flow.RunNone {
						continue
					}
					_, later := recorded(f, j, "undo")
					for _, sr := range mine {
						if later.IsZero() || sr.began.Before(later) {
							t.Errorf("%s: %s's rollback began at %s before the rollback of %s, which needs it, ended (%s)", f.Key, st.Name,
								sr.began.Format("15:04:05.000"), f.Steps[j].Name, later.Format("15:04:05.000"))
						}
					}
				}
			}
		}
		// No attempt runs after one that succeeded.
		for i, st := range f.Steps {
			for _, dir := range []string{"do", "undo"} {
				rec, _ := recorded(f, i, dir)
				mine := byRun[run{f.Key, st.Name, dir}]
				if len(mine) <= 1 || rec.Task == "" {
					continue
				}
				for _, a := range history(rec.Task) {
					for _, sr := range mine {
						if a.State == task.AttemptSuccess && sr.attempt > a.Attempt {
							t.Errorf("%s/%s/%s ran under attempt %d after attempt %d succeeded", f.Key, st.Name, dir, sr.attempt, a.Attempt)
						}
					}
				}
			}
		}
	}
	return reruns, overtaken
}

// checkDAGFlowEnd checks a flow's end against its plan, in the flow
// document: succeeded with every result, each step started after what it
// needs ended; or failed in the planned branch, merge never started, every
// started step rolled back, each rollback after those of the steps that
// need it, and completion order consistent with the needs.
func checkDAGFlowEnd(t *testing.T, f *flow.Flow, d dagFlow) {
	t.Helper()
	anc := ancestors(f)
	for i := range f.Steps {
		p := f.Progress[i]
		for _, k := range anc[i] {
			q := f.Progress[k]
			if p.Do.State != flow.RunNone && (q.Do.State != flow.RunSucceeded || p.Do.StartedAt.Before(q.Do.EndedAt) || p.Order <= q.Order && p.Order > 0) {
				t.Errorf("%s: %s started at %s (order %d); %s, which it needs, is %s, ended %s (order %d)", f.Key, f.Steps[i].Name,
					p.Do.StartedAt, p.Order, f.Steps[k].Name, q.Do.State, q.Do.EndedAt, q.Order)
			}
			if p.Undo.State != flow.RunNone && q.Undo.State != flow.RunNone && q.Undo.StartedAt.Before(p.Undo.EndedAt) {
				t.Errorf("%s: %s's rollback started at %s, before that of %s, which needs it, ended at %s", f.Key, f.Steps[k].Name,
					q.Undo.StartedAt, f.Steps[i].Name, p.Undo.EndedAt)
			}
		}
	}
	merge := len(f.Steps) - 1
	if d.fails == "" {
		if f.State != flow.StateSucceeded {
			t.Errorf("%s: %s (%s), want succeeded", f.Key, f.State, f.Error)
		}
		for i, st := range f.Steps {
			if st.StepType() == flow.TypeTask && string(f.Params[st.Name]) != fmt.Sprintf(`{"n":%d}`, i+1) {
				t.Errorf("%s: %s's result %s", f.Key, st.Name, f.Params[st.Name])
			}
		}
		return
	}
	if f.State != flow.StateFailed || f.Progress[merge].Do.State != flow.RunNone {
		t.Errorf("%s: %s (%s), merge %s; want failed in %s, merge never started", f.Key, f.State, f.Error, f.Progress[merge].Do.State, d.fails)
	}
	for i, st := range f.Steps {
		p := f.Progress[i]
		if st.Name == d.fails && p.Do.State != flow.RunFailed {
			t.Errorf("%s: %s is %s, want failed", f.Key, st.Name, p.Do.State)
		}
		if st.Rollback != nil && p.Do.State != flow.RunNone && (p.Undo.State != flow.RunSucceeded || p.State != flow.StepRolledBack) {
			t.Errorf("%s: %s started but its rollback is %s (%s)", f.Key, st.Name, p.Undo.State, p.State)
		}
	}
}

// freeze SIGSTOPs w for d, then SIGCONTs it.
func freeze(t *testing.T, w *workerProc, d time.Duration) {
	t.Helper()
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(d) // frozen for d: the point of a freeze
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// dumpActiveFlows logs where the flows still moving stand.
func dumpActiveFlows(t *testing.T, ctx context.Context, store task.Store) {
	active, err := flow.List(ctx, store, flow.ListQuery{Active: true, Limit: 5})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range active {
		t.Logf("flow %s %s (%s)", f.Key, f.State, f.Error)
		for i, st := range f.Steps {
			p := f.Progress[i]
			line := fmt.Sprintf("  %s %s do=%s undo=%s", st.Name, p.State, p.Do.State, p.Undo.State)
			for _, r := range []flow.Run{p.Do, p.Undo} {
				if r.State == flow.RunActive && r.Task != "" {
					tk, err := store.Get(ctx, r.Task)
					if err != nil {
						line += fmt.Sprintf(" task %s: %v", r.Task, err)
					} else {
						line += fmt.Sprintf(" task %s %s attempts %d run_at %s", r.Task, tk.State, tk.AttemptsStarted, tk.RunAt.Format(time.RFC3339Nano))
					}
				}
			}
			t.Log(line)
		}
	}
}
