package task_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/tasktest"
	"github.com/leasepool/leasepool/task"
)

// The fixtures shared with consumer/internal/preempt's tests, under this
// file's names.
var (
	t0      = tasktest.T0
	valid   = tasktest.Params
	doc     = tasktest.New
	running = tasktest.Running
	ended   = tasktest.Ended
)

func TestValidateErrorsNameField(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 513)
	tests := []struct {
		name  string
		edit  func(p *task.PublishParams)
		field string
	}{
		{"empty key", func(p *task.PublishParams) { p.Key = "" }, "key"},
		{"long key", func(p *task.PublishParams) { p.Key = long }, "key"},
		{"control key", func(p *task.PublishParams) { p.Key = "a\nb" }, "key"},
		{"empty kind", func(p *task.PublishParams) { p.Kind = "" }, "kind"},
		{"control kind", func(p *task.PublishParams) { p.Kind = "a\x00" }, "kind"},
		{"bad payload", func(p *task.PublishParams) { p.Payload = json.RawMessage("{") }, "payload"},
		{"empty pin", func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{"w1", ""} }, "specific_worker_ids"},
		{"long pin", func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{long} }, "specific_worker_ids"},
		{"empty lock", func(p *task.PublishParams) { p.LockKeys = []string{""} }, "lock_keys"},
		{"control lock", func(p *task.PublishParams) { p.LockKeys = []string{"dev\t1"} }, "lock_keys"},
		{"negative concurrent", func(p *task.PublishParams) { p.ConcurrentWorkerCnt = -1 }, "concurrent_worker_cnt"},
		{"negative success", func(p *task.PublishParams) { p.SuccessWorkerCnt = -1 }, "success_worker_cnt"},
		{"retries below NoRetries", func(p *task.PublishParams) { p.MaxUnexpectedRetries = -2 }, "max_unexpected_retries"},
		{"negative ping", func(p *task.PublishParams) { p.PingInterval = -time.Second }, "ping_interval"},
		{"negative timeout", func(p *task.PublishParams) { p.WorkerTimeout = -time.Second }, "worker_timeout"},
		{"timeout equals ping", func(p *task.PublishParams) { p.PingInterval, p.WorkerTimeout = time.Second, time.Second }, "worker_timeout"},
		{"timeout below ping", func(p *task.PublishParams) { p.PingInterval, p.WorkerTimeout = 2*time.Second, time.Second }, "worker_timeout"},
		{"timeout too short for a ping", func(p *task.PublishParams) { p.WorkerTimeout = 3 * time.Nanosecond }, "worker_timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := valid()
			tt.edit(&p)
			err := p.Validate()
			if !errors.Is(err, task.ErrInvalid) {
				t.Fatalf("Validate() = %v, want an error wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.field+":") {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.field)
			}
			p = valid()
			tt.edit(&p)
			if _, err := task.NewTask(p, t0); !errors.Is(err, task.ErrInvalid) {
				t.Errorf("NewTask() = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestValidateDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                         string
		edit                         func(p *task.PublishParams)
		concurrent, success, retries int
		ping, timeout                time.Duration
		payload                      string
	}{
		{"all defaults", func(*task.PublishParams) {}, 1, 1, task.DefaultMaxUnexpectedRetries, task.DefaultPingInterval, task.DefaultWorkerTimeout, "{}"},
		{"no retries", func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries }, 1, 1, 0, time.Second, 4 * time.Second, "{}"},
		{"explicit retries", func(p *task.PublishParams) { p.MaxUnexpectedRetries = 7 }, 1, 1, 7, time.Second, 4 * time.Second, "{}"},
		{"ping only", func(p *task.PublishParams) { p.PingInterval = 3 * time.Second }, 1, 1, 3, 3 * time.Second, 12 * time.Second, "{}"},
		{"timeout only, long", func(p *task.PublishParams) { p.WorkerTimeout = time.Minute }, 1, 1, 3, time.Second, time.Minute, "{}"},
		{"timeout only, short", func(p *task.PublishParams) { p.WorkerTimeout = 2 * time.Second }, 1, 1, 3, 500 * time.Millisecond, 2 * time.Second, "{}"},
		{"ping only, short", func(p *task.PublishParams) { p.PingInterval = task.MinPingInterval }, 1, 1, 3, task.MinPingInterval, task.MinWorkerTimeout, "{}"},
		{"both", func(p *task.PublishParams) { p.PingInterval, p.WorkerTimeout = time.Second, 1001*time.Millisecond }, 1, 1, 3, time.Second, 1001 * time.Millisecond, "{}"},
		{"counts kept", func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 5, 3 }, 5, 3, 3, time.Second, 4 * time.Second, "{}"},
		{"concurrent clamped to pins", func(p *task.PublishParams) {
			p.ConcurrentWorkerCnt, p.SpecificWorkerIDs = 5, []string{"a", "b"}
		}, 2, 1, 3, time.Second, 4 * time.Second, "{}"},
		{"payload kept", func(p *task.PublishParams) { p.Payload = json.RawMessage(`[1,2]`) }, 1, 1, 3, time.Second, 4 * time.Second, "[1,2]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := valid()
			tt.edit(&p)
			tk, err := task.NewTask(p, t0)
			if err != nil {
				t.Fatalf("NewTask() = %v", err)
			}
			if tk.ConcurrentWorkerCnt != tt.concurrent || tk.SuccessWorkerCnt != tt.success || tk.MaxUnexpectedRetries != tt.retries {
				t.Errorf("counts = concurrent %d success %d retries %d, want %d %d %d",
					tk.ConcurrentWorkerCnt, tk.SuccessWorkerCnt, tk.MaxUnexpectedRetries, tt.concurrent, tt.success, tt.retries)
			}
			ping, timeout := time.Duration(tk.PingInterval), time.Duration(tk.WorkerTimeout)
			if ping != tt.ping || timeout != tt.timeout {
				t.Errorf("ping %s timeout %s, want %s %s", ping, timeout, tt.ping, tt.timeout)
			}
			if timeout <= ping {
				t.Errorf("timeout %s not above ping %s", timeout, ping)
			}
			if string(tk.Payload) != tt.payload {
				t.Errorf("payload = %s, want %s", tk.Payload, tt.payload)
			}
		})
	}
}

