package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

// slots lists the first n slots after from.
func slots(t *testing.T, s *Schedule, from time.Time, n int) []string {
	t.Helper()
	tt, err := s.timetable()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for at := tt.Next(from); len(out) < n && !at.IsZero(); at = tt.Next(at) {
		out = append(out, at.Format(time.RFC3339))
	}
	return out
}

func TestCronSlots(t *testing.T) {
	jan1 := utc("2025-12-31T23:59:59Z") // 2026-01-01 is a Thursday
	for _, c := range []struct {
		name, cron, tz string
		from           time.Time
		want           []string
	}{
		{"both day fields restricted: either matches (crontab(5))", "0 0 1,15 * 5", "", jan1,
			[]string{"2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z", "2026-01-15T00:00:00Z", "2026-01-16T00:00:00Z", "2026-01-23T00:00:00Z"}},
		{"only a plain * is unrestricted: */2 with a weekday is either too", "0 0 */2 * 5", "", jan1,
			[]string{"2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-05T00:00:00Z", "2026-01-07T00:00:00Z", "2026-01-09T00:00:00Z"}},
		{"a plain * day-of-month: the weekday alone decides", "0 0 * * 5", "", jan1,
			[]string{"2026-01-02T00:00:00Z", "2026-01-09T00:00:00Z"}},
		{"day-of-week only", "0 12 * * MON", "", jan1,
			[]string{"2026-01-05T12:00:00Z", "2026-01-12T12:00:00Z"}},
		{"optional seconds field", "*/20 * * * * *", "", utc("2026-01-01T00:00:05Z"),
			[]string{"2026-01-01T00:00:20Z", "2026-01-01T00:00:40Z", "2026-01-01T00:01:00Z"}},
		{"descriptor", "@daily", "", jan1, []string{"2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"}},
		{"time zone: 09:30 in Berlin, winter then summer", "30 9 * * *", "Europe/Berlin", utc("2026-03-27T12:00:00Z"),
			[]string{"2026-03-28T08:30:00Z", "2026-03-29T07:30:00Z"}},
		{"a local time skipped by DST runs an hour later (02:30 CET is 03:30 CEST)", "30 2 * * *", "Europe/Berlin", utc("2026-03-28T12:00:00Z"),
			[]string{"2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"}},
		{"a local time repeated by DST runs at its first instant only", "30 2 * * *", "Europe/Berlin", utc("2026-10-24T12:00:00Z"),
			[]string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		{"with * hours both passes of the repeated hour run", "30 * * * *", "Europe/Berlin", utc("2026-10-24T23:59:00Z"),
			[]string{"2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:30:00Z"}},
		{"the hour after the repeated one is not a repeat", "30 3 * * *", "Europe/Berlin", utc("2026-10-24T12:00:00Z"),
			[]string{"2026-10-25T02:30:00Z"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Schedule{Cron: c.cron, TZ: c.tz}
			got := slots(t, s, c.from, len(c.want))
			if strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Errorf("%q in %q after %s:\n got  %v\n want %v", c.cron, c.tz, c.from.Format(time.RFC3339), got, c.want)
			}
		})
	}
}

func TestIntervalSlots(t *testing.T) {
	// Without a start: multiples of the interval since the epoch.
	s := &Schedule{Every: task.Duration(10 * time.Second)}
	if got := slots(t, s, utc("2026-01-01T12:00:03Z"), 2); strings.Join(got, " ") != "2026-01-01T12:00:10Z 2026-01-01T12:00:20Z" {
		t.Errorf("every 10s = %v", got)
	}
	// With a start: anchored there; a slot equal to from is not after it.
	s = &Schedule{Every: task.Duration(10 * time.Second), Start: utc("2026-01-01T12:00:03Z")}
	if got := slots(t, s, utc("2026-01-01T12:00:13Z"), 2); strings.Join(got, " ") != "2026-01-01T12:00:23Z 2026-01-01T12:00:33Z" {
		t.Errorf("every 10s from :03 = %v", got)
	}
	if got := slots(t, s, utc("2026-01-01T11:59:00Z"), 1); got[0] != "2026-01-01T11:59:03Z" {
		t.Errorf("before the anchor: %v", got)
	}
}

