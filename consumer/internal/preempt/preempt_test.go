package preempt_test

import (
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/internal/tasktest"
	"github.com/leasepool/leasepool/task"
)

// The task fixtures shared with task's tests, under this file's names.
var (
	t0      = tasktest.T0
	newTask = tasktest.New
	running = tasktest.Running
	ended   = tasktest.Ended
)

func TestDecide(t *testing.T) {
	t.Parallel()
	soon, later := t0.Add(2*time.Second), t0.Add(5*time.Second)
	three := func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 3, 3 }
	two := func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 2, 2 }
	tests := []struct {
		name    string
		edit    func(p *task.PublishParams)
		workers []task.Attempt
		prep    func(tk *task.Task)
		worker  string
		verdict preempt.Verdict
		at      time.Time
	}{
		{"pending", nil, nil, nil, "w", preempt.Claim, time.Time{}},
		{"succeeded", nil, []task.Attempt{ended("a", 1, task.AttemptSuccess)}, nil, "w", preempt.Never, time.Time{}},
		{"failed", func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries },
			[]task.Attempt{ended("a", 1, task.AttemptFail)}, nil, "w", preempt.Never, time.Time{}},
		{"cancelled", nil, nil, func(tk *task.Task) { _ = tk.Cancel(t0) }, "w", preempt.Never, time.Time{}},
		{"pinned elsewhere", func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{"x", "y"} }, nil, nil, "w", preempt.Never, time.Time{}},
		{"pinned here", func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{"x", "w"} }, nil, nil, "w", preempt.Claim, time.Time{}},
		{"already running here: look again when that lease ends", three, []task.Attempt{running("w", 1, soon)}, nil, "w", preempt.Later, soon},
		{"already succeeded here", three, []task.Attempt{ended("w", 1, task.AttemptSuccess)}, nil, "w", preempt.Never, time.Time{}},
		{"own earlier attempt failed", nil, []task.Attempt{ended("w", 1, task.AttemptFail)}, nil, "w", preempt.Claim, time.Time{}},
		{"own earlier attempt expired", nil, []task.Attempt{ended("w", 1, task.AttemptExpired)}, nil, "w", preempt.Claim, time.Time{}},
		{"own lease expired unrecorded", nil, []task.Attempt{running("w", 1, t0)}, nil, "w", preempt.Claim, time.Time{}},
		{"delayed", func(p *task.PublishParams) { p.RunAt = later }, nil, nil, "w", preempt.Later, later},
		{"full", nil, []task.Attempt{running("a", 1, soon)}, nil, "w", preempt.Later, soon},
		{"full, earliest live lease", two, []task.Attempt{running("a", 1, later), running("b", 2, soon)}, nil, "w", preempt.Later, soon},
		{"full but one expired counts as free", two, []task.Attempt{running("a", 1, later), running("b", 2, t0.Add(-time.Second))}, nil, "w", preempt.Claim, time.Time{}},
		{"free slot", two, []task.Attempt{running("a", 1, later)}, nil, "w", preempt.Claim, time.Time{}},
		{"takeover of expired lease", nil, []task.Attempt{running("a", 1, t0)}, nil, "w", preempt.Claim, time.Time{}},
		{"reap: expired exhausts retries", func(p *task.PublishParams) { p.MaxUnexpectedRetries = 1 },
			[]task.Attempt{ended("a", 1, task.AttemptFail), running("b", 2, t0)}, nil, "w", preempt.Reap, time.Time{}},
		{"reap with NoRetries", func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries },
			[]task.Attempt{running("b", 1, t0)}, nil, "w", preempt.Reap, time.Time{}},
		{"expired within retries claims", func(p *task.PublishParams) { p.MaxUnexpectedRetries = 2 },
			[]task.Attempt{ended("a", 1, task.AttemptFail), running("b", 2, t0)}, nil, "w", preempt.Claim, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tk := newTask(t, tt.edit, tt.workers...)
			if tt.prep != nil {
				tt.prep(tk)
			}
			d := preempt.Decide(tk, tt.worker, t0)
			if d.Verdict != tt.verdict {
				t.Fatalf("Decide = %s (%s), want %s", d.Verdict, d.Reason, tt.verdict)
			}
			if !d.At.Equal(tt.at) {
				t.Errorf("At = %s, want %s", d.At, tt.at)
			}
			if d.Verdict == preempt.Later && d.Reason == "" {
				t.Error("Later without a reason")
			}
			if d.Verdict != preempt.Claim {
				if _, _, err := preempt.ClaimTask(tk, task.Holder{WorkerID: tt.worker}, t0); !errors.Is(err, preempt.ErrNotClaimable) {
					t.Errorf("ClaimTask = %v, want ErrNotClaimable", err)
				}
			}
		})
	}
}

func TestVerdictString(t *testing.T) {
	t.Parallel()
	for v, s := range map[preempt.Verdict]string{preempt.Never: "never", preempt.Later: "later", preempt.Claim: "claim", preempt.Reap: "reap"} {
		if v.String() != s {
			t.Errorf("%d.String() = %q, want %q", v, v.String(), s)
		}
	}
}

