package task_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// runningDoc is a task at t0 held by worker "a" attempt 1 until t0+4s.
func runningDoc(t *testing.T, edit func(p *task.PublishParams)) *task.Task {
	t.Helper()
	return doc(t, edit, running("a", 1, t0.Add(4*time.Second)))
}

func TestRenew(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	t.Run("extends lease in UTC", func(t *testing.T) {
		tk := runningDoc(t, nil)
		if err := tk.Renew(task.Holder{WorkerID: "a", Attempt: 1}, now.In(time.FixedZone("x", 7200))); err != nil {
			t.Fatal(err)
		}
		w := tk.Attempts[0]
		if !w.LeaseUntil.Equal(now.Add(4*time.Second)) || w.LeaseUntil.Location() != time.UTC {
			t.Errorf("lease_until = %s, want %s UTC", w.LeaseUntil, now.Add(4*time.Second))
		}
		if !tk.NextClaimAt.Equal(w.LeaseUntil) || !tk.UpdatedAt.Equal(now) {
			t.Errorf("next_claim_at %s updated_at %s", tk.NextClaimAt, tk.UpdatedAt)
		}
	})
	t.Run("an expired lease is lost even before a peer takes it", func(t *testing.T) {
		tk := runningDoc(t, nil)
		late := t0.Add(10 * time.Second)
		before := tk.Clone()
		if err := tk.Renew(task.Holder{WorkerID: "a", Attempt: 1}, late); !errors.Is(err, task.ErrLeaseLost) {
			t.Fatalf("Renew after expiry: %v, want ErrLeaseLost", err)
		}
		if err := tk.Succeed(task.Holder{WorkerID: "a", Attempt: 1}, late); !errors.Is(err, task.ErrLeaseLost) {
			t.Fatalf("Finish after expiry: %v, want ErrLeaseLost", err)
		}
		if !reflect.DeepEqual(tk, before) {
			t.Error("a refused write changed the task")
		}
	})
	tests := []struct {
		name    string
		setup   func(tk *task.Task)
		worker  string
		attempt int
		want    error
	}{
		{"other worker", nil, "b", 1, task.ErrLeaseLost},
		{"other attempt", nil, "a", 2, task.ErrLeaseLost},
		{"finished entry", func(tk *task.Task) { tk.Attempts[0].State = task.AttemptFail }, "a", 1, task.ErrLeaseLost},
		{"cancelled", func(tk *task.Task) { tk.Cancelled = true }, "a", 1, task.ErrCancelled},
		{"unpinned", func(tk *task.Task) { tk.SpecificWorkerIDs = []string{"b"} }, "a", 1, task.ErrUnpinned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := runningDoc(t, nil)
			if tt.setup != nil {
				tt.setup(tk)
			}
			before := tk.Clone()
			err := tk.Renew(task.Holder{WorkerID: tt.worker, Attempt: tt.attempt}, now)
			if !errors.Is(err, tt.want) || !errors.Is(err, task.ErrLeaseLost) {
				t.Fatalf("Renew = %v, want %v (wrapping ErrLeaseLost)", err, tt.want)
			}
			if !tk.Attempts[0].LeaseUntil.Equal(before.Attempts[0].LeaseUntil) {
				t.Error("refused Renew changed the lease")
			}
		})
	}
}

