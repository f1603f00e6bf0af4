package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// follow runs `leasepool events ARGS` until it has printed want lines,
// then interrupts it as SIGINT would and returns the lines.
func (c *harness) follow(want int, args ...string) []string {
	c.t.Helper()
	ctx, cancel := context.WithCancel(c.t.Context())
	defer cancel()
	var stdout, stderr testutil.SyncBuffer
	done := make(chan error, 1)
	go func() {
		app := newApp(&stdout, &stderr)
		runMu.Lock()
		defer runMu.Unlock()
		done <- app.RunContext(ctx, interspersed(app, append([]string{"leasepool", "--store", c.store, "events"}, args...)))
	}()
	printed := func() int { return strings.Count(stdout.String(), "\n") }
	if testutil.Within(20*time.Second, func() bool { return printed() >= want }) {
		// Time to print a line too many: the window is the point.
		testutil.Consistently(c.t, 200*time.Millisecond, fmt.Sprintf("no more than %d lines", want), func() bool { return printed() <= want })
	}
	cancel()
	if err := <-done; err != nil {
		c.t.Fatalf("events %v: %v (stderr %s)", args, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if len(lines) != want {
		c.t.Fatalf("events %v printed %d lines, want %d:\n%s", args, len(lines), want, stdout.String())
	}
	return lines
}

func TestEventsJSONSince(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "e1", "--kind", "noop")
	c.must("cancel", "e1")
	c.must("publish", "e2", "--kind", "sleep")

	// "MA" is the embedded store's change 0 in base64url: from the start.
	var evs []struct {
		Event, Key, Kind, State, Token string
	}
	for _, l := range c.follow(3, "--json", "--since", "MA") {
		var e struct{ Event, Key, Kind, State, Token string }
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("%v: %s", err, l)
		}
		evs = append(evs, e)
	}
	want := []string{"published e1 noop pending", "cancelled e1 noop cancelled", "published e2 sleep pending"}
	for i, e := range evs {
		if got := strings.Join([]string{e.Event, e.Key, e.Kind, e.State}, " "); got != want[i] || e.Token == "" {
			t.Errorf("event %d = %q token %q, want %q with a token", i, got, e.Token, want[i])
		}
	}
	// Resuming after the first event gives exactly the rest.
	rest := c.follow(2, "--json", "--since", evs[0].Token)
	if !strings.Contains(rest[0], `"event":"cancelled"`) || !strings.Contains(rest[1], `"key":"e2"`) {
		t.Errorf("resumed: %q", rest)
	}
	// Text lines and filters.
	if l := c.follow(1, "--since", "MA", "--kind", "sleep"); !strings.Contains(l[0], "published e2 - - pending") {
		t.Errorf("text line %q", l[0])
	}
	if l := c.follow(1, "--since", "MA", "--key", "e1", "--event", "cancelled"); !strings.Contains(l[0], "cancelled e1") {
		t.Errorf("text line %q", l[0])
	}
}

func TestEventsBadInput(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "e1", "--kind", "noop")
	for _, args := range [][]string{{"events", "--since", "!!"}, {"events", "--event", "nope"}} {
		_, err := c.run(args...)
		if err == nil || exitStatus(err) != exitBadInput {
			t.Errorf("%v: %v, want a bad-input error", args, err)
		}
		var ue *usageError
		if errors.As(err, &ue) == false && !errors.Is(err, task.ErrInvalid) {
			t.Errorf("%v: %v", args, err)
		}
	}
}
