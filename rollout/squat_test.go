package rollout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/mongostore"
)

// squat publishes a device task under key, as anyone with the store can.
func squat(t *testing.T, st task.Store, key string, c mqttdev.Command, opts task.Options) {
	t.Helper()
	p, err := mqttdev.PublishParams(key, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, res, err := task.Publish(context.Background(), st, p); err != nil || res != task.Inserted {
		t.Fatalf("squat %s: %s %v", key, res, err)
	}
}

// A task published under a key of a rollout not yet created refuses the
// name: nothing is written, the task is left as it is.
func TestSquatBeforeCreateRefusesTheName(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	key := TaskKey("sq1", "dev-002", 1)
	squat(t, st, key, mqttdev.Command{Device: "dev-002", Command: "update", Args: json.RawMessage(`{"version":"evil-0.0"}`)}, task.Options{})
	_, err := Create(ctx, st, "sq1", Spec{Command: "update", Args: json.RawMessage(`{"version":"2.0"}`), Devices: devices(4)})
	if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), key) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("create over a squatted key: %v, want ErrExists naming %s", err, key)
	}
	if _, err := st.GetDocument(ctx, Namespace, "sq1"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("the refused create wrote the rollout: %v", err)
	}
	if tk, err := st.Get(ctx, key); err != nil || tk.Version != 1 {
		t.Fatalf("the squatting task: %+v %v", tk, err)
	}
	// Another name is free.
	if _, err := Create(ctx, st, "sq1b", Spec{Command: "update", Devices: devices(4)}); err != nil {
		t.Fatal(err)
	}
}

// Tasks published under a rollout's keys after its create are adopted
// only when they are exactly what it would send; any other is recorded
// as the device's failure, naming why, and never counted a success, even
// when it ran and succeeded.
func TestSquattingTasksAreRefusedUnlessExactlyTheRollouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	f := newFleet(t, st, 1, nil, nil, time.Millisecond)
	spec := Spec{Command: "update", Args: json.RawMessage(`{"version":"2.0"}`), Devices: devices(6), Timeout: task.Duration(30 * time.Second)}
	if _, err := Create(ctx, st, "sq2", spec); err != nil {
		t.Fatal(err)
	}
	own := task.Options{MaxUnexpectedRetries: task.NoRetries}
	later := task.Options{MaxUnexpectedRetries: task.NoRetries, RunAt: st.Now().Add(time.Hour)}
	evil := spec.command("dev-001", false)
	evil.Args = json.RawMessage(`{"version":"evil-0.0"}`)
	squat(t, st, TaskKey("sq2", "dev-001", 1), evil, own)
	slow := spec.command("dev-002", false)
	slow.ResultTimeout = task.Duration(time.Hour)
	squat(t, st, TaskKey("sq2", "dev-002", 1), slow, later)
	squat(t, st, TaskKey("sq2", "dev-003", 1), mqttdev.Command{Device: "dev-009", Command: "wipe"}, later)
	// The same command, args spelt otherwise: what the rollout sends.
	same := spec.command("dev-004", false)
	same.Args = json.RawMessage(`{ "version" : "\u0032.0" }`)
	squat(t, st, TaskKey("sq2", "dev-004", 1), same, own)
	squat(t, st, TaskKey("sq2", "dev-005", 1), spec.command("dev-005", false), task.Options{RunAt: later.RunAt})
	// The evil one runs, and succeeds, before the rollout's first step.
	testutil.Eventually(t, 10*time.Second, "the evil squat ran", func() bool {
		tk, err := st.Get(ctx, TaskKey("sq2", "dev-001", 1))
		return err == nil && tk.State == task.StateSucceeded
	})

	r := drive(t, NewStepper(st), "sq2", 30*time.Second)
	want := map[string]string{"dev-001": "its args differ", "dev-002": "its timeouts differ", "dev-003": `it is for device "dev-009"`,
		"dev-005": "it may run more than once"}
	for _, e := range r.Devices {
		why, squatted := want[e.Device]
		switch {
		case squatted && (e.Outcome != OutcomeFailed || !strings.Contains(e.Error, why) || !strings.Contains(e.Error, "not this rollout's")):
			t.Errorf("%s: %s %q, want failed saying %q", e.Device, e.Outcome, e.Error, why)
		case !squatted && e.Outcome != OutcomeSucceeded:
			t.Errorf("%s: %s %q, want succeeded", e.Device, e.Outcome, e.Error)
		}
	}
	if p := r.Progress(); p.Total.Succeeded != 2 || p.Total.Failed != 4 {
		t.Fatalf("progress %+v, want the 2 of its own succeeded", p.Total)
	}
	for _, run := range f.ran() {
		if run.command == "wipe" || run.device == "dev-009" {
			t.Fatalf("the foreign task ran: %+v", run)
		}
	}
}

