package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/rollout"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// setupMongo returns a CLI on a database of its own on the MongoDB test
// server, and a store on it for the test's own writes; the database is
// dropped when t ends.
func setupMongo(t *testing.T) (*harness, *mongostore.Store) {
	t.Helper()
	u, err := url.Parse(testservers.MongoURI(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = fmt.Sprintf("/lp_cli_%d", time.Now().UnixNano())
	c := &harness{t: t, store: u.String()}
	s, err := mongostore.Open(t.Context(), c.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Database().Drop(ctx)
		_ = s.Close()
	})
	return c, s
}

// eventsRun is a `leasepool events` running in the background.
type eventsRun struct {
	t              *testing.T
	stdout, stderr testutil.SyncBuffer
	stop           context.CancelFunc
	done           chan error
}

// startEvents starts `leasepool events ARGS`; stopEvents interrupts it.
func (c *harness) startEvents(args ...string) *eventsRun {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.t.Context())
	r := &eventsRun{t: c.t, stop: cancel, done: make(chan error, 1)}
	go func() {
		app := newApp(&r.stdout, &r.stderr)
		runMu.Lock()
		defer runMu.Unlock()
		r.done <- app.RunContext(ctx, interspersed(app, append([]string{"leasepool", "--store", c.store, "events"}, args...)))
	}()
	c.t.Cleanup(func() { r.stopEvents() })
	return r
}

// stopEvents interrupts the run as SIGINT would and returns its error.
func (r *eventsRun) stopEvents() error {
	r.stop()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(20 * time.Second):
		return fmt.Errorf("events did not stop")
	}
}

// jsonEvent is what the tests read of a line of `events --json`.
type jsonEvent struct {
	Event, Key, Rollout, Token string
	Seq                        int64
}

func (r *eventsRun) events() []jsonEvent {
	r.t.Helper()
	var out []jsonEvent
	for _, l := range strings.Split(r.stdout.String(), "\n") {
		if !strings.HasSuffix(l, "}") {
			continue // not a whole line yet
		}
		var e jsonEvent
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			r.t.Fatalf("%v: %s", err, l)
		}
		out = append(out, e)
	}
	return out
}

// waitFor polls r's lines until ok holds of them, for up to d.
func (r *eventsRun) waitFor(d time.Duration, ok func([]jsonEvent) bool) ([]jsonEvent, bool) {
	r.t.Helper()
	var evs []jsonEvent
	held := testutil.Within(d, func() bool { evs = r.events(); return ok(evs) })
	return evs, held
}

// rolloutSeqs lists the rollout fw's own record of its events from seq on.
func rolloutSeqs(t *testing.T, s task.Store, from int64) []string {
	t.Helper()
	r, err := rollout.Get(t.Context(), s, "fw")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range r.Events {
		if e.Seq >= from {
			out = append(out, fmt.Sprintf("%d %s", e.Seq, e.Type))
		}
	}
	return out
}

func seqLines(evs []jsonEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, fmt.Sprintf("%d %s", e.Seq, e.Event))
	}
	return out
}

