package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// show prints created/updated times and every attempt: snoozed, failed,
// cancelled, with worker, instance, error, result and log lines; --json
// carries the same history.
func TestShowPrintsAttemptHistory(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "h1", "--kind", "noop")
	writeHistory(t, c.path, "h1")

	out := c.must("show", "h1")
	for _, want := range []string{
		"created", "updated", "3 attempt(s):",
		"attempt 1  w1  SNOOZED  instance i1", "log ", "waiting for device",
		"attempt 2  w2  FAIL", "error: boom", "    second line", `result: {"partial":true}`,
		"attempt 3  w1  CANCELLED", "error: task cancelled", "lease until",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("show printed a control character from a handler's error:\n%q", out)
	}

	var doc task.Task
	if err := json.Unmarshal([]byte(c.must("show", "h1", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	all := doc.AttemptHistory()
	var result bytes.Buffer
	if len(all) == 3 {
		_ = json.Compact(&result, all[1].Result)
	}
	if len(all) != 3 || all[0].State != task.WorkerSnoozed || all[1].Log[0].Msg != "try 2" || result.String() != `{"partial":true}` || doc.CreatedAt.IsZero() {
		t.Errorf("show --json history: %+v", all)
	}
}

// writeHistory runs three attempts of key through the task mutations, as
// workers would: snoozed, failed (with a result and a two-line error
// carrying an escape sequence), and one running when the task is cancelled.
func writeHistory(t *testing.T, path, key string) {
	t.Helper()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	step := func(fn func(tk *task.Task) error) {
		t.Helper()
		if _, err := task.Modify(ctx, s, key, fn); err != nil {
			t.Fatal(err)
		}
	}
	var h task.Holder
	claim := func(id string) {
		step(func(tk *task.Task) error {
			h = tk.Claim(task.Holder{WorkerID: id, Instance: "i" + id[1:]}, s.Now())
			return nil
		})
	}
	claim("w1")
	step(func(tk *task.Task) error {
		tk.Record(h, task.Output{Log: []task.LogLine{{At: s.Now(), Msg: "waiting for device"}}})
		return tk.Snooze(h, s.Now(), s.Now())
	})
	claim("w2")
	step(func(tk *task.Task) error {
		tk.Record(h, task.Output{Result: json.RawMessage(`{"partial":true}`), Log: []task.LogLine{{At: s.Now(), Msg: "try 2"}}})
		return tk.Fail(h, "boom \x1b[31m\nsecond line", s.Now(), s.Now())
	})
	claim("w1")
	step(func(tk *task.Task) error { return tk.Cancel(s.Now()) })
}

// show says what a pending task waits for: a command for a device stored
// offline waits for the device, with no made-up time; once the device is
// stored online, the same command waits for nothing but a worker.
func TestShowSaysWhatAPendingTaskWaitsFor(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "cmd-1", "--kind", "device", "--payload", `{"device":"pump-7","command":"reboot"}`)
	putState := func(online bool) {
		t.Helper()
		s, err := sqlitestore.Open(t.Context(), c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		now := time.Now().UTC()
		if err := mqttdev.StoreStates(s).PutDeviceState(t.Context(), mqttdev.DeviceState{ID: "pump-7", Online: online, At: now, SeenAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	putState(false)
	if out := c.must("show", "cmd-1"); !regexp.MustCompile(`(?m)^waiting +device offline$`).MatchString(out) {
		t.Errorf("show of a command for an offline device:\n%s", out)
	}
	putState(true)
	if out := c.must("show", "cmd-1"); !regexp.MustCompile(`(?m)^waiting +no live worker for kind "device"$`).MatchString(out) {
		t.Errorf("show of a command for an online device, no worker running:\n%s", out)
	}
}
