package schedule_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// TestAddRefusesHostileSchedules: a schedule's times are bounded and its
// template meets the publish checks, so no occurrence can be what a
// publish refuses.
func TestAddRefusesHostileSchedules(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	base := schedule.Schedule{Name: "n", Every: task.Duration(time.Hour), CatchUp: schedule.DefaultCatchUp, Template: schedule.Template{Kind: "noop"}}
	for _, tt := range []struct {
		edit func(*schedule.Schedule)
		want string
	}{
		{func(s *schedule.Schedule) { s.Start = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) },
			"invalid: start: 9999-01-01T00:00:00Z is outside 2000-01-01 .. 2200-01-01"},
		{func(s *schedule.Schedule) { s.End = time.Date(2500, 1, 1, 0, 0, 0, 0, time.UTC) },
			"invalid: end: 2500-01-01T00:00:00Z is outside 2000-01-01 .. 2200-01-01"},
		{func(s *schedule.Schedule) { s.Template.Payload = json.RawMessage(`{"a":` + deepJSON(64) + `}`) },
			"template: invalid: payload: nested deeper than 64 levels"},
		{func(s *schedule.Schedule) { s.Name = ".." }, `invalid: name: ".." cannot be named in a URL path`},
		{func(s *schedule.Schedule) { s.Name = "leasepool.retention" },
			`invalid: name: "leasepool.retention": the prefix "leasepool." is leasepool's own`},
	} {
		sch := base
		tt.edit(&sch)
		_, err := schedule.Add(t.Context(), s, sch, false)
		if !errors.Is(err, task.ErrInvalid) || err.Error() != tt.want {
			t.Errorf("Add: %v; want %q", err, tt.want)
		}
	}
	if l, err := schedule.List(t.Context(), s); err != nil || len(l) != 0 {
		t.Fatalf("List after refused adds = %+v, %v; want none", l, err)
	}
}

func deepJSON(n int) string {
	b := make([]byte, 0, 2*n)
	for range n {
		b = append(b, '[')
	}
	for range n {
		b = append(b, ']')
	}
	return string(b)
}

// forgedRuns numbers TestRunnerSkipsForgedDocuments's runs in this process.
var forgedRuns atomic.Int64

// TestRunnerSkipsForgedDocuments: schedule documents Add would refuse (a
// built-in's name, whose occurrences would be reserved keys; a value that
// does not decode; a schedule stored under another's name) and a corrupt
// cursor neither stop the runner nor the list, and publish nothing.
func TestRunnerSkipsForgedDocuments(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "s.db"))
	ctx := t.Context()
	// A process counts a document (kind, id, version) once: names of this
	// run's own keep -count=N counting.
	run := fmt.Sprint(forgedRuns.Add(1))
	tick := "tick-" + run
	if _, err := schedule.Add(ctx, s, schedule.Schedule{Name: tick, Every: task.Duration(time.Second),
		CatchUp: schedule.DefaultCatchUp, Template: schedule.Template{Kind: "noop"}}, false); err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(schedule.Schedule{Name: "leasepool.forged-" + run, Every: task.Duration(time.Second),
		CatchUp: schedule.DefaultCatchUp, Template: schedule.Template{Kind: "exec"}, Since: s.Now().Add(-time.Hour)})
	misnamed, _ := json.Marshal(schedule.Schedule{Name: tick, Every: task.Duration(time.Second),
		CatchUp: schedule.DefaultCatchUp, Template: schedule.Template{Kind: "exec"}, Since: s.Now().Add(-time.Hour)})
	before := task.MalformedCounts()
	for _, d := range []task.Document{
		{Namespace: schedule.Namespace, ID: "leasepool.forged-" + run, Value: forged},
		{Namespace: schedule.Namespace, ID: "garbage-" + run, Value: json.RawMessage(`{"every":"soon"}`)},
		{Namespace: schedule.Namespace, ID: "other-" + run, Value: misnamed},
		{Namespace: schedule.CursorNamespace, ID: tick, Value: json.RawMessage(`"not a cursor"`)},
	} {
		if _, err := s.PutDocument(task.WithInternalWrite(ctx), d); err != nil {
			t.Fatal(err)
		}
	}
	l, err := schedule.List(ctx, s)
	if err != nil || len(l) != 1 || l[0].Name != tick || !l[0].LastSlot.IsZero() {
		t.Fatalf("List over forged documents = %+v, %v; want tick only, with no last slot", l, err)
	}
	startRunner(t, s, time.Second)
	testutil.EventuallyEvery(t, 5*time.Second, 50*time.Millisecond, "tick to publish two slots over forged records: the runner goes on",
		func() bool { return len(slotsOf(t, s, tick)) >= 2 })
	if own, err := s.List(ctx, task.ListQuery{Reserved: true}); err != nil || len(own) != 0 {
		t.Fatalf("reserved documents after the runner ran: %d (%v); want none from a forged record", len(own), err)
	}
	after := task.MalformedCounts()
	if n := after[schedule.Namespace] - before[schedule.Namespace]; n != 3 {
		t.Errorf("MalformedCounts()[%s] went up by %d; want the 3 forged schedules counted once", schedule.Namespace, n)
	}
	if n := after[schedule.CursorNamespace] - before[schedule.CursorNamespace]; n != 1 {
		t.Errorf("MalformedCounts()[%s] went up by %d; want the forged cursor counted once", schedule.CursorNamespace, n)
	}
	// The runner wrote the cursor over the forged one.
	if l, err := schedule.List(ctx, s); err != nil || len(l) != 1 || l[0].LastSlot.IsZero() {
		t.Fatalf("List after the runner = %+v, %v; want tick with its last slot", l, err)
	}
}
