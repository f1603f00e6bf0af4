package rollout

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

func openStore(t *testing.T) task.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "tasks.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func devices(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("dev-%03d", i)
	}
	return out
}

func TestCreateSplitsWavesAndProgressCountsThem(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	waves, _ := ParseWaves("1,10%,50%,100%")
	r, err := Create(ctx, st, "fw-1", Spec{Command: "update", Devices: devices(200), Waves: waves, ApproveWaves: true,
		AbortWhen: []AbortRule{{Kinds: []Outcome{OutcomeFailed}, Percent: 8, After: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	var ends []int
	for _, w := range r.Waves {
		ends = append(ends, w.End)
	}
	if fmt.Sprint(ends) != "[1 20 100 200]" || r.Waves[0].Gate != GateAuto || r.Waves[1].Gate != GateApproval {
		t.Fatalf("waves %+v", r.Waves)
	}
	if _, err := Create(ctx, st, "fw-1", Spec{Command: "update", Devices: devices(1)}); !errors.Is(err, ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	got, err := Get(ctx, st, "fw-1")
	if err != nil {
		t.Fatal(err)
	}
	p := got.Progress()
	if p.Total.Total != 200 || len(p.Waves) != 4 || p.Waves[2].Size != 80 || p.Waves[2].Target != 100 || p.AbortAt != 8 || p.AbortAfter != 20 || p.GateFailures != 8 {
		t.Fatalf("progress %+v", p)
	}
	if p.Next == nil || p.Next.Wave != 1 || p.Next.State != "closed" || p.Next.Gate != GateApproval {
		t.Fatalf("next gate %+v", p.Next)
	}
	if _, err := Get(ctx, st, "nope"); !errors.Is(err, ErrNotFound) || !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
	list, err := List(ctx, st)
	if err != nil || len(list) != 1 {
		t.Fatalf("list %v %v", list, err)
	}
}

// TestCreateBySelectorUsesTheInventory: a rollout's selector reads the
// operator's labels, never what the devices announced.
func TestCreateBySelectorUsesTheInventory(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	for i, id := range devices(6) {
		site := "berlin"
		if i%2 == 1 {
			site = "paris"
		}
		// Every device announces site=berlin; the operator labels the
		// first five, dev-000 at paris.
		if err := mqttdev.PutAttributes(ctx, st, id, mqttdev.Labels{"model": "pump-x", "site": "berlin"}, st.Now()); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			site = "paris"
		}
		if i < 5 {
			if _, err := mqttdev.SetLabels(ctx, st, id, mqttdev.LabelChange{Set: mqttdev.Labels{"model": "pump-x", "site": site}}); err != nil {
				t.Fatal(err)
			}
		}
		if i < 3 {
			if err := mqttdev.Vouch(ctx, st, id, "operator"); err != nil {
				t.Fatal(err)
			}
		}
	}
	r, err := Create(ctx, st, "berlin", Spec{Command: "update", Select: "model=pump-x,site=berlin"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range r.Devices {
		ids = append(ids, e.Device)
	}
	if fmt.Sprint(ids) != "[dev-002]" {
		t.Fatalf("selected %v: want the vouched devices labelled berlin, not those announcing it", ids)
	}
	if ev := r.Events[0]; ev.Type != EventCreated || ev.Detail != "1 devices in 1 waves; 1 new device left out, not vouched for (leasepool device approve): dev-004" {
		t.Fatalf("created event %+v: want dev-004 listed as left out", ev)
	}
	// dev-003 and dev-004 are paris and berlin, dev-004 unvouched.
	if _, err := mqttdev.SetLabels(ctx, st, "dev-004", mqttdev.LabelChange{Set: mqttdev.Labels{"ring": "x"}}); err != nil {
		t.Fatal(err)
	}
	for _, sel := range []string{"model=none", "ring=x", "attr:site=berlin", "model=pump-x,attr:site=berlin"} {
		if _, err := Create(ctx, st, "none", Spec{Command: "update", Select: sel}); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "select") {
			t.Fatalf("select %s: %v, want invalid naming select", sel, err)
		}
	}
	if _, err := Get(ctx, st, "none"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused create wrote something: %v", err)
	}
}

// A dry run resolves the devices into waves as Create would, refuses
// what Create refuses, and writes nothing.
func TestDryRunPlansAndWritesNothing(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	for _, id := range devices(10) {
		if _, err := mqttdev.SetLabels(ctx, st, id, mqttdev.LabelChange{Set: mqttdev.Labels{"model": "pump-x"}}); err != nil {
			t.Fatal(err)
		}
		if err := mqttdev.Vouch(ctx, st, id, "operator"); err != nil {
			t.Fatal(err)
		}
	}
	before, err := st.Documents(ctx, Namespace)
	if err != nil || len(before) != 0 {
		t.Fatalf("%d rollouts before (%v)", len(before), err)
	}
	waves, _ := ParseWaves("1,50%,100%")
	r, err := DryRun(ctx, st, "plan", Spec{Command: "update", Select: "model=pump-x", Waves: waves, ApproveWaves: true})
	if err != nil {
		t.Fatal(err)
	}
	p := r.Plan()
	got := fmt.Sprint(p.Waves[0].Devices, p.Waves[1].Devices, p.Waves[2].Devices)
	if want := "[dev-000] [dev-001 dev-002 dev-003 dev-004] [dev-005 dev-006 dev-007 dev-008 dev-009]"; got != want || p.Devices != 10 ||
		p.Waves[1].Gate != GateApproval || p.Waves[1].Target != 5 || p.MaxSize <= 0 || p.MaxSize > task.MaxDocumentSize {
		t.Fatalf("plan %+v\ndevices %s\nwant    %s", p, got, want)
	}
	if _, err := DryRun(ctx, st, "plan", Spec{Command: "update", Devices: devices(3), Waves: []WaveTarget{{Count: 2}, {Count: 1}, {Percent: 100}}}); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("dry run of waves going down: %v", err)
	}
	if docs, err := st.Documents(ctx, Namespace); err != nil || len(docs) != 0 {
		t.Fatalf("a dry run wrote %d rollouts (%v)", len(docs), err)
	}
	if _, err := Create(ctx, st, "plan", Spec{Command: "update", Devices: devices(2)}); err != nil {
		t.Fatal(err)
	}
	if _, err := DryRun(ctx, st, "plan", Spec{Command: "update", Devices: devices(2)}); !errors.Is(err, ErrExists) {
		t.Fatalf("dry run of a name taken: %v, want ErrExists", err)
	}
}

// TestRolloutLeavesOutAnImpostor: the operator labelled and vouched for
// dev-0..dev-4 ring=prod; dev-9, vouched for by nobody, announces
// ring=prod and is even labelled so by mistake. A rollout of ring=prod
// takes the five, dev-0 its first wave, and says it left dev-9 out; once
// an operator vouches for dev-9, the next rollout takes it.
func TestRolloutLeavesOutAnImpostor(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	for i := range 5 {
		id := fmt.Sprintf("dev-%d", i)
		if _, err := mqttdev.SetLabels(ctx, st, id, mqttdev.LabelChange{Set: mqttdev.Labels{"ring": "prod"}}); err != nil {
			t.Fatal(err)
		}
		if err := mqttdev.Vouch(ctx, st, id, "operator"); err != nil {
			t.Fatal(err)
		}
	}
	if err := mqttdev.PutAttributes(ctx, st, "dev-9", mqttdev.Labels{"ring": "prod"}, st.Now()); err != nil {
		t.Fatal(err)
	}
	targets := func(r *Rollout) string {
		var ids []string
		for _, e := range r.Devices {
			ids = append(ids, fmt.Sprintf("%s@%d", e.Device, e.Wave))
		}
		return fmt.Sprint(ids)
	}
	spec := Spec{Command: "update", Select: "ring=prod", Waves: []WaveTarget{{Count: 1}, {Percent: 100}}}
	r, err := Create(ctx, st, "canary1", spec)
	if err != nil || targets(r) != "[dev-0@0 dev-1@1 dev-2@1 dev-3@1 dev-4@1]" {
		t.Fatalf("canary1: %v %v: want the five labelled devices, dev-0 first", r, err)
	}
	// Labelled too, still new: left out, and said so.
	if _, err := mqttdev.SetLabels(ctx, st, "dev-9", mqttdev.LabelChange{Set: mqttdev.Labels{"ring": "prod"}}); err != nil {
		t.Fatal(err)
	}
	r, err = Create(ctx, st, "canary2", spec)
	if err != nil || targets(r) != "[dev-0@0 dev-1@1 dev-2@1 dev-3@1 dev-4@1]" || !strings.HasSuffix(r.Events[0].Detail, "left out, not vouched for (leasepool device approve): dev-9") {
		t.Fatalf("canary2: %v %v: want dev-9 left out and named", r, err)
	}
	if err := mqttdev.Vouch(ctx, st, "dev-9", "operator"); err != nil {
		t.Fatal(err)
	}
	r, err = Create(ctx, st, "canary3", spec)
	if err != nil || targets(r) != "[dev-0@0 dev-1@1 dev-2@1 dev-3@1 dev-4@1 dev-9@1]" || strings.Contains(r.Events[0].Detail, "left out") {
		t.Fatalf("canary3: %v %v: want dev-9 among the targets once vouched for", r, err)
	}
}