func TestFinish(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	t.Run("success", func(t *testing.T) {
		tk := runningDoc(t, nil)
		if err := tk.Succeed(task.Holder{WorkerID: "a", Attempt: 1}, now); err != nil {
			t.Fatal(err)
		}
		if w := tk.Attempts[0]; w.State != task.AttemptSuccess || !w.EndedAt.Equal(now) || w.Error != "" {
			t.Errorf("worker = %+v", w)
		}
		if tk.State != task.StateSucceeded || !tk.NextClaimAt.IsZero() {
			t.Errorf("state %s next %s", tk.State, tk.NextClaimAt)
		}
	})
	t.Run("failure within retries", func(t *testing.T) {
		tk := runningDoc(t, nil)
		if err := tk.Fail(task.Holder{WorkerID: "a", Attempt: 1}, "boom", time.Time{}, now); err != nil {
			t.Fatal(err)
		}
		if w := tk.Attempts[0]; w.State != task.AttemptFail || w.Error != "boom" {
			t.Errorf("worker = %+v", w)
		}
		if tk.State != task.StatePending || !tk.NextClaimAt.Equal(t0) {
			t.Errorf("state %s next %s", tk.State, tk.NextClaimAt)
		}
	})
	t.Run("failure with no retries fails the task", func(t *testing.T) {
		tk := runningDoc(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries })
		if err := tk.Fail(task.Holder{WorkerID: "a", Attempt: 1}, "boom", time.Time{}, now); err != nil {
			t.Fatal(err)
		}
		if tk.State != task.StateFailed {
			t.Errorf("state %s", tk.State)
		}
	})
	t.Run("refused twice", func(t *testing.T) {
		tk := runningDoc(t, nil)
		if err := tk.Succeed(task.Holder{WorkerID: "a", Attempt: 1}, now); err != nil {
			t.Fatal(err)
		}
		if err := tk.Fail(task.Holder{WorkerID: "a", Attempt: 1}, "late", time.Time{}, now); !errors.Is(err, task.ErrLeaseLost) {
			t.Errorf("second Finish = %v, want ErrLeaseLost", err)
		}
		if tk.Attempts[0].State != task.AttemptSuccess {
			t.Error("second Finish changed the entry")
		}
	})
	t.Run("refused for stale attempt", func(t *testing.T) {
		tk := runningDoc(t, nil)
		if err := tk.Succeed(task.Holder{WorkerID: "a", Attempt: 7}, now); !errors.Is(err, task.ErrLeaseLost) {
			t.Errorf("Finish = %v, want ErrLeaseLost", err)
		}
	})
	t.Run("refused when cancelled", func(t *testing.T) {
		tk := runningDoc(t, nil)
		if err := tk.Cancel(now); err != nil {
			t.Fatal(err)
		}
		if err := tk.Succeed(task.Holder{WorkerID: "a", Attempt: 1}, now); !errors.Is(err, task.ErrCancelled) {
			t.Errorf("Finish = %v, want ErrCancelled", err)
		}
	})
}

func TestRelease(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	tk := runningDoc(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries })
	tk.AttemptsStarted = 1
	if err := tk.Release(task.Holder{WorkerID: "a", Attempt: 1}, now); err != nil {
		t.Fatal(err)
	}
	if len(tk.Attempts) != 0 || tk.State != task.StatePending || !tk.NextClaimAt.Equal(t0) {
		t.Errorf("workers %v state %s next %s", tk.Attempts, tk.State, tk.NextClaimAt)
	}
	if tk.AttemptsStarted != 1 {
		t.Errorf("attempts = %d, want 1 (fencing token kept)", tk.AttemptsStarted)
	}
	if err := tk.Release(task.Holder{WorkerID: "a", Attempt: 1}, now); !errors.Is(err, task.ErrLeaseLost) {
		t.Errorf("second Release = %v, want ErrLeaseLost", err)
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	for _, tk := range []*task.Task{doc(t, nil), runningDoc(t, nil)} {
		if err := tk.Cancel(now); err != nil {
			t.Fatal(err)
		}
		if !tk.Cancelled || tk.State != task.StateCancelled || !tk.NextClaimAt.IsZero() {
			t.Errorf("cancelled %v state %s next %s", tk.Cancelled, tk.State, tk.NextClaimAt)
		}
		if err := tk.Cancel(now); !errors.Is(err, task.ErrFinished) {
			t.Errorf("second Cancel = %v, want ErrFinished", err)
		}
	}
	done := doc(t, nil, ended("a", 1, task.AttemptSuccess))
	if err := done.Cancel(now); !errors.Is(err, task.ErrFinished) {
		t.Errorf("Cancel of succeeded = %v, want ErrFinished", err)
	}
	if done.Cancelled || done.State != task.StateSucceeded {
		t.Error("refused Cancel changed the task")
	}
}

