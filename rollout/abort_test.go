package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// checkAbortWave checks an aborted rollout against its abort rule: the
// waves before the one it aborted in had not crossed the threshold
// when they ended, the aborted wave's ended executions (with those
// before) cross it, and no later wave started.
func checkAbortWave(t *testing.T, r *Rollout, rule AbortRule) {
	t.Helper()
	var c Counts
	for w := 0; w < r.Wave; w++ {
		for _, e := range r.Devices[r.Waves[w].Start:r.Waves[w].End] {
			c.add(e.Outcome)
		}
		n := 0
		for _, k := range rule.Kinds {
			n += c.Of(k)
		}
		if c.Ended() >= rule.After && percent(n, c.Ended()) > rule.Percent {
			t.Fatalf("the rule %s held at the end of wave %d (%d of %d), yet the rollout ran on to wave %d", rule, w+1, n, c.Ended(), r.Wave+1)
		}
	}
	for w := r.Wave + 1; w < len(r.Waves); w++ {
		if !r.Waves[w].StartedAt.IsZero() {
			t.Fatalf("wave %d started after the abort in wave %d", w+1, r.Wave+1)
		}
	}
	for _, e := range r.Devices[r.Waves[r.Wave].End:] {
		if e.Attempt != 0 {
			t.Fatalf("device %s of a later wave was dispatched", e.Device)
		}
	}
}

func TestRolloutAbortsInTheCrossingWaveAndRollsBackExactlyTheSucceeded(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	fail, offline := map[string]bool{}, map[string]bool{}
	for i, d := range devices(100) {
		if i%10 == 3 {
			fail[d] = true
		}
		if i%20 == 7 {
			offline[d] = true
		}
	}
	f := newFleet(t, st, 3, fail, offline, 20*time.Millisecond)
	waves, _ := ParseWaves("1,10%,50%,100%")
	rules, _ := ParseAbortRules("failed>8% after 20")
	if _, err := Create(context.Background(), st, "bad-fw", Spec{Command: "update", Devices: devices(100), Waves: waves,
		Rate: Rate{N: 40, Per: task.Duration(time.Second)}, AbortWhen: rules, GateFailures: 50,
		RollbackCommand: "rollback", RollbackArgs: json.RawMessage(`{"to":"1.0"}`)}); err != nil {
		t.Fatal(err)
	}
	r := drive(t, NewStepper(st), "bad-fw", time.Minute)
	if r.State != StateAborted || r.EndedAt.IsZero() {
		t.Fatalf("state %s (%s), events %v", r.State, r.Reason, eventTypes(r))
	}
	checkAbortWave(t, r, rules[0])
	var succeeded, rolledBack []string
	for _, e := range r.Devices {
		if e.Outcome == OutcomeSucceeded {
			succeeded = append(succeeded, e.Device)
			if e.Rollback != OutcomeSucceeded {
				t.Errorf("%s: rollback %q", e.Device, e.Rollback)
			}
		}
		if e.Outcome == OutcomeRunning || e.Outcome == OutcomeQueued {
			t.Errorf("%s still %s after the abort", e.Device, e.Outcome)
		}
	}
	for _, run := range f.ran() {
		switch run.command {
		case "update":
			if run.start.After(r.EndedAt) {
				t.Errorf("%s got the command at %s, after the abort was recorded at %s", run.device, run.start, r.EndedAt)
			}
		case "rollback":
			rolledBack = append(rolledBack, run.device)
		}
	}
	slices.Sort(rolledBack)
	if fmt.Sprint(rolledBack) != fmt.Sprint(succeeded) {
		t.Fatalf("rolled back %v\nsucceeded   %v", rolledBack, succeeded)
	}
	if len(succeeded) == 0 {
		t.Fatal("no device succeeded before the abort: the test proves nothing")
	}
	p := r.Progress()
	if p.RolledBack.Succeeded != len(succeeded) || p.Rollback == nil || p.Rollback.EndedAt.IsZero() {
		t.Fatalf("progress rollback %+v %+v", p.RolledBack, p.Rollback)
	}
	checkRuns(t, f, r)
}

