package control_test

import (
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// TestGroupLimitsValidate: bad weights, concurrencies and groups are
// refused naming the field, with nothing written.
func TestGroupLimitsValidate(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	for _, c := range []struct {
		l    control.Limit
		want string
	}{
		{control.Limit{Target: control.Group("acme"), Weight: 1001}, "weight"},
		{control.Limit{Target: control.Group("acme"), Weight: -1}, "weight"},
		{control.Limit{Target: control.Lock("tenant:*"), Weight: 2}, "weight applies to a group"},
		{control.Limit{Target: control.Group("acme"), Concurrency: -1}, "concurrency"},
		{control.Limit{Target: control.Group("acme"), Concurrency: control.MaxConcurrency + 1}, "concurrency"},
		{control.Limit{Target: control.Group("acme")}, "give a rate, a weight or a concurrency"},
		{control.Limit{Target: control.Group("ac\x01me"), Weight: 2}, "group"},
		{control.Limit{Target: control.All(), Concurrency: 2}, "not all"},
	} {
		err := control.SetLimit(t.Context(), st, c.l)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("SetLimit(%+v) = %v; want an error naming %q", c.l, err, c.want)
		}
	}
	if ls, err := control.Limits(t.Context(), st); err != nil || len(ls) != 0 {
		t.Fatalf("limits after refused sets: %+v, %v", ls, err)
	}
}

// TestGroupLimitsMerge: SetLimit sets the parts given, keeps the others;
// State answers weights and concurrency slots from them.
func TestGroupLimitsMerge(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	ctx := t.Context()
	for _, l := range []control.Limit{
		{Target: control.Group("acme"), Weight: 3},
		{Target: control.Group("acme"), Concurrency: 5},
		{Target: control.Group("acme"), N: 10, Per: time.Second},
		{Target: control.Lock("tenant:*"), Concurrency: 2},
		{Target: control.Kind("report"), Concurrency: 4},
	} {
		if err := control.SetLimit(ctx, st, l); err != nil {
			t.Fatal(err)
		}
	}
	s, err := control.Load(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	if w := s.Weight("acme"); w != 3 {
		t.Errorf("weight of acme %d, want 3", w)
	}
	if w := s.Weight("other"); w != control.DefaultWeight {
		t.Errorf("weight of a group with none %d, want %d", w, control.DefaultWeight)
	}
	tk := &task.Task{Kind: "report", Group: "acme", LockKeys: []string{"tenant:7", "device:1"}}
	got := s.Concurrency(tk)
	want := []control.Slots{{Key: "kind:report", N: 4}, {Key: "group:acme", N: 5}, {Key: "lock:tenant:7", N: 2}}
	if len(got) != len(want) {
		t.Fatalf("concurrency of %+v: %+v, want %+v", tk, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("concurrency of %+v: %+v, want %+v", tk, got, want)
		}
	}
	if b := s.Buckets(tk); len(b) != 1 || b[0].Key != "group:acme" || b[0].N != 10 {
		t.Errorf("rate buckets %+v; want group:acme's 10/1s alone", b)
	}
	if removed, err := control.RemoveLimit(ctx, st, control.Group("acme")); err != nil || !removed {
		t.Fatalf("remove: %v %v", removed, err)
	}
	if s, _ := control.Load(ctx, st); s.Weight("acme") != control.DefaultWeight || len(s.Concurrency(tk)) != 2 {
		t.Errorf("after remove: weight %d, concurrency %+v", s.Weight("acme"), s.Concurrency(tk))
	}
}