// TestValidateTwice: Validate changes nothing, so calling it again (as the
// CLI, mqttdev.PublishParams and task.Publish each do) gives the same
// params and the same answer; NoRetries stays NoRetries.
func TestValidateTwice(t *testing.T) {
	t.Parallel()
	p := valid()
	p.MaxUnexpectedRetries = task.NoRetries
	p.ConcurrentWorkerCnt, p.SpecificWorkerIDs = 5, []string{"a", "b"}
	p.WorkerTimeout = 2 * time.Second
	want := p
	want.SpecificWorkerIDs = slices.Clone(p.SpecificWorkerIDs)
	for i := range 3 {
		if err := p.Validate(); err != nil {
			t.Fatalf("Validate #%d = %v", i+1, err)
		}
		if !reflect.DeepEqual(p, want) {
			t.Fatalf("Validate #%d changed the params:\n got %+v\nwant %+v", i+1, p, want)
		}
	}
	tk, err := task.NewTask(p, t0)
	if err != nil {
		t.Fatal(err)
	}
	if tk.MaxUnexpectedRetries != 0 || tk.ConcurrentWorkerCnt != 2 || time.Duration(tk.PingInterval) != 500*time.Millisecond {
		t.Errorf("NewTask: retries %d concurrent %d ping %s; want 0 2 500ms", tk.MaxUnexpectedRetries, tk.ConcurrentWorkerCnt, time.Duration(tk.PingInterval))
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("NewTask changed its argument: %+v", p)
	}
}