func TestKey(t *testing.T) {
	slot := utc("2026-01-01T00:00:00Z")
	if k := Key("nightly", slot.In(time.FixedZone("x", 3600))); k != "sched:nightly:2026-01-01T00:00:00Z" {
		t.Errorf("Key = %q", k)
	}
	if got, ok := SlotOf("nightly", "sched:nightly:2026-01-01T00:00:00Z"); !ok || !got.Equal(slot) {
		t.Errorf("SlotOf = %s, %v", got, ok)
	}
	for _, key := range []string{"sched:nightly:2026-01-01T01:00:00+01:00", "sched:night:2026-01-01T00:00:00Z", "nightly", "sched:nightly:x"} {
		if _, ok := SlotOf("nightly", key); ok {
			t.Errorf("SlotOf(nightly, %q) accepted it", key)
		}
	}
}

// TestDue covers catch-up: an hourly-minute schedule whose cursor is an
// hour behind (everything was down), with Since, Start and End bounds.
func TestDue(t *testing.T) {
	now := utc("2026-01-01T12:00:30Z")
	base := Schedule{Every: task.Duration(time.Minute), Template: Template{Kind: "noop"}}
	win := Window{Cursor: utc("2026-01-01T11:00:00Z"), Now: now, Lead: time.Second, Late: 10 * time.Second, Max: 100}
	for _, c := range []struct {
		name   string
		modify func(s *Schedule, w *Window)
		want   []string
	}{
		{"none skips every missed slot", func(s *Schedule, w *Window) { s.CatchUp = CatchUp{Mode: CatchUpNone} }, nil},
		{"last runs the latest one", func(s *Schedule, w *Window) { s.CatchUp = CatchUp{Mode: CatchUpLast} },
			[]string{"12:00:00"}},
		{"all:3 runs the latest three", func(s *Schedule, w *Window) { s.CatchUp = CatchUp{Mode: CatchUpAll, N: 3} },
			[]string{"11:58:00", "11:59:00", "12:00:00"}},
		{"all:N is bounded by Max", func(s *Schedule, w *Window) { s.CatchUp = CatchUp{Mode: CatchUpAll, N: 1000}; w.Max = 4 },
			[]string{"11:57:00", "11:58:00", "11:59:00", "12:00:00"}},
		{"nothing at or before Since is owed", func(s *Schedule, w *Window) {
			s.CatchUp, s.Since = CatchUp{Mode: CatchUpAll, N: 100}, utc("2026-01-01T11:57:30Z")
		}, []string{"11:58:00", "11:59:00", "12:00:00"}},
		{"nothing after End", func(s *Schedule, w *Window) {
			s.CatchUp, s.End = CatchUp{Mode: CatchUpAll, N: 2}, utc("2026-01-01T11:30:00Z")
		}, []string{"11:29:00", "11:30:00"}},
		{"nothing before Start", func(s *Schedule, w *Window) {
			s.CatchUp, s.Start = CatchUp{Mode: CatchUpAll, N: 100}, utc("2026-01-01T11:58:00Z")
		}, []string{"11:58:00", "11:59:00", "12:00:00"}},
		{"on time: published Lead ahead", func(s *Schedule, w *Window) {
			s.CatchUp, w.Now, w.Cursor = CatchUp{Mode: CatchUpNone}, utc("2026-01-01T12:00:59.5Z"), utc("2026-01-01T12:00:00Z")
		}, []string{"12:01:00"}},
		{"on time: a slot a little late is not missed", func(s *Schedule, w *Window) {
			s.CatchUp, w.Now, w.Cursor = CatchUp{Mode: CatchUpNone}, utc("2026-01-01T12:01:05Z"), utc("2026-01-01T12:00:00Z")
		}, []string{"12:01:00"}},
		{"no history: nothing is owed", func(s *Schedule, w *Window) { s.CatchUp, w.Cursor = CatchUp{Mode: CatchUpAll, N: 5}, time.Time{} }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, w := base, win
			c.modify(&s, &w)
			got, err := s.Due(w)
			if err != nil {
				t.Fatal(err)
			}
			var hms []string
			for _, g := range got {
				hms = append(hms, g.Format(time.TimeOnly))
			}
			if strings.Join(hms, " ") != strings.Join(c.want, " ") {
				t.Errorf("Due = %v, want %v", hms, c.want)
			}
		})
	}
}