func TestClaimTask(t *testing.T) {
	t.Parallel()
	now := t0.Add(time.Second)
	tk := newTask(t, func(p *task.PublishParams) {
		p.ConcurrentWorkerCnt, p.SuccessWorkerCnt, p.WorkerTimeout, p.PingInterval = 2, 2, 10*time.Second, time.Second
	}, ended("a", 1, task.AttemptFail), running("b", 2, t0), running("c", 4, t0.Add(time.Hour)))
	tk.AttemptsStarted = 7 // entries released earlier still count
	before := tk.Clone()

	next, h, err := preempt.ClaimTask(tk, task.Holder{WorkerID: "w"}, now)
	if err != nil {
		t.Fatal(err)
	}
	attempt := h.Attempt
	if attempt != 8 || next.AttemptsStarted != 8 {
		t.Errorf("attempt %d attempts %d, want 8", attempt, next.AttemptsStarted)
	}
	if len(next.Attempts) != 4 {
		t.Fatalf("workers = %+v", next.Attempts)
	}
	if b := next.Attempts[1]; b.State != task.AttemptExpired || !b.EndedAt.Equal(now) {
		t.Errorf("expired worker recorded as %+v", b)
	}
	w := next.Attempts[3]
	if w.WorkerID != "w" || w.State != task.AttemptRunning || w.Attempt != 8 || !w.StartedAt.Equal(now) {
		t.Errorf("new entry %+v", w)
	}
	if !w.LeaseUntil.Equal(now.Add(10 * time.Second)) {
		t.Errorf("lease_until %s, want now+timeout %s", w.LeaseUntil, now.Add(10*time.Second))
	}
	if next.State != task.StateRunning || !next.NextClaimAt.Equal(w.LeaseUntil) {
		t.Errorf("state %s next %s, want running, %s (full: earliest lease)", next.State, next.NextClaimAt, w.LeaseUntil)
	}
	if !next.UpdatedAt.Equal(now) || next.Version != tk.Version {
		t.Errorf("updated_at %s version %d (the store bumps version)", next.UpdatedAt, next.Version)
	}
	if i := next.Entry(task.Holder{WorkerID: "w", Attempt: attempt}); i != 3 {
		t.Errorf("Entry = %d", i)
	}
	// The input is untouched.
	if len(tk.Attempts) != len(before.Attempts) || tk.Attempts[1].State != task.AttemptRunning || tk.AttemptsStarted != 7 {
		t.Errorf("ClaimTask changed its input: %+v", tk)
	}

	// The same worker cannot claim twice (only look again when its lease
	// ends); a second worker finds it full.
	if d := preempt.Decide(next, "w", now); d.Verdict == preempt.Claim {
		t.Errorf("second claim by w: %s", d.Verdict)
	}
	if d := preempt.Decide(next, "x", now); d.Verdict != preempt.Later || !d.At.Equal(t0.Add(time.Second+10*time.Second)) {
		t.Errorf("claim by x: %s at %s", d.Verdict, d.At)
	}
}

func TestClaimAfterOwnFailure(t *testing.T) {
	t.Parallel()
	// A single worker must be able to retry its own failure.
	tk := newTask(t, nil)
	now := t0
	for i := 1; i <= 4; i++ {
		next, h, err := preempt.ClaimTask(tk, task.Holder{WorkerID: "solo"}, now)
		if err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		attempt := h.Attempt
		if attempt != i {
			t.Fatalf("attempt %d, want %d", attempt, i)
		}
		if err := next.Fail(task.Holder{WorkerID: "solo", Attempt: attempt}, "boom", time.Time{}, now); err != nil {
			t.Fatal(err)
		}
		tk = next
	}
	if tk.State != task.StateFailed {
		t.Errorf("after 4 failures with 3 retries: %s", tk.State)
	}
	if _, _, err := preempt.ClaimTask(tk, task.Holder{WorkerID: "solo"}, now); !errors.Is(err, preempt.ErrNotClaimable) {
		t.Errorf("claim of failed task: %v", err)
	}
}

func TestReapTask(t *testing.T) {
	t.Parallel()
	tk := newTask(t, func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries }, running("a", 1, t0))
	if d := preempt.Decide(tk, "w", t0); d.Verdict != preempt.Reap {
		t.Fatalf("Decide = %s", d.Verdict)
	}
	got := tk.Clone()
	got.Reap(t0)
	if got.State != task.StateFailed || got.Attempts[0].State != task.AttemptExpired {
		t.Errorf("reaped: state %s worker %s", got.State, got.Attempts[0].State)
	}
	if tk.Attempts[0].State != task.AttemptRunning {
		t.Error("Reap on a clone changed the original")
	}
	if d := preempt.Decide(got, "w", t0); d.Verdict != preempt.Never {
		t.Errorf("after reap: %s", d.Verdict)
	}
}

// An entry a release or a snooze moved to History does not block a claim,
// not even by the worker it belonged to.
func TestHistoryDoesNotBlockClaim(t *testing.T) {
	t.Parallel()
	h := task.Holder{WorkerID: "a", Attempt: 1}
	now := t0.Add(time.Second)
	for name, do := range map[string]func(tk *task.Task) error{
		"release": func(tk *task.Task) error { return tk.Release(h, now) },
		"snooze":  func(tk *task.Task) error { return tk.Snooze(h, now.Add(time.Minute), now) },
	} {
		t.Run(name, func(t *testing.T) {
			tk := newTask(t, nil, running("a", 1, t0.Add(4*time.Second)))
			if err := do(tk); err != nil {
				t.Fatal(err)
			}
			if len(tk.Attempts) != 0 || len(tk.History) != 1 {
				t.Fatalf("workers %+v history %+v; want the entry moved to history", tk.Attempts, tk.History)
			}
			if d := preempt.Decide(tk, "a", t0.Add(2*time.Hour)); d.Verdict != preempt.Claim {
				t.Errorf("Decide after %s: %s (%s); want claim (history does not block)", name, d.Verdict, d.Reason)
			}
		})
	}
}
