package flow

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/task"
)

// TestMaxFailedNeedsRefusedAtPublish: a count that cannot mean anything is
// refused with the field named; all of a step's needs may fail.
func TestMaxFailedNeedsRefusedAtPublish(t *testing.T) {
	t.Parallel()
	k := `"kind":"k"`
	for _, tt := range []struct{ file, want string }{
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `,"needs":["a"],"max_failed_needs":-1}]}`,
			"invalid: steps[1].max_failed_needs: must not be negative"},
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `,"max_failed_needs":1}]}`,
			"invalid: steps[1].max_failed_needs: the step names no needs to count failures of"},
		{`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `,"needs":["a"],"max_failed_needs":2}]}`,
			"invalid: steps[1].max_failed_needs: 2 is more than the 1 steps the step needs"},
		{`{"key":"f","steps":[{"name":"a",` + k + `,"max_failed_needs":"1"}]}`,
			"invalid: steps.max_failed_needs: want a JSON int, got string"},
	} {
		spec, err := ParseSpec(strings.NewReader(tt.file))
		if err == nil {
			err = spec.Validate()
		}
		if !errors.Is(err, task.ErrInvalid) || err.Error() != tt.want {
			t.Errorf("%.90s: %v; want %q", tt.file, err, tt.want)
		}
	}
	spec, err := ParseSpec(strings.NewReader(`{"key":"f","steps":[{"name":"a",` + k + `},{"name":"b",` + k + `},{"name":"c",` + k + `,"needs":["a","b"],"max_failed_needs":2}]}`))
	if err == nil {
		err = spec.Validate()
	}
	if err != nil || spec.Steps[2].MaxFailedNeeds != 2 {
		t.Fatalf("max_failed_needs equal to the needs: %v", err)
	}
}

// fleet: five updates, each verified, and a fan-in "all" over the
// verifies that tolerates x failures; every task step has a rollback.
func fleet(t *testing.T, x int) *Flow {
	t.Helper()
	f := dag(t, "u1", "u2", "u3", "u4", "u5", "v1<-u1", "v2<-u2", "v3<-u3", "v4<-u4", "v5<-u5", "all<-v1,v2,v3,v4,v5")
	f.Steps[index(f, "all")].MaxFailedNeeds = x
	if err := (Spec{Key: "f", Steps: f.Steps}).Validate(); err != nil {
		t.Fatal(err)
	}
	f.start(t0)
	return f
}

// stepStates lists "name:state" for every step.
func stepStates(f *Flow) string {
	var out []string
	for i, p := range f.Progress {
		out = append(out, f.Steps[i].Name+":"+string(p.State))
	}
	return strings.Join(out, " ")
}

// undos lists the steps whose rollback started.
func undos(f *Flow) []string {
	var out []string
	for i, p := range f.Progress {
		if p.Undo.State != RunNone {
			out = append(out, f.Steps[i].Name)
		}
	}
	return out
}

// TestFleetBelowAndAtLimit: a failed update fails its verify without
// running it, a failed verify fails alone; while no more than x verifies
// failed (one, then two, of two tolerated) the other branches run on, "all" starts once every verify ended,
// the flow succeeds and nothing is rolled back.
func TestFleetBelowAndAtLimit(t *testing.T) {
	for _, fails := range [][]string{{"u3"}, {"u3", "v5"}} {
		f := fleet(t, 2)
		wantActive(t, f, "u1", "u2", "u3", "u4", "u5")
		done(t, f, fails[0], false, false)
		// The failure in one branch stops nothing in the others.
		wantActive(t, f, "u1", "u2", "u4", "u5")
		// v3 never starts: skipped, its work recorded failed for "all"
		// to count.
		if v3 := f.Progress[index(f, "v3")]; f.State != StateRunning || v3.State != StepSkipped ||
			v3.Reason != "needs u3, which failed" || v3.Do.State != RunFailed {
			t.Fatalf("flow %s %q; %s", f.State, f.Error, stepStates(f))
		}
		for _, u := range []string{"u1", "u2", "u4", "u5"} {
			done(t, f, u, false, true)
		}
		wantActive(t, f, "v1", "v2", "v4", "v5")
		for _, v := range []string{"v1", "v2", "v4"} {
			done(t, f, v, false, true)
		}
		wantActive(t, f, "v5")
		done(t, f, "v5", false, len(fails) < 2)
		wantActive(t, f, "all")
		done(t, f, "all", false, true)
		if f.State != StateSucceeded || f.Error != "" || undos(f) != nil {
			t.Fatalf("%v failed: flow %s %q, rollbacks %v; want succeeded with none", fails, f.State, f.Error, undos(f))
		}
		want := "u1:succeeded u2:succeeded u3:failed u4:succeeded u5:succeeded v1:succeeded v2:succeeded v3:skipped v4:succeeded v5:succeeded all:succeeded"
		if len(fails) == 2 {
			want = strings.Replace(want, "v5:succeeded", "v5:failed", 1)
		}
		if got := stepStates(f); got != want {
			t.Fatalf("%v failed: %s\nwant %s", fails, got, want)
		}
	}
}

// TestFleetAboveLimit: the failure that passes x fails the flow at once:
// the steps running finish, every step that succeeded is rolled back (u2,
// whose verify failed, changed its device), and no failed one is.
func TestFleetAboveLimit(t *testing.T) {
	f := fleet(t, 2)
	done(t, f, "u1", false, false)
	done(t, f, "u2", false, true)
	done(t, f, "v2", false, false)
	if f.State != StateRunning {
		t.Fatalf("flow %s at two failures of two tolerated", f.State)
	}
	wantActive(t, f, "u3", "u4", "u5")
	done(t, f, "u3", false, false)
	if f.State != StateRollingBack || !strings.Contains(f.Error, "step 3 (u3) failed: u3 broke; 3 of the 5 steps all needs failed, more than its max_failed_needs (2)") {
		t.Fatalf("flow %s %q", f.State, f.Error)
	}
	wantActive(t, f, "u2/undo", "u4", "u5")
	done(t, f, "u4", false, true) // v4 never starts
	done(t, f, "u5", false, true)
	wantActive(t, f, "u2/undo", "u4/undo", "u5/undo")
	for _, u := range []string{"u2", "u4", "u5"} {
		done(t, f, u, true, true)
	}
	wantActive(t, f)
	if f.State != StateFailed || !slices.Equal(undos(f), []string{"u2", "u4", "u5"}) {
		t.Fatalf("flow %s, rolled back %v; want failed, u2 u4 u5", f.State, undos(f))
	}
	want := "u1:failed u2:rolled_back u3:failed u4:rolled_back u5:rolled_back v1:skipped v2:failed v3:skipped v4:skipped v5:skipped all:skipped"
	if got := stepStates(f); got != want {
		t.Fatalf("%s\nwant %s", got, want)
	}
	// Each skipped step says why.
	for step, why := range map[string]string{"v1": "needs u1, which failed", "v3": "needs u3, which failed",
		"v4": "the flow stopped first", "all": "needs v2, which failed"} {
		if got := f.Progress[index(f, step)].Reason; got != why {
			t.Errorf("%s skipped because %q, want %q", step, got, why)
		}
	}
	// A retry runs again every step that does not stand.
	if err := f.retry(t0); err != nil {
		t.Fatal(err)
	}
	wantActive(t, f, "u1", "u2", "u3", "u4", "u5")
}

// TestFleetVerifiedStepsRollBackInOrder: past the limit a verify that
// succeeded is undone before its update.
func TestFleetVerifiedStepsRollBackInOrder(t *testing.T) {
	f := fleet(t, 1)
	done(t, f, "u1", false, true)
	done(t, f, "v1", false, true)
	done(t, f, "u2", false, false)
	done(t, f, "u3", false, false)
	wantActive(t, f, "u4", "u5", "v1/undo")
	done(t, f, "v1", true, true)
	wantActive(t, f, "u1/undo", "u4", "u5")
}

// TestToleratedRetriesAndAll: a failure with retries left counts nothing;
// with max_failed_needs equal to its needs a step runs even when all of
// them failed.
func TestToleratedRetriesAndAll(t *testing.T) {
	f := dag(t, "a", "b", "report<-a,b")
	f.Steps[2].MaxFailedNeeds = 2
	f.start(t0)
	if !f.apply(outcome{Gen: 1, Step: 0, Error: "once", Attempt: 1, At: t0}) {
		t.Fatal("not applied")
	}
	f.summarise()
	if f.Progress[0].State != StepRunning {
		t.Fatalf("a is %s after a failure with retries left", f.Progress[0].State)
	}
	wantActive(t, f, "a", "b")
	done(t, f, "a", false, false)
	wantActive(t, f, "b")
	done(t, f, "b", false, false)
	wantActive(t, f, "report")
	if p := f.paramsFor(2, false); p["a"] != nil || p["b"] != nil {
		t.Fatalf("report sees %v: failed steps have no result", p)
	}
	done(t, f, "report", false, true)
	if f.State != StateSucceeded {
		t.Fatalf("flow %s", f.State)
	}
	if err := f.retry(t0); !errors.Is(err, ErrFinished) {
		t.Fatalf("retry of a succeeded flow: %v", err)
	}
}

// TestUncontainedFailure: a failure that reaches a step nothing needs
// without passing a counting step fails the flow as without the field;
// the counted failure before it is still not rolled back, and a counting
// step that fails itself fails the flow.
func TestUncontainedFailure(t *testing.T) {
	f := dag(t, "a", "b", "c<-a,b", "d")
	f.Steps[2].MaxFailedNeeds = 1
	f.start(t0)
	done(t, f, "a", false, false)
	done(t, f, "b", false, true)
	wantActive(t, f, "c", "d")
	done(t, f, "d", false, false)
	if f.State != StateRollingBack || !strings.Contains(f.Error, "step 4 (d) failed") {
		t.Fatalf("flow %s %q", f.State, f.Error)
	}
	wantActive(t, f, "c", "d/undo")
	done(t, f, "c", false, false)
	wantActive(t, f, "c/undo", "d/undo")

	g := dag(t, "a", "b", "c<-a,b")
	g.Steps[2].MaxFailedNeeds = 1
	g.start(t0)
	done(t, g, "a", false, true)
	done(t, g, "b", false, true)
	done(t, g, "c", false, false)
	wantActive(t, g, "c/undo")
	done(t, g, "c", true, true)
	wantActive(t, g, "a/undo", "b/undo")
}

// TestCancelWithToleratedFailure: a cancel while a tolerated failure is
// recorded and other branches run stops them; the rollback undoes what
// started and did not fail for good, not the tolerated failure.
func TestCancelWithToleratedFailure(t *testing.T) {
	f := fleet(t, 2)
	done(t, f, "u1", false, false)
	done(t, f, "u2", false, true)
	if err := f.cancel(true, t0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.stops, []string{"f/3/u3/do", "f/4/u4/do", "f/5/u5/do", "f/7/v2/do"}) {
		t.Fatalf("stops %v", f.stops)
	}
	wantActive(t, f, "u3/undo", "u4/undo", "u5/undo", "v2/undo")
	if slices.Contains(undos(f), "u1") {
		t.Fatal("the tolerated failure u1 is rolled back")
	}

	g := fleet(t, 2)
	done(t, g, "u1", false, false)
	if err := g.cancel(false, t0); err != nil || g.State != StateCancelled {
		t.Fatalf("cancel without rollback: %v, %s", err, g.State)
	}
	g.summarise()
	if g.Progress[0].State != StepFailed || g.Progress[5].State != StepSkipped || g.Progress[1].State != StepCancelled ||
		g.Progress[5].Reason != "needs u1, which failed" || g.Progress[6].Reason != "needs u2, which was cancelled" {
		t.Fatalf("%s", stepStates(g))
	}
}
