package events_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
)

// rolloutLine is what the rollout tests compare of an event.
func rolloutLine(e events.Event) string {
	if e.Rollout == "" {
		return line(e)
	}
	return fmt.Sprintf("%s %s #%d wave %d %s %q", e.Type, e.Rollout, e.Seq, e.Wave, e.State, e.Message)
}

// drain reads st until it has been quiet for a while.
func drain(t *testing.T, st *events.Stream) []events.Event {
	t.Helper()
	var out []events.Event
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		e, err := st.Next(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("after %d events: %v", len(out), err)
		}
		out = append(out, e)
	}
}

// runRollout drives rollout "fw" on s through create, pause, resume, its
// first wave and a cancel, stepping it as a driver would, with forged
// rollout documents written in between; it returns the rollout's own
// record of its events as the stream should deliver them.
func runRollout(t *testing.T, s task.Store) []string {
	t.Helper()
	ctx := context.Background()
	spec := rollout.Spec{Command: "update", Devices: []string{"d1", "d2", "d3"},
		Waves: []rollout.WaveTarget{{Count: 1}, {Percent: 100}}}
	if _, err := rollout.Create(ctx, s, "fw", spec); err != nil {
		t.Fatal(err)
	}
	forge(t, s)
	if _, err := rollout.Pause(ctx, s, "fw"); err != nil {
		t.Fatal(err)
	}
	if _, err := rollout.Resume(ctx, s, "fw"); err != nil {
		t.Fatal(err)
	}
	stepper := rollout.NewStepper(s)
	if err := stepper.Step(ctx, "fw"); err != nil {
		t.Fatal(err)
	}
	if _, err := rollout.Cancel(ctx, s, "fw"); err != nil {
		t.Fatal(err)
	}
	var r *rollout.Rollout
	for range 50 {
		if err := stepper.Step(ctx, "fw"); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		var err error
		if r, err = rollout.Get(ctx, s, "fw"); err != nil {
			t.Fatal(err)
		}
		if r.State == rollout.StateCancelled {
			break
		}
	}
	if r.State != rollout.StateCancelled {
		t.Fatalf("rollout %s after 50 steps, want cancelled", r.State)
	}
	// The stream's state is the rollout's after each write: the document
	// keeps only the events, so the expectation pairs them with the
	// states the writes stored.
	var want []string
	for _, e := range r.Events {
		want = append(want, fmt.Sprintf("%s fw #%d wave %d %s %q", e.Type, e.Seq, e.Wave, stateAfter[e.Type], e.Detail))
	}
	return want
}

// stateAfter is the rollout's state after the write that recorded each
// event runRollout makes.
var stateAfter = map[string]string{
	rollout.EventCreated: "running", rollout.EventPaused: "paused", rollout.EventResumed: "running",
	rollout.EventWaveStarted: "running", rollout.EventCancelled: "cancelled",
}

// forge writes rollout documents no rollout wrote: not JSON objects, events
// of unknown types, of other versions, out of order, with a detail far past
// any real one. The stream must go on, yielding only the one event that is
// well formed (of forged3's first write), its detail bounded.
func forge(t *testing.T, s task.Store) {
	t.Helper()
	ctx := task.WithInternalWrite(context.Background())
	put := func(id string, version int64, value string) {
		t.Helper()
		_, err := s.PutDocument(ctx, task.Document{Namespace: events.RolloutNamespace, ID: id, Version: version, Value: []byte(value)})
		if err != nil {
			t.Fatal(err)
		}
	}
	put("forged1", 0, `{"events":"not a list"}`)
	put("forged1", 1, `[1,2,3]`)
	put("forged2", 0, `null`)
	long := strings.Repeat("x", 5000)
	put("forged3", 0, `{"state":"`+strings.Repeat("s", 100)+`","events":[
		{"seq":1,"type":"rollout.exploded","version":1},
		{"seq":2,"type":"rollout.paused","version":7},
		{"seq":3,"type":"rollout.aborted","version":1,"wave":-4,"detail":"`+long+`"},
		{"seq":3,"type":"rollout.completed","version":1},
		{"seq":2,"type":"rollout.completed","version":1}]}`)
	if err := s.DeleteDocument(ctx, events.RolloutNamespace, "forged1", 0); err != nil {
		t.Fatal(err)
	}
}