func TestReset(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Minute)
	finished := map[string]*task.Task{
		"succeeded": doc(t, nil, ended("a", 1, task.AttemptSuccess)),
		"failed":    doc(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries }, ended("a", 1, task.AttemptFail)),
		"cancelled": func() *task.Task { tk := runningDoc(t, nil); _ = tk.Cancel(t0); return tk }(),
	}
	for name, tk := range finished {
		t.Run(name, func(t *testing.T) {
			attempts := tk.AttemptsStarted
			if err := tk.Reset(now); err != nil {
				t.Fatal(err)
			}
			if len(tk.Attempts) != 0 || tk.Attempts == nil || tk.Cancelled || tk.State != task.StatePending {
				t.Errorf("workers %v cancelled %v state %s", tk.Attempts, tk.Cancelled, tk.State)
			}
			if !tk.RunAt.Equal(now) || !tk.NextClaimAt.Equal(now) {
				t.Errorf("run_at %s next %s, want %s", tk.RunAt, tk.NextClaimAt, now)
			}
			if tk.AttemptsStarted != attempts {
				t.Errorf("attempts %d, want %d kept", tk.AttemptsStarted, attempts)
			}
		})
	}
	t.Run("future run_at kept", func(t *testing.T) {
		tk := doc(t, func(p *task.PublishParams) { p.RunAt = t0.Add(time.Hour) }, ended("a", 1, task.AttemptSuccess))
		if err := tk.Reset(now); err != nil {
			t.Fatal(err)
		}
		if !tk.RunAt.Equal(t0.Add(time.Hour)) {
			t.Errorf("run_at %s", tk.RunAt)
		}
	})
	for name, tk := range map[string]*task.Task{"pending": doc(t, nil), "running": runningDoc(t, nil)} {
		t.Run("refused "+name, func(t *testing.T) {
			n := len(tk.Attempts)
			if err := tk.Reset(now); !errors.Is(err, task.ErrNotFinished) {
				t.Errorf("Reset = %v, want ErrNotFinished", err)
			}
			if len(tk.Attempts) != n {
				t.Error("refused Reset changed the workers")
			}
		})
	}
}

func TestSnooze(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	until := t0.Add(time.Minute)
	tk := runningDoc(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries })
	if err := tk.Snooze(task.Holder{WorkerID: "a", Attempt: 1}, until, now); err != nil {
		t.Fatal(err)
	}
	if len(tk.Attempts) != 0 || tk.State != task.StatePending {
		t.Errorf("workers %v state %s", tk.Attempts, tk.State)
	}
	if !tk.RunAt.Equal(until) || !tk.NextClaimAt.Equal(until) {
		t.Errorf("run_at %s next %s, want %s", tk.RunAt, tk.NextClaimAt, until)
	}
	if err := tk.Snooze(task.Holder{WorkerID: "a", Attempt: 1}, until, now); !errors.Is(err, task.ErrLeaseLost) {
		t.Errorf("second Snooze = %v, want ErrLeaseLost", err)
	}

	// An earlier until does not pull run_at back.
	tk = runningDoc(t, func(p *task.PublishParams) { p.RunAt = t0.Add(time.Hour) })
	tk.Attempts[0].LeaseUntil = t0.Add(2 * time.Hour)
	if err := tk.Snooze(task.Holder{WorkerID: "a", Attempt: 1}, t0.Add(time.Minute), now); err != nil {
		t.Fatal(err)
	}
	if !tk.RunAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("run_at %s, want kept", tk.RunAt)
	}
}

func TestUnpin(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	tk := runningDoc(t, func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{"a", "b"} })
	if tk.Unpin(task.Holder{WorkerID: "a", Attempt: 1}, now) {
		t.Error("Unpin removed a worker still pinned")
	}
	tk.SpecificWorkerIDs = []string{"b"}
	if tk.Unpin(task.Holder{WorkerID: "a", Attempt: 2}, now) {
		t.Error("Unpin removed another attempt")
	}
	if !tk.Unpin(task.Holder{WorkerID: "a", Attempt: 1}, now) {
		t.Fatal("Unpin of an unpinned RUNNING worker did nothing")
	}
	if len(tk.Attempts) != 0 || tk.State != task.StatePending || !tk.NextClaimAt.Equal(t0) {
		t.Errorf("workers %v state %s next %s", tk.Attempts, tk.State, tk.NextClaimAt)
	}
	if tk.Unpin(task.Holder{WorkerID: "a", Attempt: 1}, now) {
		t.Error("second Unpin reported a change")
	}
	// A finished entry is history, not removed.
	tk = doc(t, func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 2, 2 }, ended("a", 1, task.AttemptSuccess))
	tk.SpecificWorkerIDs = []string{"b"}
	if tk.Unpin(task.Holder{WorkerID: "a", Attempt: 1}, now) {
		t.Error("Unpin removed a finished entry")
	}
}

func TestReap(t *testing.T) {
	t.Parallel()
	now := t0.Add(3 * time.Second)
	tk := doc(t, func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.MaxUnexpectedRetries = 3, 1 },
		running("a", 1, t0.Add(time.Second)), running("b", 2, now), running("c", 3, now.Add(time.Nanosecond)))
	if n := tk.Reap(now); n != 2 {
		t.Fatalf("Reap = %d, want 2", n)
	}
	for i, want := range []task.AttemptState{task.AttemptExpired, task.AttemptExpired, task.AttemptRunning} {
		w := tk.Attempts[i]
		if w.State != want {
			t.Errorf("worker %s state %s, want %s", w.WorkerID, w.State, want)
		}
		if want == task.AttemptExpired && (!w.EndedAt.Equal(now) || w.Error == "") {
			t.Errorf("worker %s ended %s error %q", w.WorkerID, w.EndedAt, w.Error)
		}
	}
	if tk.State != task.StateFailed {
		t.Errorf("state %s, want failed (2 expired > 1 retry)", tk.State)
	}
	v := tk.UpdatedAt
	if n := tk.Reap(now); n != 0 || !tk.UpdatedAt.Equal(v) {
		t.Errorf("second Reap = %d", n)
	}
}