// TestDueFarBehind: a per-second cron ten years behind costs a look back
// over a few windows, not ten years of slots.
func TestDueFarBehind(t *testing.T) {
	s := Schedule{Cron: "* * * * * *", CatchUp: CatchUp{Mode: CatchUpAll, N: 2}}
	now := utc("2026-01-01T12:00:00Z")
	start := time.Now()
	got, err := s.Due(Window{Cursor: now.AddDate(-10, 0, 0), Now: now, Lead: time.Second, Late: 10 * time.Second, Max: 100})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Due took %s", d)
	}
	// The two latest missed (11:59:49, :50), then on time up to now+1s.
	if len(got) != 13 || got[0].Format(time.TimeOnly) != "11:59:49" || got[12].Format(time.TimeOnly) != "12:00:01" {
		t.Errorf("Due = %v", got)
	}
}

func TestValidate(t *testing.T) {
	ok := Schedule{Name: "n", Cron: "* * * * *", CatchUp: DefaultCatchUp, Template: Template{Kind: "noop"}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid schedule: %v", err)
	}
	for _, c := range []struct {
		field  string
		modify func(s *Schedule)
	}{
		{"name:", func(s *Schedule) { s.Name = "" }},
		{"name:", func(s *Schedule) { s.Name = "leasepool.retention" }},
		{"name:", func(s *Schedule) { s.Name = strings.Repeat("x", task.MaxNameLen) }},
		{"cron:", func(s *Schedule) { s.Cron = "" }},
		{"every:", func(s *Schedule) { s.Every = task.Duration(time.Minute) }},
		{"every:", func(s *Schedule) { s.Cron, s.Every = "", task.Duration(500*time.Millisecond) }},
		{"tz:", func(s *Schedule) { s.Cron, s.Every, s.TZ = "", task.Duration(time.Minute), "UTC" }},
		{"cron:", func(s *Schedule) { s.Cron = "61 * * * *" }},
		{"cron:", func(s *Schedule) { s.Cron = "* * *" }},
		{"cron:", func(s *Schedule) { s.Cron = "0 0 30 2 *" }},
		{"cron:", func(s *Schedule) { s.Cron = "TZ=UTC * * * * *" }},
		{"cron:", func(s *Schedule) { s.Cron = "@every 5s" }},
		{"tz:", func(s *Schedule) { s.TZ = "Mars/Olympus" }},
		{"tz:", func(s *Schedule) { s.TZ = "Local" }},
		{"end:", func(s *Schedule) { s.Start, s.End = utc("2026-01-02T00:00:00Z"), utc("2026-01-01T00:00:00Z") }},
		{"catch_up:", func(s *Schedule) { s.CatchUp = CatchUp{Mode: CatchUpAll} }},
		{"catch_up:", func(s *Schedule) { s.CatchUp = CatchUp{Mode: "some"} }},
		{"template: invalid: kind:", func(s *Schedule) { s.Template.Kind = "" }},
		{"template: invalid: payload:", func(s *Schedule) { s.Template.Payload = []byte("{") }},
		{"template: invalid: worker_timeout:", func(s *Schedule) { s.Template.WorkerTimeout = task.Duration(time.Millisecond) }},
	} {
		s := ok
		c.modify(&s)
		err := s.Validate()
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: Validate = %v, want one line wrapping ErrInvalid naming %q", s, err, c.field)
		}
	}
	for _, in := range []string{"", "all", "all:0", "all:x", "all:1001", "first"} {
		if _, err := ParseCatchUp(in); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "catch_up:") {
			t.Errorf("ParseCatchUp(%q) = %v", in, err)
		}
	}
	for in, want := range map[string]CatchUp{"none": {Mode: CatchUpNone}, "last": {Mode: CatchUpLast}, "all:7": {Mode: CatchUpAll, N: 7}} {
		if got, err := ParseCatchUp(in); err != nil || got != want || got.String() != in {
			t.Errorf("ParseCatchUp(%q) = %v, %v", in, got, err)
		}
	}
}