// A rollout's events reach the stream in the order it recorded them, each
// once, beside the task events of its device commands; a cut anywhere and
// a resume from the token reads the rest, none repeated; forged rollout
// documents neither break the stream nor add events of their own beyond
// one well-formed forged event.
func TestRolloutEventsInOrderOnceAndResumable(t *testing.T) {
	checkRolloutEvents(t, openSQLite(t, filepath.Join(t.TempDir(), "store.db")), events.Params{})
}

// A MongoDB stream that names its position when it opens gives rollout
// events beside task events (pair tokens); the wire test server names none
// for its document stream before that stream's first event, so there
// Follow follows task events alone and TasksOnly says so: every event
// still carries a token to resume by, and rollout writes break nothing.
// Either way, rollout events that come are the rollout's own, in order,
// once.
func TestRolloutEventsMongo(t *testing.T) {
	s := openMongo(t, "lp_revents")
	live := follow(t, s, events.Params{})
	want := runRollout(t, s)
	all := drain(t, live)
	var got []string
	tasks := 0
	for _, e := range all {
		if e.Token == "" {
			t.Fatalf("%s: no token", rolloutLine(e))
		}
		if e.Rollout == "fw" {
			got = append(got, rolloutLine(e))
		} else if e.Rollout == "" {
			tasks++
		}
	}
	if tasks == 0 {
		t.Error("no task event of the device commands")
	}
	if live.TasksOnly() && len(got) > 0 || !live.TasksOnly() && !reflect.DeepEqual(got, want) {
		t.Errorf("tasks only %v: rollout events\n got %q\nwant %q", live.TasksOnly(), got, want)
	}
	// Resumed from its first event, it reads the rest of the same events.
	rest := follow(t, s, events.Params{After: all[0].Token})
	if g := eventLines(drain(t, rest)); len(got) > 0 && !reflect.DeepEqual(g, eventLines(all[1:])) {
		t.Errorf("resumed: %q, want %q", g, eventLines(all[1:]))
	}
}

func checkRolloutEvents(t *testing.T, s task.Store, p events.Params) {
	full := follow(t, s, p)
	start := full.Token()
	want := runRollout(t, s)
	all := drain(t, full)

	var got []string
	var forged []events.Event
	tasks := 0
	for _, e := range all {
		switch {
		case e.Rollout == "fw":
			got = append(got, rolloutLine(e))
		case e.Rollout != "":
			forged = append(forged, e)
		default:
			tasks++
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rollout events\n got %q\nwant %q", got, want)
	}
	for _, typ := range []string{rollout.EventCreated, rollout.EventPaused, rollout.EventResumed, rollout.EventWaveStarted, rollout.EventCancelled} {
		if !strings.Contains(strings.Join(want, "\n"), typ+" ") {
			t.Errorf("the rollout recorded no %s: %q", typ, want)
		}
	}
	if len(p.Types) == 0 && tasks == 0 {
		t.Error("no task event of the device commands beside the rollout's")
	}
	if len(forged) != 1 || forged[0].Type != events.RolloutAborted || forged[0].Rollout != "forged3" ||
		len(forged[0].Message) != 1024 || forged[0].State != "" || forged[0].Wave != 0 {
		t.Errorf("forged documents yielded %q, want forged3's aborted alone, bounded", func() []string {
			var out []string
			for _, e := range forged {
				out = append(out, fmt.Sprintf("%s %s len %d state %q wave %d", e.Type, e.Rollout, len(e.Message), e.State, e.Wave))
			}
			return out
		}())
	}

	for cut := 1; cut < len(all); cut++ {
		p.After = start
		first := follow(t, s, p)
		head := read(t, first, cut)
		_ = first.Close()
		p.After = first.Token()
		rest := follow(t, s, p)
		tail := read(t, rest, len(all)-cut)
		if g := append(head, tail...); !reflect.DeepEqual(g, all) {
			t.Fatalf("cut after %d: got %q, want %q", cut, eventLines(g), eventLines(all))
		}
		quiet(t, rest)
	}

	// Filters: one rollout's events of some types; task filters keep none.
	st := follow(t, s, events.Params{After: start, Rollout: "fw", Types: []string{events.RolloutPaused, events.RolloutResumed, events.Published}})
	if g := eventLines(read(t, st, 2)); !reflect.DeepEqual(g, []string{want[1], want[2]}) {
		t.Errorf("filtered: %q, want %q", g, want[1:3])
	}
	quiet(t, st)
	for _, p := range []events.Params{{After: start, Kinds: []string{"mqtt"}, Rollout: "fw"}, {After: start, Rollout: "nope"}} {
		quiet(t, follow(t, s, p))
	}
}

func eventLines(evs []events.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, rolloutLine(e))
	}
	return out
}