func TestEntryAndAllows(t *testing.T) {
	t.Parallel()
	tk := doc(t, nil, ended("a", 1, task.AttemptFail), running("a", 2, t0.Add(time.Second)))
	if i := tk.Entry(task.Holder{WorkerID: "a", Attempt: 2}); i != 1 {
		t.Errorf("Entry(a,2) = %d", i)
	}
	if i := tk.Entry(task.Holder{WorkerID: "a", Attempt: 3}); i != -1 {
		t.Errorf("Entry(a,3) = %d", i)
	}
	if !tk.Allows("anyone") {
		t.Error("unpinned task refuses a worker")
	}
	tk.SpecificWorkerIDs = []string{"x"}
	if tk.Allows("anyone") || !tk.Allows("x") {
		t.Error("pins not applied")
	}
}

func TestCloneIsDeep(t *testing.T) {
	t.Parallel()
	tk := doc(t, func(p *task.PublishParams) {
		p.SpecificWorkerIDs, p.LockKeys, p.Payload = []string{"a"}, []string{"l"}, json.RawMessage(`{"x":1}`)
	}, running("a", 1, t0.Add(time.Second)))
	c := tk.Clone()
	c.SpecificWorkerIDs[0], c.LockKeys[0], c.Payload[2] = "z", "z", 'y'
	c.Attempts[0].State = task.AttemptFail
	if tk.SpecificWorkerIDs[0] != "a" || tk.LockKeys[0] != "l" || string(tk.Payload) != `{"x":1}` || tk.Attempts[0].State != task.AttemptRunning {
		t.Errorf("Clone shares memory: %+v", tk)
	}
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{0, time.Nanosecond, 3 * time.Microsecond, 1500 * time.Millisecond, 4 * time.Second, -time.Minute, 36 * time.Hour} {
		b, err := json.Marshal(task.Duration(d))
		if err != nil {
			t.Fatal(err)
		}
		if want := `"` + d.String() + `"`; string(b) != want {
			t.Errorf("Marshal(%s) = %s, want %s", d, b, want)
		}
		var got task.Duration
		if err := json.Unmarshal(b, &got); err != nil || time.Duration(got) != d {
			t.Errorf("round trip %s = %s, %v", d, time.Duration(got), err)
		}
	}
	var d task.Duration
	if err := json.Unmarshal([]byte(`1500000000`), &d); err != nil || time.Duration(d) != 1500*time.Millisecond {
		t.Errorf("integer nanoseconds = %s, %v", time.Duration(d), err)
	}
	for _, bad := range []string{`"soon"`, `true`, `{}`, `1.5`, `"1x"`} {
		if err := json.Unmarshal([]byte(bad), &d); err == nil {
			t.Errorf("Unmarshal(%s) accepted", bad)
		}
	}
}

func TestTaskJSONFieldNames(t *testing.T) {
	t.Parallel()
	tk := doc(t, func(p *task.PublishParams) {
		p.SpecificWorkerIDs, p.LockKeys = []string{"a"}, []string{"device:1"}
	}, running("a", 1, t0.Add(time.Second)))
	b, err := json.Marshal(tk)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"key", "kind", "payload", "priority", "run_at", "specific_worker_ids",
		"concurrent_worker_cnt", "success_worker_cnt", "max_unexpected_retries", "ping_interval",
		"worker_timeout", "lock_keys", "workers", "state", "next_claim_at", "version"} {
		if _, ok := m[f]; !ok {
			t.Errorf("JSON lacks %q: %s", f, b)
		}
	}
	if string(m["ping_interval"]) != `"1s"` || string(m["worker_timeout"]) != `"4s"` {
		t.Errorf("durations: %s %s", m["ping_interval"], m["worker_timeout"])
	}
	var ws []map[string]any
	if err := json.Unmarshal(m["workers"], &ws); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"worker_id", "state", "attempt", "lease_until", "started_at"} {
		if _, ok := ws[0][f]; !ok {
			t.Errorf("worker JSON lacks %q", f)
		}
	}
	var back task.Task
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if string(b) != string(b2) {
		t.Errorf("round trip differs:\n%s\n%s", b, b2)
	}
}

