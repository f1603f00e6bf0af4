package control_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// TestLimitPerBounded: a limit's duration past MaxLimitPer (292 years, the
// longest time.Duration, overflowed a slot lock's end in the store, so a
// fresh worker took the slot at once) is refused naming the bounds, and
// nothing is stored; MaxLimitPer itself is accepted.
func TestLimitPerBounded(t *testing.T) {
	t.Parallel()
	st := openStore(t)
	for _, per := range []time.Duration{0, time.Microsecond, control.MaxLimitPer + time.Nanosecond, 2562047 * time.Hour} {
		l := control.Limit{Target: control.Kind("k"), N: 1, Per: per}
		err := control.SetLimit(t.Context(), st, l)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "the duration must be from 1ms to "+control.MaxLimitPer.String()) {
			t.Errorf("SetLimit per %s = %v; want ErrInvalid naming the bounds", per, err)
		}
	}
	if ls, err := control.Limits(t.Context(), st); err != nil || len(ls) != 0 {
		t.Fatalf("limits after refused sets: %v, %v; want none", ls, err)
	}
	if err := control.SetLimit(t.Context(), st, control.Limit{Target: control.Kind("k"), N: 1, Per: control.MaxLimitPer}); err != nil {
		t.Fatalf("SetLimit per MaxLimitPer: %v", err)
	}
	// The slot a start takes ends within the times the stores hold.
	if end := time.Now().Add(control.MaxLimitPer); end.After(task.MaxTime) {
		t.Errorf("a slot taken now ends %s, after task.MaxTime", end)
	}
}