// DeriveRollout reads nothing from documents of other namespaces, nor from
// a document carried without its version.
func TestDeriveRolloutOtherDocuments(t *testing.T) {
	value := []byte(`{"state":"running","events":[{"seq":1,"type":"rollout.created","version":1}]}`)
	if evs := events.DeriveRollout(&task.Document{Namespace: events.RolloutNamespace, ID: "r", Version: 1, Value: value}); len(evs) != 1 {
		t.Fatalf("own namespace: %d events, want 1", len(evs))
	}
	for _, d := range []*task.Document{nil,
		{Namespace: "app", ID: "r", Version: 1, Value: value},
		{Namespace: events.RolloutNamespace, ID: "r", Value: value}} {
		if evs := events.DeriveRollout(d); len(evs) != 0 {
			t.Errorf("%+v: %d events, want none", d, len(evs))
		}
	}
}

// Params that keep rollout events alone follow the document writes alone,
// so MongoDB delivers them even where it names no position for them when
// the stream opens (the wire test server): a rollout's events in order,
// once, none of a task; a resume from any event's token reads the rest;
// such a token does not resume a stream that keeps task events, whose
// task writes since would be skipped.
func TestRolloutEventsAloneMongo(t *testing.T) {
	s := openMongo(t, "lp_revents_alone")
	one := follow(t, s, events.Params{Rollout: "fw"})
	every := follow(t, s, events.Params{Types: events.RolloutTypes})
	want := runRollout(t, s)
	all := drain(t, one)
	if g := eventLines(all); !reflect.DeepEqual(g, want) {
		t.Fatalf("--rollout fw:\n got %q\nwant %q", g, want)
	}
	var got []string
	for _, e := range drain(t, every) {
		if e.Rollout == "" {
			t.Errorf("rollout types only: task event %s", line(e))
		} else if e.Rollout == "fw" {
			got = append(got, rolloutLine(e))
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("rollout types only:\n got %q\nwant %q", got, want)
	}
	if one.TasksOnly() || every.TasksOnly() {
		t.Error("TasksOnly on a stream of rollout events alone")
	}
	for cut := 1; cut < len(all); cut++ {
		rest := follow(t, s, events.Params{Rollout: "fw", After: all[cut-1].Token})
		if g := eventLines(read(t, rest, len(all)-cut)); !reflect.DeepEqual(g, want[cut:]) {
			t.Fatalf("resumed after event %d: got %q, want %q", cut, g, want[cut:])
		}
		quiet(t, rest)
	}
	for _, p := range []events.Params{{After: all[0].Token}, {After: all[0].Token, Kinds: []string{"mqtt"}}} {
		if st, err := events.Follow(context.Background(), s, p); !errors.Is(err, task.ErrInvalid) {
			if err == nil {
				st.Close()
			}
			t.Errorf("%+v: a token of rollout events alone resuming task events: %v, want ErrInvalid", p, err)
		}
	}
}