// The exact command under a rollout's key, but pinned to a worker that
// never comes, held back a year, or at another priority, would never run
// (or run after everything else) and hold its wave open: each is refused,
// naming why, and the rollout completes.
func TestSquatsThatWouldNeverRunAreRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := openStore(t)
	newFleet(t, st, 1, nil, nil, time.Millisecond)
	spec := Spec{Command: "update", Args: json.RawMessage(`{"version":"2.0"}`), Devices: devices(4), Priority: 5}
	if _, err := Create(ctx, st, "sq3", spec); err != nil {
		t.Fatal(err)
	}
	own := task.Options{MaxUnexpectedRetries: task.NoRetries, Priority: 5}
	pinned := own
	pinned.SpecificWorkerIDs = []string{"nowhere"}
	squat(t, st, TaskKey("sq3", "dev-000", 1), spec.command("dev-000", false), pinned)
	later := own
	later.RunAt = st.Now().Add(365 * 24 * time.Hour)
	squat(t, st, TaskKey("sq3", "dev-001", 1), spec.command("dev-001", false), later)
	lower := own
	lower.Priority = -1000
	squat(t, st, TaskKey("sq3", "dev-002", 1), spec.command("dev-002", false), lower)

	r := drive(t, NewStepper(st), "sq3", 20*time.Second)
	want := map[string]string{"dev-000": `it is pinned to workers ["nowhere"]`, "dev-001": "it runs at", "dev-002": "its priority is -1000, not the rollout's 5"}
	for _, e := range r.Devices {
		why, squatted := want[e.Device]
		switch {
		case squatted && (e.Outcome != OutcomeFailed || !strings.Contains(e.Error, why) || !strings.Contains(e.Error, "not this rollout's")):
			t.Errorf("%s: %s %q, want failed saying %q", e.Device, e.Outcome, e.Error, why)
		case !squatted && e.Outcome != OutcomeSucceeded:
			t.Errorf("%s: %s %q, want succeeded", e.Device, e.Outcome, e.Error)
		}
	}
	if r.State != StateCompleted {
		t.Fatalf("state %s, want completed", r.State)
	}
}

func TestSameJSON(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{`{"a":1}`, `{ "a" : 1.0 }`, true},
		{`{"a":"<"}`, `{"a":"\u003c"}`, true},
		{`{"a":-0}`, `{"a":0}`, true},
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`, false},
		{`{"a":"2.0"}`, `{"a":"evil"}`, false},
		{`{"a":"x","a":"y"}`, `{"a":"y"}`, false},
		{``, `{}`, false},
		{``, ``, true},
	} {
		if got := sameJSON(json.RawMessage(c.a), json.RawMessage(c.b)); got != c.same {
			t.Errorf("sameJSON(%s, %s) = %v", c.a, c.b, got)
		}
	}
}

// On MongoDB a task's payload comes back re-encoded (1.0 as 1, escapes
// undone): the rollout still knows its own tasks, and still refuses a
// squatter's.
func TestOwnTasksKnownAfterAMongoRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	uri := testservers.MongoURI(t)
	st, err := mongostore.Open(ctx, uri, &mongostore.Config{Database: "rollout_" + strconv.FormatInt(time.Now().UnixNano(), 36)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = st.Database().Drop(context.Background())
		st.Close()
	})
	newFleet(t, st, 1, nil, nil, time.Millisecond)
	args := json.RawMessage(`{"v":1.0,"big":12345678901234567890,"s":"<&>\u00e9","n":[1.50,{"x":-0}]}`)
	spec := Spec{Command: "update", Args: args, Devices: devices(3)}
	if _, err := Create(ctx, st, "mongo", spec); err != nil {
		t.Fatal(err)
	}
	evil := spec.command("dev-002", false)
	evil.Args = json.RawMessage(`{"v":1.0,"big":12345678901234567890,"s":"<&>\u00e9","n":[1.50,{"x":-1}]}`)
	squat(t, st, TaskKey("mongo", "dev-002", 1), evil, task.Options{MaxUnexpectedRetries: task.NoRetries, RunAt: st.Now().Add(time.Hour)})
	r := drive(t, NewStepper(st), "mongo", time.Minute)
	if p := r.Progress(); p.Total.Succeeded != 2 || r.Devices[2].Outcome != OutcomeFailed || !strings.Contains(r.Devices[2].Error, "args differ") {
		t.Fatalf("%+v, dev-002 %+v", p.Total, r.Devices[2])
	}
	tk, err := st.Get(ctx, TaskKey("mongo", "dev-000", 1))
	if err != nil {
		t.Fatal(err)
	}
	p, err := publishParams(r, "dev-000", tk.Key, false)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(tk.Payload, p.Payload) {
		t.Fatalf("the stored payload is the published one byte for byte: the test proves nothing\n%s", tk.Payload)
	}
}
