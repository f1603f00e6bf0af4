package rollout

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// stepUntil steps rollout name until cond holds of it.
func stepUntil(t *testing.T, s *Stepper, name, what string, cond func(*Rollout) bool) *Rollout {
	t.Helper()
	var r *Rollout
	defer func() {
		if t.Failed() && r != nil {
			t.Logf("rollout %s: %s (%s), events %v", name, r.State, r.Reason, eventTypes(r))
		}
	}()
	// A step each check, as a driver does.
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("rollout %s: %s", name, what), func() bool {
		if err := s.Step(context.Background(), name); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		var err error
		if r, err = Get(context.Background(), s.st, name); err != nil {
			t.Fatal(err)
		}
		return cond(r)
	})
	return r
}

func TestApprovalGatesPauseAndRetryFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	f := newFleet(t, st, 1, map[string]bool{"dev-003": true}, nil, time.Millisecond)
	waves, _ := ParseWaves("2,100%")
	if _, err := Create(ctx, st, "gated", Spec{Command: "update", Devices: devices(6), Waves: waves, ApproveWaves: true}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	r := stepUntil(t, s, "gated", "wait at the gate", func(r *Rollout) bool { return r.State == StateWaiting })
	if p := r.Progress(); p.Next == nil || p.Next.State != "waiting" || p.Waves[0].Counts.Succeeded != 2 || p.Waves[1].Started {
		t.Fatalf("at the gate: %+v next %+v", p.Waves, p.Next)
	}
	// Paused, an approval opens the gate but nothing is dispatched.
	if _, err := Pause(ctx, st, "gated"); err != nil {
		t.Fatal(err)
	}
	if _, err := Approve(ctx, st, "gated"); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if err := s.Step(ctx, "gated"); err != nil {
			t.Fatal(err)
		}
	}
	if r, _ := Get(ctx, st, "gated"); r.State != StatePaused || r.Progress().Total.Running+r.Progress().Waves[1].Counts.Ended() != 0 {
		t.Fatalf("paused rollout moved: %s %+v", r.State, r.Progress().Total)
	}
	if _, err := Resume(ctx, st, "gated"); err != nil {
		t.Fatal(err)
	}
	r = stepUntil(t, s, "gated", "completion", func(r *Rollout) bool { return r.State == StateCompleted })
	if p := r.Progress(); p.Total.Succeeded != 5 || p.Total.Failed != 1 {
		t.Fatalf("completed with %+v", p.Total)
	}
	// retry-failed runs the failed device again; it fails again.
	if _, n, err := RetryFailed(ctx, st, "gated"); err != nil || n != 1 {
		t.Fatalf("retry-failed: %d %v", n, err)
	}
	r = stepUntil(t, s, "gated", "completion again", func(r *Rollout) bool { return r.State == StateCompleted })
	if e := r.Devices[3]; e.Device != "dev-003" || e.Attempt != 2 || e.Outcome != OutcomeFailed {
		t.Fatalf("dev-003 after retry-failed: %+v", e)
	}
	runs := 0
	for _, run := range f.ran() {
		if run.device == "dev-003" {
			runs++
		}
	}
	if runs != 2 {
		t.Fatalf("dev-003 ran %d times, want 2 (once per attempt)", runs)
	}
	for _, op := range []func(context.Context, Store, string) (*Rollout, error){Pause, Resume, Approve} {
		if _, err := op(ctx, st, "gated"); !errors.Is(err, ErrState) {
			t.Errorf("an operation on a completed rollout: %v, want ErrState", err)
		}
	}
}

func TestRetriesAndTheFailureGate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	newFleet(t, st, 1, map[string]bool{"dev-000": true}, nil, time.Millisecond)
	waves, _ := ParseWaves("1,100%")
	rules, _ := ParseAbortRules("failed>60% after 5")
	if _, err := Create(ctx, st, "gate", Spec{Command: "update", Devices: devices(4), Waves: waves, AbortWhen: rules, Retries: 2}); err != nil {
		t.Fatal(err)
	}
	s := NewStepper(st)
	// Wave 1's only device fails three times (two retries): 100% is over
	// the gate (the rule's 60%), not yet an abort (after 5): it waits.
	r := stepUntil(t, s, "gate", "the failure gate", func(r *Rollout) bool { return r.State == StateWaiting })
	if e := r.Devices[0]; e.Attempt != 3 || len(e.Dispatched) != 3 || e.Outcome != OutcomeFailed {
		t.Fatalf("dev-000: %+v, want 3 attempts, failed", e)
	}
	if _, err := Approve(ctx, st, "gate"); err != nil {
		t.Fatal(err)
	}
	r = stepUntil(t, s, "gate", "completion", func(r *Rollout) bool { return r.State == StateCompleted })
	if p := r.Progress(); p.Total.Succeeded != 3 {
		t.Fatalf("%+v", p.Total)
	}
}