// On MongoDB `leasepool events --rollout NAME` follows the rollout's
// events alone, the wire test server included (it names no position for
// rollout documents before their first write): each once, in the order
// the rollout recorded them, and --since resumes after any of them.
func TestEventsOfARolloutMongo(t *testing.T) {
	c, s := setupMongo(t)
	run := c.startEvents("--rollout", "fw", "--json")
	ctx := t.Context()
	if _, err := rollout.Create(ctx, s, "fw", rollout.Spec{Command: "update", Devices: []string{"d1", "d2"}}); err != nil {
		t.Fatal(err)
	}
	// The follower follows from when its stream opens: write until it
	// prints, then the rest must all come.
	for paused := false; ; paused = !paused {
		if _, ok := run.waitFor(300*time.Millisecond, func(evs []jsonEvent) bool { return len(evs) > 0 }); ok {
			break
		}
		op := rollout.Pause
		if paused {
			op = rollout.Resume
		}
		if _, err := op(ctx, s, "fw"); err != nil {
			t.Fatal(err)
		}
		if len(rolloutSeqs(t, s, 0)) > 40 {
			t.Fatalf("no event printed after %d rollout writes (stderr %s)", len(rolloutSeqs(t, s, 0)), run.stderr.String())
		}
	}
	if _, err := rollout.Cancel(ctx, s, "fw"); err != nil {
		t.Fatal(err)
	}
	// A driver steps the cancel through, as `leasepool worker` would.
	stepper := rollout.NewStepper(s)
	for i := 0; ; i++ {
		if err := stepper.Step(ctx, "fw"); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		r, err := rollout.Get(ctx, s, "fw")
		if err != nil {
			t.Fatal(err)
		}
		if r.State == rollout.StateCancelled {
			break
		}
		if i == 50 {
			t.Fatalf("rollout %s after 50 steps, want cancelled", r.State)
		}
	}
	first := run.events()[0].Seq
	want := rolloutSeqs(t, s, first)
	evs, ok := run.waitFor(20*time.Second, func(evs []jsonEvent) bool { return len(evs) >= len(want) })
	if !ok || !slices.Equal(seqLines(evs), want) || want[len(want)-1] != fmt.Sprintf("%d %s", first+int64(len(want))-1, rollout.EventCancelled) {
		t.Fatalf("printed %q, want the rollout's record from its first printed event, ending cancelled: %q (stderr %s)",
			seqLines(evs), want, run.stderr.String())
	}
	for _, e := range evs {
		if e.Rollout != "fw" || e.Key != "" || e.Token == "" {
			t.Errorf("line %+v: want rollout fw's, with a token", e)
		}
	}
	if err := run.stopEvents(); err != nil {
		t.Fatalf("events: %v (stderr %s)", err, run.stderr.String())
	}
	if got := run.events(); len(got) != len(want) {
		t.Errorf("printed %q after the last event, want %q", seqLines(got), want)
	}

	resumed := c.startEvents("--rollout", "fw", "--json", "--since", evs[0].Token)
	rest, ok := resumed.waitFor(20*time.Second, func(got []jsonEvent) bool { return len(got) >= len(want)-1 })
	if !ok || !slices.Equal(rest, evs[1:]) {
		t.Errorf("resumed after the first event: %q, want %q", seqLines(rest), seqLines(evs[1:]))
	}
	if err := resumed.stopEvents(); err != nil {
		t.Fatalf("events --since: %v (stderr %s)", err, resumed.stderr.String())
	}
	// The token of rollout events alone does not resume task events too,
	// whose writes since it would skip.
	if _, err := c.run("events", "--since", evs[0].Token); err == nil || exitStatus(err) != exitBadInput {
		t.Errorf("events --since a rollout-alone token: %v, want a bad-input error", err)
	}
}

// With no filter, a server that names no position for rollout documents
// when the stream opens (the wire test server) gets task events and one
// warning line on stderr that rollout events are left out; a server that
// names one gets both and no warning.
func TestEventsWarnsWithoutRolloutsMongo(t *testing.T) {
	c, s := setupMongo(t)
	run := c.startEvents("--json")
	ctx := t.Context()
	for i := 0; ; i++ {
		if _, ok := run.waitFor(300*time.Millisecond, func(evs []jsonEvent) bool { return len(evs) > 0 }); ok {
			break
		}
		if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: fmt.Sprint("probe-", i), Kind: "noop"}); err != nil {
			t.Fatal(err)
		}
		if i > 40 {
			t.Fatalf("no event printed after %d publishes (stderr %s)", i, run.stderr.String())
		}
	}
	if _, err := rollout.Create(ctx, s, "fw", rollout.Spec{Command: "update", Devices: []string{"d1"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := task.Publish(ctx, s, task.PublishParams{Key: "after", Kind: "noop"}); err != nil {
		t.Fatal(err)
	}
	warned := strings.Contains(run.stderr.String(), "rollout events are left out")
	evs, ok := run.waitFor(20*time.Second, func(evs []jsonEvent) bool {
		return slices.ContainsFunc(evs, func(e jsonEvent) bool { return e.Key == "after" }) &&
			(warned || slices.ContainsFunc(evs, func(e jsonEvent) bool { return e.Event == rollout.EventCreated }))
	})
	if !ok {
		t.Fatalf("warned %v: printed %q", warned, seqLines(evs))
	}
	if err := run.stopEvents(); err != nil {
		t.Fatalf("events: %v (stderr %s)", err, run.stderr.String())
	}
	if stderr := strings.TrimSuffix(run.stderr.String(), "\n"); warned && strings.Contains(stderr, "\n") {
		t.Errorf("stderr holds more than the warning's line:\n%s", stderr)
	}
	if rollouts := slices.ContainsFunc(run.events(), func(e jsonEvent) bool { return e.Rollout != "" }); warned && rollouts {
		t.Errorf("warned that rollout events are left out, and printed one")
	}
	t.Logf("warned (the server names no position for rollout documents): %v", warned)
}
