package flow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// fanOut is a root step fanning out to mids steps, each fanning out to
// leaves steps: 1 + mids + mids*leaves steps, each with a rollback.
func fanOut(mids, leaves int, fail string) []flow.Step {
	steps := []flow.Step{stepOf("root")}
	for m := range mids {
		steps = append(steps, stepOf(fmt.Sprintf("m%d", m), "root"))
	}
	for m := range mids {
		for l := range leaves {
			st := stepOf(fmt.Sprintf("l%d-%d", m, l), fmt.Sprintf("m%d", m))
			if st.Name == fail {
				st.Payload, st.Retries = json.RawMessage(`"fail"`), new(int)
			}
			steps = append(steps, st)
		}
	}
	return steps
}

// namedParts returns how many parts the flow's document names.
func namedParts(t *testing.T, s task.Store, key string) int {
	t.Helper()
	head, err := s.GetDocument(context.Background(), flow.Namespace, key)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Split struct {
			Spec  []int    `json:"spec"`
			Parts []string `json:"parts"`
		} `json:"split"`
	}
	if err := json.Unmarshal(head.Value, &h); err != nil {
		t.Fatal(err)
	}
	n := len(h.Split.Spec)
	for _, p := range h.Split.Parts {
		if p != "" {
			n++
		}
	}
	return n
}

// partsNamed checks that the flow's parts in the store are exactly those
// its document names (a write's replaced parts are gone), each within a
// document's size, and returns how many there are.
func partsNamed(t *testing.T, s task.Store, key string) int {
	t.Helper()
	var n int
	var problems []string
	// A writer that lost the head's compare-and-set deletes the parts it
	// wrote after the loss: as the flow ends, the last of them may still
	// be on their way out. Any left after that are a leak.
	testutil.Within(10*time.Second, func() bool {
		n, problems = partsOf(t, s, key)
		return len(problems) == 0
	})
	for _, p := range problems {
		t.Error(p)
	}
	return n
}

// partsOf returns how many parts of flow key are stored and what is wrong
// with them: stored and not named by its head, named and not stored, too
// large.
func partsOf(t *testing.T, s task.Store, key string) (n int, problems []string) {
	t.Helper()
	ctx := context.Background()
	head, err := s.GetDocument(ctx, flow.Namespace, key)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Steps []json.RawMessage `json:"steps"`
		Split *struct {
			Token string   `json:"token"`
			Spec  []int    `json:"spec"`
			Parts []string `json:"parts"`
		} `json:"split"`
	}
	if err := json.Unmarshal(head.Value, &h); err != nil || h.Split == nil || len(h.Steps) > 0 {
		t.Fatalf("flow document of %d bytes: not a head naming parts (%v): %.300s", len(head.Value), err, head.Value)
	}
	want := map[string]bool{}
	for n := range h.Split.Spec {
		want[fmt.Sprintf("%s~%s~s%d", key, h.Split.Token, n)] = true
	}
	for n, p := range h.Split.Parts {
		if p != "" {
			want[fmt.Sprintf("%s~%s~p%d~%s", key, h.Split.Token, n, p)] = true
		}
	}
	docs, err := s.Documents(ctx, flow.PartNamespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if !strings.HasPrefix(d.ID, key+"~") {
			continue
		}
		n++
		if !want[d.ID] {
			problems = append(problems, fmt.Sprintf("part %s is stored but not named by the flow", d.ID))
		}
		delete(want, d.ID)
		if len(d.Value) > task.MaxDocumentSize/4 {
			problems = append(problems, fmt.Sprintf("part %s: %d bytes", d.ID, len(d.Value)))
		}
	}
	for id := range want {
		problems = append(problems, fmt.Sprintf("part %s is named but not stored", id))
	}
	return n, problems
}

// TestLargeFanOutSucceeds runs a flow of 253 steps, stored in parts, on a
// worker: every step runs once, the results are all kept, and no part is
// left but those the flow names.
func TestLargeFanOutSucceeds(t *testing.T) {
	r := newRig(t)
	steps := fanOut(12, 20, "")
	r.publish(t, "big", `{"req":1}`, steps)
	f := r.wait(t, "big")
	if f.State != flow.StateSucceeded || len(f.Progress) != len(steps) {
		t.Fatalf("flow %s with %d records; want succeeded with %d\nevents: %+v", f.State, len(f.Progress), len(steps), f.Events)
	}
	runs := r.runs()
	for _, st := range steps {
		if n := strings.Count(strings.Join(runs, "\n")+"\n", "start "+st.Name+" do\n"); n != 1 {
			t.Errorf("step %s ran %d times; want once", st.Name, n)
		}
		if string(f.Params[st.Name]) != fmt.Sprintf("%q", st.Name) {
			t.Errorf("params[%s] = %s", st.Name, f.Params[st.Name])
		}
	}
	if string(f.Params["req"]) != "1" {
		t.Errorf("params[req] = %s; want the request's 1", f.Params["req"])
	}
	if n := partsNamed(t, r.store, "big"); n < 6 {
		t.Errorf("%d parts; want the flow split", n)
	}
}

