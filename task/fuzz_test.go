package task_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func FuzzTaskJSON(f *testing.F) {
	tk, _ := task.NewTask(task.PublishParams{Key: "k", Kind: "exec", Payload: json.RawMessage(`{"argv":["true"]}`),
		Options: task.Options{SpecificWorkerIDs: []string{"a"}, LockKeys: []string{"device:1"}}}, t0)
	tk.Attempts = append(tk.Attempts, running("a", 1, t0.Add(time.Second)), ended("b", 2, task.AttemptFail))
	seed, _ := json.Marshal(tk)
	f.Add(seed)
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"payload":null,"ping_interval":1000,"worker_timeout":"-3h"}`))
	f.Add([]byte(`{"workers":[{"lease_until":"2030-01-01T00:00:00+05:30"}],"run_at":"0001-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"ping_interval":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var t1 task.Task
		if err := json.Unmarshal(b, &t1); err != nil {
			return
		}
		b1, err := json.Marshal(&t1)
		if err != nil {
			t.Fatalf("re-marshal of %q: %v", b, err)
		}
		var t2 task.Task
		if err := json.Unmarshal(b1, &t2); err != nil {
			t.Fatalf("unmarshal own output %s: %v", b1, err)
		}
		b2, err := json.Marshal(&t2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("not stable:\n%s\n%s", b1, b2)
		}
		// Derived logic must not panic on any document.
		c := t2.Clone()
		c.Recompute(t0)
		c.CountWorkers(t0)
		c.Reap(t0)
	})
}

func FuzzValidate(f *testing.F) {
	for _, s := range []string{``, `{}`, `null`, `[1,2]`, `{"argv":["echo","hi"]}`, `{`, `"x"`, "\xff", ` {} `, `{"a":1}{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		p := task.PublishParams{Key: "k", Kind: "noop", Payload: payload}
		err := p.Validate()
		if err != nil {
			if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "payload") {
				t.Fatalf("Validate(%q) = %v, want ErrInvalid naming payload", payload, err)
			}
			if json.Valid(payload) {
				t.Fatalf("valid JSON %q refused: %v", payload, err)
			}
			return
		}
		tk, err := task.NewTask(p, t0)
		if err != nil {
			t.Fatal(err)
		}
		if !json.Valid(tk.Payload) {
			t.Fatalf("accepted invalid JSON %q", payload)
		}
		b, err := json.Marshal(tk)
		if err != nil {
			t.Fatalf("marshal task with payload %q: %v", payload, err)
		}
		var back task.Task
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
	})
}