// TestInstanceFencing: a second process under the same worker id (another
// instance) can neither renew, finish nor release the first one's attempt.
func TestInstanceFencing(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	tk := doc(t, nil)
	mine := tk.Claim(task.Holder{WorkerID: "dup", Instance: "i1"}, now)
	if mine.Instance != "i1" || mine.Attempt != 1 || tk.Attempts[0].Instance != "i1" {
		t.Fatalf("claim holder %+v entry %+v", mine, tk.Attempts[0])
	}
	other := mine
	other.Instance = "i2"
	for name, write := range map[string]func(*task.Task) error{
		"renew":   func(x *task.Task) error { return x.Renew(other, now) },
		"succeed": func(x *task.Task) error { return x.Succeed(other, now) },
		"fail":    func(x *task.Task) error { return x.Fail(other, "boom", time.Time{}, now) },
		"release": func(x *task.Task) error { return x.Release(other, now) },
	} {
		x := tk.Clone()
		if err := write(x); !errors.Is(err, task.ErrLeaseLost) {
			t.Errorf("%s by another instance: %v, want ErrLeaseLost", name, err)
		}
		if !reflect.DeepEqual(x.Attempts, tk.Attempts) {
			t.Errorf("%s by another instance changed the entry: %+v", name, x.Attempts)
		}
	}
	if err := tk.Renew(mine, now); err != nil {
		t.Fatalf("the holder renews: %v", err)
	}
}

// TestFailRetryAt: a failed attempt's retry waits until retryAt; the last
// failure of a task leaves run_at alone.
func TestFailRetryAt(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	tk := doc(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = 1 })
	h := tk.Claim(task.Holder{WorkerID: "w"}, now)
	retryAt := now.Add(30 * time.Second)
	if err := tk.Fail(h, "boom", retryAt, now); err != nil {
		t.Fatal(err)
	}
	if tk.State != task.StatePending || !tk.RunAt.Equal(retryAt) || !tk.NextClaimAt.Equal(retryAt) {
		t.Fatalf("after a failure: state %s run_at %s next_claim_at %s, want pending and %s", tk.State, tk.RunAt, tk.NextClaimAt, retryAt)
	}
	later := retryAt.Add(time.Second)
	h = tk.Claim(task.Holder{WorkerID: "w"}, later)
	if err := tk.Fail(h, "boom", later.Add(time.Hour), later); err != nil {
		t.Fatal(err)
	}
	if tk.State != task.StateFailed || !tk.RunAt.Equal(retryAt) {
		t.Fatalf("after the last failure: state %s run_at %s, want failed and run_at unchanged", tk.State, tk.RunAt)
	}
}

// Each mutation notes its change under the version it writes: the notes of
// one write gather, the next noting write replaces them, a renewal notes
// nothing.
func TestWriteChanges(t *testing.T) {
	t.Parallel()
	tk := runningDoc(t, nil)
	tk.Version = 5
	written := func() { tk.Version++ } // what the store's Update does
	b := tk.Claim(task.Holder{WorkerID: "b", Instance: "ib"}, t0.Add(5*time.Second))
	written()
	want := []task.Change{
		{Op: task.ChangeExpired, WorkerID: "a", Attempt: 1, Error: "lease expired"},
		{Op: task.ChangeClaimed, WorkerID: "b", Instance: "ib", Attempt: 2},
	}
	if got := tk.WriteChanges(); !reflect.DeepEqual(got, want) {
		t.Fatalf("claim over an expired lease noted %+v, want %+v", got, want)
	}
	if err := tk.Renew(b, t0.Add(6*time.Second)); err != nil {
		t.Fatal(err)
	}
	written()
	if got := tk.WriteChanges(); got != nil {
		t.Errorf("a renewal shows %+v, want none", got)
	}
	until := t0.Add(time.Hour)
	if err := tk.Snooze(b, until, t0.Add(7*time.Second)); err != nil {
		t.Fatal(err)
	}
	written()
	want = []task.Change{{Op: task.ChangeSnoozed, WorkerID: "b", Instance: "ib", Attempt: 2, Until: until}}
	if got := tk.WriteChanges(); !reflect.DeepEqual(got, want) {
		t.Errorf("snooze noted %+v, want %+v", got, want)
	}
	var back task.Task
	if b, err := json.Marshal(tk); err != nil || json.Unmarshal(b, &back) != nil || !reflect.DeepEqual(back.WriteChanges(), want) {
		t.Errorf("notes do not survive JSON: %v", err)
	}
}
