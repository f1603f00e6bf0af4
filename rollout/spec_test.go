package rollout

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func TestParseWaves(t *testing.T) {
	ws, err := ParseWaves("1, 5%,25%,100%")
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 4 || ws[0].Count != 1 || ws[1].Percent != 5 || ws[3].Percent != 100 {
		t.Fatalf("waves %+v", ws)
	}
	for _, bad := range []string{"", "0", "1,50%", "50%,10%,100%", "10,5,100%", "2,1,100%", "-1,100%", "1e400%", "NaN%", "101%", "x", "1,,100%", strings.Repeat("1,", 40) + "100%"} {
		if _, err := ParseWaves(bad); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "waves") {
			t.Errorf("ParseWaves(%q) = %v, want an invalid waves error", bad, err)
		}
	}
}

func TestParseAbortRules(t *testing.T) {
	rs, err := ParseAbortRules("failed>10% after 20; timed_out|offline>25%")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Percent != 10 || rs[0].After != 20 || rs[0].Kinds[0] != OutcomeFailed || len(rs[1].Kinds) != 2 {
		t.Fatalf("rules %+v", rs)
	}
	if got := rs[0].String(); got != "failed>10% after 20" {
		t.Errorf("String = %q", got)
	}
	any, err := ParseAbortRules("any>5%")
	if err != nil || len(any[0].Kinds) != 4 {
		t.Fatalf("any: %+v %v", any, err)
	}
	for _, bad := range []string{"", "failed", "failed>10", "failed>100%", "failed>-1%", "succeeded>10%", "failed>10% after", "failed>10% after 0", "failed>10% before 3", "failed>10% after 99999999"} {
		if _, err := ParseAbortRules(bad); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "abort-when") {
			t.Errorf("ParseAbortRules(%q) = %v, want an invalid abort-when error", bad, err)
		}
	}
}

func TestValidateNameRefusesHostileNames(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "-x", "a/b", "a:b", "a b", "a\x00", "ä", "a%2Fb", strings.Repeat("a", MaxNameLen+1), "a?b", "a#b"} {
		if err := ValidateName(bad); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "name") {
			t.Errorf("ValidateName(%q) = %v", bad, err)
		}
	}
	if err := ValidateName("fw-1.4.2_berlin"); err != nil {
		t.Error(err)
	}
}

func TestSpecValidateNamesTheField(t *testing.T) {
	ok := Spec{Command: "update", Devices: []string{"a", "b"}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		field string
		edit  func(*Spec)
	}{
		{"command", func(s *Spec) { s.Command = "" }},
		{"command", func(s *Spec) { s.Command = "a\nb" }},
		{"args", func(s *Spec) { s.Args = json.RawMessage(`[1]`) }},
		{"args", func(s *Spec) { s.Args = json.RawMessage(`{"a":"` + strings.Repeat("x", 70<<10) + `"}`) }},
		{"select", func(s *Spec) { s.Select = "model=x" }},
		{"select", func(s *Spec) { s.Devices = nil }},
		{"select", func(s *Spec) { s.Devices, s.Select = nil, "model=a b" }},
		{"select", func(s *Spec) { s.Devices, s.Select = nil, "ring=prod,attr:model=x" }},
		{"select", func(s *Spec) { s.Devices, s.Select = nil, "attr:ring!=canary" }},
		{"devices", func(s *Spec) { s.Devices = []string{"a", "a"} }},
		{"devices", func(s *Spec) { s.Devices = []string{"a/#"} }},
		{"rate", func(s *Spec) { s.Rate = Rate{N: 0, Per: task.Duration(time.Second)} }},
		{"rate", func(s *Spec) { s.Rate = Rate{N: 1, Per: task.Duration(time.Nanosecond)} }},
		{"retries", func(s *Spec) { s.Retries = MaxRetries + 1 }},
		{"timeout", func(s *Spec) { s.Timeout = -1 }},
		{"rollback_args", func(s *Spec) { s.RollbackArgs = json.RawMessage(`{}`) }},
		{"abort_when", func(s *Spec) { s.AbortWhen = []AbortRule{{Kinds: []Outcome{"succeeded"}, Percent: 1}} }},
		{"retry_on", func(s *Spec) { s.RetryOn = []Outcome{OutcomeCancelled} }},
	}
	for _, c := range cases {
		s := ok
		s.Devices = append([]string(nil), ok.Devices...)
		c.edit(&s)
		err := s.Validate()
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: Validate = %v", c.field, err)
		}
	}
}

func TestTokenNeverExceedsTheRate(t *testing.T) {
	r := &Rollout{Spec: Spec{Rate: Rate{N: 3, Per: task.Duration(time.Second)}}}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var got []time.Time
	for ms := 0; ms < 5000; ms += 7 {
		// A clock that steps back now and then, as after a takeover.
		now := base.Add(time.Duration(ms) * time.Millisecond)
		if ms%91 == 0 {
			now = now.Add(-300 * time.Millisecond)
		}
		if at, ok := r.token(now); ok {
			got = append(got, at)
		}
	}
	if len(got) < 14 {
		t.Fatalf("only %d tokens in 5s at 3/1s", len(got))
	}
	checkRate(t, got, 3, time.Second)
}

// checkRate fails when more than n of times fall in any window of per.
func checkRate(t *testing.T, times []time.Time, n int, per time.Duration) {
	t.Helper()
	for i := range times {
		if i > 0 && times[i].Before(times[i-1]) {
			t.Fatalf("dispatch times go back: %s after %s", times[i], times[i-1])
		}
		if i >= n && times[i].Sub(times[i-n]) < per {
			t.Fatalf("%d dispatches within %s: %s .. %s", n+1, per, times[i-n], times[i])
		}
	}
}

// Wave targets that go down are refused, naming waves, nothing written:
// counts and percentages each at parse, a count against a percentage
// once the devices are known.
func TestWaveTargetsMustNotGoDown(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	down := []WaveTarget{{Count: 10}, {Count: 5}, {Percent: 100}}
	mixed, err := ParseWaves("10,5%,100%")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		waves   []WaveTarget
		devices int
	}{{down, 100}, {mixed, 100}} {
		_, err := Create(ctx, st, "down", Spec{Command: "update", Devices: devices(c.devices), Waves: c.waves})
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "waves") || !strings.Contains(err.Error(), "wave 2") {
			t.Errorf("waves %v on %d devices: %v, want an invalid waves error naming wave 2", c.waves, c.devices, err)
		}
	}
	if _, err := Get(ctx, st, "down"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refused create wrote the rollout: %v", err)
	}
	// 5% of 1,000 is 50, above 10; a count past the fleet is the fleet.
	for name, c := range map[string]struct {
		waves   string
		devices int
		ends    string
	}{"mixed": {"10,5%,100%", 1000, "[10 50 1000]"}, "small": {"10,20,100%", 5, "[5]"}} {
		ws, err := ParseWaves(c.waves)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Create(ctx, st, name, Spec{Command: "update", Devices: devices(c.devices), Waves: ws})
		if err != nil {
			t.Fatalf("%s on %d devices: %v", c.waves, c.devices, err)
		}
		var ends []int
		for _, w := range r.Waves {
			ends = append(ends, w.End)
		}
		if fmt.Sprint(ends) != c.ends {
			t.Errorf("%s on %d devices: waves end at %v, want %s", c.waves, c.devices, ends, c.ends)
		}
	}
}