// TestLargeFanOutRollsBack fails one leaf of a 253-step fan-out: every
// step whose work started is rolled back once, each mid step after the
// leaves under it and the root last.
func TestLargeFanOutRollsBack(t *testing.T) {
	r := newRig(t)
	steps := fanOut(12, 20, "l5-7")
	r.publish(t, "big-fail", "", steps)
	f := r.wait(t, "big-fail")
	if f.State != flow.StateFailed || !strings.Contains(f.Error, "l5-7") {
		t.Fatalf("flow %s (%s); want failed by l5-7", f.State, f.Error)
	}
	runs := r.runs()
	all := strings.Join(runs, "\n") + "\n"
	for i, st := range steps {
		started := strings.Count(all, "start "+st.Name+" do\n")
		undone := strings.Count(all, "start "+st.Name+" undo\n")
		if started > 1 || undone != started {
			t.Errorf("step %s: work ran %d times, rollback %d; want each once or neither", st.Name, started, undone)
		}
		p := f.Progress[i]
		if started == 1 && p.Undo.State != flow.RunSucceeded {
			t.Errorf("step %s: rollback %s", st.Name, p.Undo.State)
		}
		if started == 0 && p.State != flow.StepSkipped {
			t.Errorf("step %s never started but is %s", st.Name, p.State)
		}
	}
	rootUndo := position(runs, "start root undo")
	for m := range 12 {
		mid := fmt.Sprintf("m%d", m)
		midUndo := position(runs, "start "+mid+" undo")
		if midUndo > rootUndo {
			t.Errorf("%s rolled back after root", mid)
		}
		for l := range 20 {
			leaf := fmt.Sprintf("l%d-%d", m, l)
			if e := position(runs, "end "+leaf+" undo"); e >= 0 && e > midUndo {
				t.Errorf("%s rolled back before %s's rollback ended", mid, leaf)
			}
		}
	}
	partsNamed(t, r.store, "big-fail")
}

// TestLevelsFailingFirst: flow.Levels gives each level's counts by state
// and its steps failing first, then moving, then the rest in step order.
func TestLevelsFailingFirst(t *testing.T) {
	steps := fanOut(1, 6, "")
	f := &flow.Flow{Key: "k", Steps: steps, Progress: make([]flow.Progress, len(steps))}
	states := []flow.StepState{flow.StepSucceeded, flow.StepSucceeded,
		flow.StepSucceeded, flow.StepWaiting, flow.StepFailed, flow.StepRunning, flow.StepRollbackFailed, flow.StepSkipped}
	for i, st := range states {
		f.Progress[i].State = st
	}
	levels := flow.Levels(f)
	if len(levels) != 3 || len(levels[2].Steps) != 6 {
		t.Fatalf("levels %+v", levels)
	}
	var got []string
	for _, i := range levels[2].Steps {
		got = append(got, f.Steps[i].Name+":"+string(f.Progress[i].State))
	}
	want := "l0-4:rollback_failed l0-2:failed l0-3:running l0-5:skipped l0-1:waiting l0-0:succeeded"
	if strings.Join(got, " ") != want {
		t.Errorf("level 3 in order %v; want %s", got, want)
	}
	if c := levels[2].Counts; c[flow.StepFailed] != 1 || c[flow.StepSucceeded] != 1 || c[flow.StepWaiting] != 1 {
		t.Errorf("counts %v", c)
	}
}

// TestLargeFanOutTwoWriters runs a 253-step fan-out on two workers, each
// on its own handle of one store file (two processes' worth of writers:
// their writes to the flow race by compare-and-set on its head, and a
// loser's parts are deleted): every step runs once, the flow succeeds,
// and no part is left but those it names.
func TestLargeFanOutTwoWriters(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tasks.db")
	var first task.Store
	var ranMu sync.Mutex
	ran := map[string]int{}
	for i := range 2 {
		s, err := sqlitestore.Open(ctx, path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if first == nil {
			first = s
		}
		mux := consumer.NewMux()
		if err := flow.Register(mux, flow.Config{Store: s}); err != nil {
			t.Fatal(err)
		}
		mux.RegisterFunc("test.step", func(ctx context.Context, job *consumer.Job) error {
			ref, _ := flow.CurrentStep(ctx)
			ranMu.Lock()
			ran[ref.Name]++
			ranMu.Unlock()
			return job.SetResult(ref.Name)
		})
		c, err := consumer.New(consumer.Config{Store: s, Handler: mux, WorkerID: fmt.Sprintf("w%d", i), Concurrency: 8, RetryPolicy: consumer.NoBackoff})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Stop(context.Background()) })
	}
	steps := fanOut(12, 20, "")
	if _, _, err := flow.Publish(ctx, first, flow.Spec{Key: "two", Steps: steps}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	f, err := waitFinished(wctx, first, "two")
	if err != nil {
		t.Fatal(err)
	}
	if f.State != flow.StateSucceeded {
		t.Fatalf("flow %s: %s", f.State, f.Error)
	}
	ranMu.Lock()
	defer ranMu.Unlock()
	for _, st := range steps {
		if ran[st.Name] != 1 {
			t.Errorf("step %s ran %d times; want once", st.Name, ran[st.Name])
		}
	}
	// Replaced parts are deleted off the write's path: wait for them.
	testutil.Eventually(t, 10*time.Second, "replaced parts deleted", func() bool {
		docs, err := first.Documents(ctx, flow.PartNamespace)
		return err == nil && len(docs) == namedParts(t, first, "two")
	})
	partsNamed(t, first, "two")
}