func TestTwoSteppersAtOnceNeverSendTwice(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	f := newFleet(t, st, 2, map[string]bool{"dev-005": true}, nil, 2*time.Millisecond)
	rate := Rate{N: 10, Per: task.Duration(100 * time.Millisecond)}
	if _, err := Create(context.Background(), st, "race", Spec{Command: "update", Devices: devices(80), Rate: rate, Retries: 2}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conflicts := make(chan int, 2)
	done := make(chan struct{})
	for range 2 {
		go func() {
			s, n := NewStepper(st), 0
			for {
				select {
				case <-done:
					conflicts <- n
					return
				default:
				}
				if err := s.Step(ctx, "race"); errors.Is(err, task.ErrConflict) {
					n++
				} else if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	var r *Rollout
	testutil.EventuallyEvery(t, time.Minute, 20*time.Millisecond, "the race rollout to end", func() bool {
		var err error
		if r, err = Get(ctx, st, "race"); err != nil {
			t.Fatal(err)
		}
		return r.State.Final()
	})
	close(done)
	total := <-conflicts + <-conflicts
	if r.State != StateCompleted {
		t.Fatalf("state %s", r.State)
	}
	if total == 0 {
		t.Error("the two steppers never met a conflict: the test proves nothing")
	}
	// Each device's tasks are exactly its recorded dispatches.
	for _, e := range r.Devices {
		for a := 1; a <= e.Attempt; a++ {
			if _, err := st.Get(ctx, TaskKey("race", e.Device, a)); err != nil {
				t.Errorf("%s attempt %d: %v", e.Device, a, err)
			}
		}
		if _, err := st.Get(ctx, TaskKey("race", e.Device, e.Attempt+1)); !errors.Is(err, task.ErrNotFound) {
			t.Errorf("%s: a task past the recorded attempts: %v", e.Device, err)
		}
		want := 1
		if e.Device == "dev-005" {
			want = 3
		}
		// A peer slower to publish than OrphanAfter has its dispatch
		// taken again under the same key: more tokens, never more keys.
		if e.Attempt != want || len(e.Dispatched) < want {
			t.Errorf("%s: %d attempts, %d dispatches, want %d", e.Device, e.Attempt, len(e.Dispatched), want)
		}
	}
	checkRate(t, allDispatches(r), rate.N, time.Duration(rate.Per))
	checkRuns(t, f, r)
}

// A driver that dies between recording dispatches and publishing them is
// replaced by one that dispatches them again under fresh rate tokens and
// the same keys; when the dead one's publish comes late, after an abort
// was recorded, it finds every key taken and sends nothing.
func TestCrashBetweenRecordAndPublishAndALatePublishAfterAbort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	rate := Rate{N: 4, Per: task.Duration(300 * time.Millisecond)}
	if _, err := Create(ctx, st, "crash", Spec{Command: "update", Devices: devices(12), Rate: rate}); err != nil {
		t.Fatal(err)
	}
	dead := NewStepper(st)
	dead.skipPublish = true // dies after its compare-and-set
	if err := dead.Step(ctx, "crash"); err != nil {
		t.Fatal(err)
	}
	r, _ := Get(ctx, st, "crash")
	if p := r.Progress(); p.Total.Running != 4 {
		t.Fatalf("the dead driver recorded %d dispatches, want 4", p.Total.Running)
	}
	heir := NewStepper(st)
	heir.orphanAfter = 100 * time.Millisecond
	// The heir dispatches the four again once they are orphaned, each
	// under a fresh token (once the window has room) and its first key. A
	// step each pace, as a driver does.
	testutil.EventuallyEvery(t, 30*time.Second, 20*time.Millisecond, "the heir to dispatch the dead driver's records again", func() bool {
		if err := heir.Step(ctx, "crash"); err != nil {
			t.Fatal(err)
		}
		r, _ = Get(ctx, st, "crash")
		again := 0
		for _, e := range r.Devices[:4] {
			if _, err := st.Get(ctx, TaskKey("crash", e.Device, 1)); err == nil && e.Attempt == 1 && len(e.Dispatched) == 2 {
				again++
			}
		}
		return again == 4
	})
	for _, e := range r.Devices {
		if e.Attempt > 1 {
			t.Fatalf("%s: attempt %d: a record taken again must keep its key", e.Device, e.Attempt)
		}
	}
	checkRate(t, allDispatches(r), rate.N, time.Duration(rate.Per))

	// Now the other order: the dead driver records the next four, an
	// operator cancels, the heir withdraws and records the cancel, and
	// the dead driver's publish comes after.
	time.Sleep(time.Duration(rate.Per)) // a rate period: the window has room for the next four, the point of this step
	if err := dead.Step(ctx, "crash"); err != nil {
		t.Fatal(err)
	}
	seen, err := Get(ctx, st, "crash") // what the dead driver wrote
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Cancel(ctx, st, "crash"); err != nil {
		t.Fatal(err)
	}
	r = drive(t, heir, "crash", 30*time.Second)
	if r.State != StateCancelled {
		t.Fatalf("state %s", r.State)
	}
	dead.skipPublish = false
	dead.forcePublish = true
	if err := dead.publishRecorded(ctx, seen); err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Devices[4:8] {
		got, err := st.Get(ctx, TaskKey("crash", e.Device, e.Attempt))
		if err != nil || got.State != task.StateCancelled || len(got.Attempts) != 0 {
			t.Fatalf("%s: the late publish left %+v %v, want the withdrawn, cancelled, never claimed task", e.Device, got, err)
		}
	}
}

// waveStates lists each wave's state and whether it has an end time.
func waveStates(p Progress) string {
	var out []string
	for _, w := range p.Waves {
		end := "-"
		if !w.EndedAt.IsZero() {
			end = "end"
		}
		out = append(out, fmt.Sprintf("%s/%s", w.State, end))
	}
	return fmt.Sprint(out)
}

// After an abort, the wave it aborted in ends with the rollout (aborted,
// at its ended_at) and the waves after it are skipped, never started; a
// cancel while a wave runs ends that wave likewise.
func TestStoppedRolloutEndsItsWaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	fail := map[string]bool{}
	for _, d := range devices(20)[2:] {
		fail[d] = true
	}
	newFleet(t, st, 2, fail, nil, time.Millisecond)
	waves, _ := ParseWaves("2,10,15,100%")
	rules, _ := ParseAbortRules("failed>20% after 5")
	if _, err := Create(ctx, st, "abort", Spec{Command: "update", Devices: devices(20), Waves: waves, AbortWhen: rules}); err != nil {
		t.Fatal(err)
	}
	r := drive(t, NewStepper(st), "abort", 30*time.Second)
	p := r.Progress()
	if r.State != StateAborted || r.Wave != 1 {
		t.Fatalf("state %s in wave %d (%s), want aborted in wave 2", r.State, r.Wave+1, r.Reason)
	}
	if got, want := waveStates(p), "[ended/end aborted/end skipped/- skipped/-]"; got != want {
		t.Errorf("waves %s, want %s", got, want)
	}
	if w := p.Waves[1]; !w.Ended || !w.EndedAt.Equal(r.EndedAt) || !r.Waves[1].Stopped {
		t.Errorf("the aborted wave: %+v; want ended at the rollout's end %s", w, r.EndedAt)
	}

	// A cancel while the first wave's command runs.
	st = openStore(t)
	newFleet(t, st, 1, nil, nil, time.Hour)
	if _, err := Create(ctx, st, "cancel", Spec{Command: "update", Devices: []string{"slow-1", "slow-2", "slow-3"},
		Waves: []WaveTarget{{Count: 1}, {Percent: 100}}}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	key := TaskKey("cancel", "slow-1", 1)
	stepUntil(t, s, "cancel", "a command claimed", func(*Rollout) bool {
		got, err := st.Get(ctx, key)
		return err == nil && len(got.Attempts) == 1 && got.Attempts[0].Live(st.Now())
	})
	if _, err := Cancel(ctx, st, "cancel"); err != nil {
		t.Fatal(err)
	}
	r = stepUntil(t, s, "cancel", "cancelling", func(r *Rollout) bool { return r.State == StateCancelling })
	if got, want := waveStates(r.Progress()), "[running/- skipped/-]"; got != want {
		t.Errorf("cancelling: waves %s, want %s", got, want)
	}
	// The running command ends once its handler stops: the fleet's
	// consumer holds it an hour, so the test cancels its task itself.
	if _, err := task.Modify(ctx, st, key, func(t *task.Task) error { return t.Cancel(st.Now()) }); err != nil {
		t.Fatal(err)
	}
	r = drive(t, s, "cancel", 30*time.Second)
	if got, want := waveStates(r.Progress()), "[cancelled/end skipped/-]"; r.State != StateCancelled || got != want {
		t.Errorf("%s: waves %s, want cancelled, %s", r.State, got, want)
	}
}

// A command that ends on its own after the step aborting the rollout
// looked at it (claimed and run meanwhile) keeps its outcome: one that
// succeeded is rolled back, not taken for withdrawn; and the abort is
// recorded at a time after every command it saw over.
func TestCommandEndingDuringTheAbortKeepsItsOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	if _, err := Create(ctx, st, "late", Spec{Command: "update", Devices: devices(2), RollbackCommand: "rollback"}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	if err := s.Step(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	// The step that aborts: it read the rollout with both commands
	// running, and withdraws only after they ran.
	r, err := Get(ctx, st, "late")
	if err != nil {
		t.Fatal(err)
	}
	if p := r.Progress(); p.Total.Running != 2 {
		t.Fatalf("%d commands running, want 2", p.Total.Running)
	}
	stepStart := st.Now().UTC()
	newFleet(t, st, 1, map[string]bool{"dev-001": true}, nil, time.Millisecond)
	var ended time.Time // when the later of the two ended
	testutil.Eventually(t, 30*time.Second, "the commands to end", func() bool {
		done := 0
		for _, d := range devices(2) {
			if tk, err := st.Get(ctx, TaskKey("late", d, 1)); err == nil && tk.State.Finished() {
				done++
				if tk.UpdatedAt.After(ended) {
					ended = tk.UpdatedAt
				}
			}
		}
		return done == 2
	})
	r.State, r.Reason = StateAborting, "test"
	if _, err := s.withdraw(ctx, r, stepStart); err != nil {
		t.Fatal(err)
	}
	if r.State != StateAborted || r.Devices[0].Outcome != OutcomeSucceeded || r.Devices[0].Rollback != OutcomeQueued ||
		r.Devices[1].Outcome != OutcomeFailed {
		t.Fatalf("%s, executions %+v; want aborted, dev-000 succeeded and to roll back, dev-001 failed", r.State, r.Devices)
	}
	if r.EndedAt.Before(ended) || !r.Waves[0].EndedAt.Equal(r.EndedAt) {
		t.Fatalf("abort recorded at %s (wave ended %s), before the commands it saw over ended at %s", r.EndedAt, r.Waves[0].EndedAt, ended)
	}
}
