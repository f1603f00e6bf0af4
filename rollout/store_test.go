package rollout

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
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

func TestCreateBySelectorUsesTheInventory(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	for i, id := range devices(6) {
		site := "berlin"
		if i%2 == 1 {
			site = "paris"
		}
		if err := mqttdev.PutAttributes(ctx, st, id, mqttdev.Labels{"model": "pump-x", "site": site}, st.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := mqttdev.SetLabels(ctx, st, "dev-000", mqttdev.LabelChange{Set: mqttdev.Labels{"site": "paris"}}); err != nil {
		t.Fatal(err)
	}
	r, err := Create(ctx, st, "berlin", Spec{Command: "update", Select: "model=pump-x,site=berlin"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range r.Devices {
		ids = append(ids, e.Device)
	}
	if fmt.Sprint(ids) != "[dev-002 dev-004]" {
		t.Fatalf("selected %v (the operator's label moves dev-000 to paris)", ids)
	}
	if _, err := Create(ctx, st, "none", Spec{Command: "update", Select: "model=none"}); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("empty selection: %v", err)
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
		if err := mqttdev.PutAttributes(ctx, st, id, mqttdev.Labels{"model": "pump-x"}, st.Now()); err != nil {
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