// TestValidateInput: names that cannot be stored or matched, leases too
// short to honour and payloads over the limit are refused, naming the field.
func TestValidateInput(t *testing.T) {
	t.Parallel()
	big := json.RawMessage(`"` + strings.Repeat("x", task.MaxPayloadSize-2) + `"`)
	tests := []struct {
		name, field string
		edit        func(p *task.PublishParams)
	}{
		{"key not UTF-8", "key", func(p *task.PublishParams) { p.Key = "a\xffb" }},
		{"key control", "key", func(p *task.PublishParams) { p.Key = "a\x1bb" }},
		{"key C1 control", "key", func(p *task.PublishParams) { p.Key = "a\u0085b" }},
		{"kind not UTF-8", "kind", func(p *task.PublishParams) { p.Kind = "\xc3" }},
		{"pin not UTF-8", "specific_worker_ids", func(p *task.PublishParams) { p.SpecificWorkerIDs = []string{"w\xfe"} }},
		{"lock control", "lock_keys", func(p *task.PublishParams) { p.LockKeys = []string{"l\n"} }},
		{"ping 1ns timeout 2ns", "ping_interval", func(p *task.PublishParams) { p.PingInterval, p.WorkerTimeout = 1, 2 }},
		{"ping under floor", "ping_interval", func(p *task.PublishParams) { p.PingInterval = task.MinPingInterval - 1 }},
		{"ping under floor, long timeout", "ping_interval", func(p *task.PublishParams) {
			p.PingInterval, p.WorkerTimeout = time.Millisecond, time.Second
		}},
		{"timeout under floor", "worker_timeout", func(p *task.PublishParams) {
			p.PingInterval, p.WorkerTimeout = task.MinPingInterval, task.MinWorkerTimeout-1
		}},
		{"timeout 2ns", "worker_timeout", func(p *task.PublishParams) { p.WorkerTimeout = 2 }},
		{"timeout only, under floor", "worker_timeout", func(p *task.PublishParams) { p.WorkerTimeout = 80 * time.Millisecond }},
		{"payload over the limit", "payload", func(p *task.PublishParams) { p.Payload = append(big, ' ', ' ') }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := valid()
			tt.edit(&p)
			err := p.Validate()
			if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), tt.field+":") {
				t.Fatalf("Validate() = %v; want ErrInvalid naming %s", err, tt.field)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
	// The floors themselves and a payload at the limit are accepted.
	p := valid()
	p.PingInterval, p.WorkerTimeout, p.Payload = task.MinPingInterval, task.MinWorkerTimeout, big
	if len(p.Payload) != task.MaxPayloadSize {
		t.Fatalf("fixture: %d bytes", len(p.Payload))
	}
	if err := p.Validate(); err != nil {
		t.Errorf("Validate at the limits = %v", err)
	}
	q := valid()
	q.WorkerTimeout = task.MinWorkerTimeout // ping defaults to 25ms
	if err := q.Validate(); err != nil {
		t.Errorf("Validate with only timeout %s = %v", q.WorkerTimeout, err)
	}
}

func TestNewTask(t *testing.T) {
	t.Parallel()
	t.Run("past run_at becomes now", func(t *testing.T) {
		p := valid()
		p.RunAt = t0.Add(-time.Hour)
		tk, err := task.NewTask(p, t0)
		if err != nil {
			t.Fatal(err)
		}
		if !tk.RunAt.Equal(t0) || !tk.NextClaimAt.Equal(t0) || tk.State != task.StatePending || tk.Version != 1 {
			t.Errorf("got run_at %s next %s state %s version %d", tk.RunAt, tk.NextClaimAt, tk.State, tk.Version)
		}
		if tk.Attempts == nil {
			t.Error("workers is nil, want an empty list (JSON [])")
		}
	})
	t.Run("future run_at kept in UTC", func(t *testing.T) {
		p := valid()
		p.RunAt = t0.Add(time.Hour).In(time.FixedZone("x", 3600))
		tk, err := task.NewTask(p, t0)
		if err != nil {
			t.Fatal(err)
		}
		if !tk.RunAt.Equal(t0.Add(time.Hour)) || tk.RunAt.Location() != time.UTC || !tk.NextClaimAt.Equal(tk.RunAt) {
			t.Errorf("run_at %s next %s", tk.RunAt, tk.NextClaimAt)
		}
	})
}

func TestRecompute(t *testing.T) {
	t.Parallel()
	soon, later := t0.Add(2*time.Second), t0.Add(5*time.Second)
	two := func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 2, 2 }
	tests := []struct {
		name    string
		edit    func(p *task.PublishParams)
		workers []task.Attempt
		cancel  bool
		state   task.State
		next    time.Time // zero: none
	}{
		{"pending", nil, nil, false, task.StatePending, t0},
		{"delayed", func(p *task.PublishParams) { p.RunAt = later }, nil, false, task.StatePending, later},
		{"running and full", nil, []task.Attempt{running("a", 1, soon)}, false, task.StateRunning, soon},
		{"full picks earliest lease", two, []task.Attempt{running("a", 1, later), running("b", 2, soon)}, false, task.StateRunning, soon},
		{"running with a free slot", two, []task.Attempt{running("a", 1, later)}, false, task.StateRunning, t0},
		{"expired lease still running, claimable", nil, []task.Attempt{running("a", 1, t0)}, false, task.StateRunning, t0},
		{"succeeded", nil, []task.Attempt{ended("a", 1, task.AttemptSuccess)}, false, task.StateSucceeded, time.Time{}},
		{"one of two successes", two, []task.Attempt{ended("a", 1, task.AttemptSuccess)}, false, task.StatePending, t0},
		{"failures within retries", nil, []task.Attempt{ended("a", 1, task.AttemptFail), ended("b", 2, task.AttemptExpired)}, false, task.StatePending, t0},
		{"failed", func(p *task.PublishParams) { p.MaxUnexpectedRetries = 1 },
			[]task.Attempt{ended("a", 1, task.AttemptFail), ended("b", 2, task.AttemptExpired)}, false, task.StateFailed, time.Time{}},
		{"failed at first with NoRetries", func(p *task.PublishParams) { p.MaxUnexpectedRetries = task.NoRetries },
			[]task.Attempt{ended("a", 1, task.AttemptFail)}, false, task.StateFailed, time.Time{}},
		{"cancelled", nil, []task.Attempt{running("a", 1, soon)}, true, task.StateCancelled, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tk := doc(t, tt.edit, tt.workers...)
			tk.Cancelled = tt.cancel
			tk.Recompute(t0)
			if tk.State != tt.state {
				t.Errorf("state = %s, want %s", tk.State, tt.state)
			}
			if !tk.NextClaimAt.Equal(tt.next) {
				t.Errorf("next_claim_at = %s, want %s", tk.NextClaimAt, tt.next)
			}
			wantFinished := tt.state == task.StateSucceeded || tt.state == task.StateFailed || tt.state == task.StateCancelled
			if tk.State.Finished() != wantFinished {
				t.Errorf("Finished() = %v for %s", tk.State.Finished(), tk.State)
			}
		})
	}
}

func TestParseState(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"pending", "running", "succeeded", "failed", "cancelled"} {
		if st, err := task.ParseState(s); err != nil || string(st) != s {
			t.Errorf("ParseState(%q) = %q, %v", s, st, err)
		}
	}
	for _, s := range []string{"", "bogus", "RUNNING", "Pending"} {
		if _, err := task.ParseState(s); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "state") {
			t.Errorf("ParseState(%q) = %v, want ErrInvalid naming state", s, err)
		}
	}
}

func TestCountWorkers(t *testing.T) {
	t.Parallel()
	tk := doc(t, func(p *task.PublishParams) { p.ConcurrentWorkerCnt, p.SuccessWorkerCnt = 5, 5 },
		running("a", 1, t0.Add(time.Second)), running("b", 2, t0), ended("c", 3, task.AttemptSuccess),
		ended("d", 4, task.AttemptFail), ended("e", 5, task.AttemptExpired))
	got := tk.CountWorkers(t0)
	want := task.Counts{Live: 1, Expired: 1, Success: 1, Unexpected: 2}
	if got != want {
		t.Errorf("CountWorkers = %+v, want %+v", got, want)
	}
}
