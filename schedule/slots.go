package schedule

// Slot math: which instants a schedule names, and which of them a runner
// publishes now.

import (
	"fmt"
	"strings"
	"time"

	cron "github.com/netresearch/go-cron"
)

// cronParser reads 5 fields, or 6 with seconds first, and descriptors.
// DowOrDom keeps crontab(5)'s rule (as Vixie cron and cronie apply it):
// when both day-of-month and day-of-week are restricted a day matching
// either fires; a field starting with * counts as unrestricted.
var cronParser = cron.MustNewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom |
	cron.Month | cron.Dow | cron.Descriptor | cron.DowOrDom)

// timetable names a schedule's slots.
type timetable interface {
	// Next is the first slot strictly after t, or zero when there is none.
	Next(t time.Time) time.Time
}

// every is a fixed interval's slots: anchor + k×d for every integer k.
type every struct {
	anchor time.Time
	d      time.Duration
}

func (e every) Next(t time.Time) time.Time {
	if t.Before(e.anchor) {
		// Slots before the anchor exist too (k < 0); Start bounds them.
		k := (e.anchor.Sub(t) + e.d - 1) / e.d // ceil
		return e.anchor.Add(-(k - 1) * e.d)
	}
	k := t.Sub(e.anchor)/e.d + 1
	return e.anchor.Add(k * e.d)
}

// timetable parses s's cron expression in its zone, or builds its interval.
func (s *Schedule) timetable() (timetable, error) {
	if s.Every != 0 {
		anchor := s.Start
		if anchor.IsZero() {
			anchor = time.Unix(0, 0)
		}
		return every{anchor: anchor.UTC(), d: time.Duration(s.Every)}, nil
	}
	loc := time.UTC
	if s.TZ != "" {
		var err error
		if loc, err = time.LoadLocation(s.TZ); err != nil || s.TZ == "Local" {
			return nil, invalid("tz", fmt.Sprintf("%q is not an IANA time zone name", s.TZ))
		}
	}
	expr := strings.TrimSpace(s.Cron)
	switch {
	case strings.HasPrefix(expr, "TZ="), strings.HasPrefix(expr, "CRON_TZ="):
		return nil, invalid("cron", "give the time zone as tz, not in the expression")
	case strings.HasPrefix(expr, "@every"):
		return nil, invalid("cron", "use an interval (every) instead of @every")
	}
	sched, err := cronParser.Parse(expr)
	if err != nil {
		return nil, invalid("cron", fmt.Sprintf("%q: %s", s.Cron, strings.ReplaceAll(err.Error(), "\n", " ")))
	}
	spec, ok := sched.(*cron.SpecSchedule)
	if !ok {
		return nil, invalid("cron", fmt.Sprintf("%q is not a calendar expression", s.Cron))
	}
	spec.Location = loc
	if spec.Next(time.Now()).IsZero() {
		return nil, invalid("cron", fmt.Sprintf("%q matches no time in the next years", s.Cron))
	}
	return cronTimetable{spec: spec, fixedHour: spec.Hour&starBit == 0}, nil
}

// starBit marks a cron field given as * (go-cron's encoding).
const starBit = 1 << 63

// cronTimetable returns slots in UTC, as keys spell them. When clocks go
// back, an expression with fixed hours (30 2 * * *) runs at the first of
// the two instants of a repeated local time only, as cron(8) does; one
// whose hour is * runs through both passes.
type cronTimetable struct {
	spec      *cron.SpecSchedule
	fixedHour bool
}

func (c cronTimetable) Next(t time.Time) time.Time {
	for {
		n := c.spec.Next(t)
		if n.IsZero() || !c.fixedHour || !c.repeated(n) {
			return n.UTC()
		}
		t = n
	}
}

// repeated reports whether n's local time already happened earlier the
// same night: the zone's offset dropped in the hours before n, and n minus
// the drop reads the same on the clock.
func (c cronTimetable) repeated(n time.Time) bool {
	loc := c.spec.Location
	_, now := n.In(loc).Zone()
	_, before := n.Add(-3 * time.Hour).In(loc).Zone()
	if before <= now {
		return false
	}
	earlier := n.Add(-time.Duration(before-now) * time.Second)
	return earlier.In(loc).Format(time.DateTime) == n.In(loc).Format(time.DateTime)
}

// Window is what a runner knows when it decides what to publish.
type Window struct {
	// Cursor is the latest slot already published (zero: none).
	Cursor time.Time
	// Now is the store's clock.
	Now time.Time
	// Lead publishes slots up to this long before they fall due.
	Lead time.Duration
	// Late is how overdue a slot may be and still count as on time; older
	// ones are missed and follow the catch-up policy.
	Late time.Duration
	// Max bounds the slots returned.
	Max int
}

// Due returns the slots to publish now, oldest first: the on-time slots in
// (Now−Late, Now+Lead] after the cursor, preceded by the latest missed
// slots that the catch-up policy keeps. Slots outside [Start, End] and at
// or before Since are never due.
func (s *Schedule) Due(w Window) ([]time.Time, error) {
	tt, err := s.timetable()
	if err != nil {
		return nil, err
	}
	from := latest(w.Cursor, s.Since, s.Start.Add(-time.Nanosecond))
	if from.IsZero() {
		from = w.Now.Add(-w.Late) // no history: nothing is owed
	}
	onTime := w.Now.Add(-w.Late)
	upTo := w.Now.Add(w.Lead)
	if !s.End.IsZero() && s.End.Before(upTo) {
		upTo = s.End
	}
	var out []time.Time
	if keep := s.CatchUp.keep(); keep > 0 && from.Before(onTime) {
		out = lastSlots(tt, from, minTime(onTime, upTo), min(keep, w.Max))
	}
	for t := tt.Next(latest(from, onTime)); !t.IsZero() && !t.After(upTo) && len(out) < w.Max; t = tt.Next(t) {
		out = append(out, t)
	}
	return out, nil
}

// lastSlots returns the latest n slots in (from, to], oldest first. It
// looks back over a window that doubles until it holds n slots or reaches
// from, so its cost follows n, not how long ago from was.
func lastSlots(tt timetable, from, to time.Time, n int) []time.Time {
	for span := time.Minute; ; span *= 2 {
		lo := to.Add(-span)
		if !lo.After(from) || span > 100*365*24*time.Hour {
			lo = from
		}
		var got []time.Time
		for t := tt.Next(lo); !t.IsZero() && !t.After(to); t = tt.Next(t) {
			got = append(got, t)
			if len(got) > n {
				got = got[1:]
			}
		}
		if len(got) >= n || lo.Equal(from) {
			return got
		}
	}
}

func latest(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
