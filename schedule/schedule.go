// Package schedule is leasepool's repeatable tasks: a stored schedule (a
// cron expression or a fixed interval, a time zone, a start and an end, a
// task template and a catch-up policy) and the Runner every worker runs,
// which publishes each slot as an ordinary task keyed by schedule name and
// slot time. Publish is idempotent, so any number of runners publishing
// the same slot make one task: exactly one task per slot, with no leader.
package schedule

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // a zone named in a schedule must resolve on every host alike

	"github.com/leasepool/leasepool/task"
)

// Schedule is one stored schedule. JSON names are those of the record.
type Schedule struct {
	Name string `json:"name"`
	// Cron is a cron expression: 5 fields (minute hour day-of-month month
	// day-of-week), or 6 with seconds first, or a descriptor (@hourly,
	// @daily, ...). Exactly one of Cron and Every is set.
	Cron string `json:"cron,omitempty"`
	// Every is a fixed interval (at least MinEvery); its slots are Start +
	// k×Every, or multiples of Every since the Unix epoch without Start.
	Every task.Duration `json:"every,omitempty"`
	// TZ is the IANA zone Cron is read in; empty means UTC (never the
	// worker's local zone: every host must compute the same slots).
	TZ string `json:"tz,omitempty"`
	// Start and End bound the slots (both inclusive); zero: unbounded.
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
	// CatchUp says what to do with slots missed while no worker ran.
	CatchUp CatchUp `json:"catch_up"`
	// Paused schedules publish nothing; slots passed while paused are
	// not owed on resume.
	Paused   bool     `json:"paused,omitempty"`
	Template Template `json:"template"`
	// Since: slots at or before it are never published. Add and Resume set
	// it to the store's now, so a new or resumed schedule owes nothing
	// from before.
	Since     time.Time `json:"since"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// MinEvery is the shortest interval: slots are published by runners that
// poll about once a second.
const MinEvery = time.Second

// MaxCatchUp bounds CatchUp all:N.
const MaxCatchUp = 1000

// KeyPrefix starts every occurrence's task key: sched:<name>:<slot>.
const KeyPrefix = "sched:"

// slotFormat is the slot's spelling in a key: UTC, so one instant has one key.
const slotFormat = time.RFC3339Nano

// internalPrefix is kept for schedules of leasepool's own.
const internalPrefix = "leasepool."

// Key is the task key of name's occurrence at slot.
func Key(name string, slot time.Time) string {
	return KeyPrefix + name + ":" + slot.UTC().Format(slotFormat)
}

// SlotOf returns the slot of key when key is an occurrence of the schedule
// name (see Key).
func SlotOf(name, key string) (time.Time, bool) {
	rest, ok := strings.CutPrefix(key, KeyPrefix+name+":")
	if !ok {
		return time.Time{}, false
	}
	slot, err := time.Parse(slotFormat, rest)
	if err != nil || Key(name, slot) != key {
		return time.Time{}, false
	}
	return slot.UTC(), true
}

// CatchUpMode is a catch-up policy's kind.
type CatchUpMode string

const (
	CatchUpNone CatchUpMode = "none" // missed slots are skipped
	CatchUpLast CatchUpMode = "last" // the latest missed slot runs once
	CatchUpAll  CatchUpMode = "all"  // the latest N missed slots run
)

// CatchUp is what a runner does with slots missed while no worker ran: a
// slot is missed once it is more than RunnerConfig.Late overdue.
type CatchUp struct {
	Mode CatchUpMode
	N    int // for CatchUpAll
}

// DefaultCatchUp runs one occurrence for a run of missed slots, as a
// person restarting a cluster after an outage usually wants.
var DefaultCatchUp = CatchUp{Mode: CatchUpLast}

// ParseCatchUp reads none, last or all:N.
func ParseCatchUp(s string) (CatchUp, error) {
	switch {
	case s == string(CatchUpNone), s == string(CatchUpLast):
		return CatchUp{Mode: CatchUpMode(s)}, nil
	case strings.HasPrefix(s, "all:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "all:"))
		if err != nil || n < 1 || n > MaxCatchUp {
			return CatchUp{}, invalid("catch_up", fmt.Sprintf("%q: N in all:N must be a number from 1 to %d", s, MaxCatchUp))
		}
		return CatchUp{Mode: CatchUpAll, N: n}, nil
	}
	return CatchUp{}, invalid("catch_up", fmt.Sprintf("%q is not one of none, last, all:N", s))
}

func (c CatchUp) String() string {
	if c.Mode == CatchUpAll {
		return fmt.Sprintf("all:%d", c.N)
	}
	return string(c.Mode)
}

// keep is how many of the latest missed slots c publishes.
func (c CatchUp) keep() int {
	switch c.Mode {
	case CatchUpLast:
		return 1
	case CatchUpAll:
		return c.N
	}
	return 0
}

func (c CatchUp) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

func (c *CatchUp) UnmarshalText(b []byte) error {
	v, err := ParseCatchUp(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// Template is the task each occurrence publishes: kind, payload and the
// options of task.Options a repeated task can have (no RunAt: the slot is).
type Template struct {
	Kind                 string          `json:"kind"`
	Payload              json.RawMessage `json:"payload,omitempty"`
	Priority             int             `json:"priority,omitempty"`
	SpecificWorkerIDs    []string        `json:"specific_worker_ids,omitempty"`
	ConcurrentWorkerCnt  int             `json:"concurrent_worker_cnt,omitempty"`
	SuccessWorkerCnt     int             `json:"success_worker_cnt,omitempty"`
	MaxUnexpectedRetries int             `json:"max_unexpected_retries,omitempty"`
	PingInterval         task.Duration   `json:"ping_interval,omitempty"`
	WorkerTimeout        task.Duration   `json:"worker_timeout,omitempty"`
	LockKeys             []string        `json:"lock_keys,omitempty"`
}

// NewTemplate builds a template from what a publish takes; o.RunAt is
// ignored.
func NewTemplate(kind string, payload json.RawMessage, o task.Options) Template {
	return Template{
		Kind: kind, Payload: payload, Priority: o.Priority, SpecificWorkerIDs: o.SpecificWorkerIDs,
		ConcurrentWorkerCnt: o.ConcurrentWorkerCnt, SuccessWorkerCnt: o.SuccessWorkerCnt,
		MaxUnexpectedRetries: o.MaxUnexpectedRetries, PingInterval: task.Duration(o.PingInterval),
		WorkerTimeout: task.Duration(o.WorkerTimeout), LockKeys: o.LockKeys,
	}
}

// Params is the publish of name's occurrence at slot: claimable from slot.
func (t Template) Params(name string, slot time.Time) task.PublishParams {
	return task.PublishParams{
		Key: Key(name, slot), Kind: t.Kind, Payload: t.Payload,
		Options: task.Options{
			Priority: t.Priority, RunAt: slot, SpecificWorkerIDs: t.SpecificWorkerIDs,
			ConcurrentWorkerCnt: t.ConcurrentWorkerCnt, SuccessWorkerCnt: t.SuccessWorkerCnt,
			MaxUnexpectedRetries: t.MaxUnexpectedRetries, PingInterval: time.Duration(t.PingInterval),
			WorkerTimeout: time.Duration(t.WorkerTimeout), LockKeys: t.LockKeys,
		},
	}
}

// Validate checks s as given and changes nothing. Its errors wrap
// task.ErrInvalid and name the field, on one line.
func (s *Schedule) Validate() error {
	if err := validateName(s.Name); err != nil {
		return err
	}
	if strings.HasPrefix(s.Name, internalPrefix) {
		return invalid("name", fmt.Sprintf("%q: the prefix %q is leasepool's own", s.Name, internalPrefix))
	}
	return s.validateBody()
}

func validateName(name string) error {
	if err := task.ValidateName("name", name); err != nil {
		return err
	}
	if !task.PathNameable(name) { // /api/v1/schedules/NAME/pause must reach it
		return invalid("name", fmt.Sprintf("%q cannot be named in a URL path", name))
	}
	// The occurrence key must be a valid task key too.
	longest := Key(name, time.Date(2000, 1, 1, 0, 0, 0, 1, time.UTC))
	if len(longest) > task.MaxNameLen {
		return invalid("name", fmt.Sprintf("is longer than %d bytes", task.MaxNameLen-len(longest)+len(name)))
	}
	return nil
}

// validateBody checks everything but the name's reservation, so built-in
// schedules pass through the same checks.
func (s *Schedule) validateBody() error {
	switch {
	case s.Cron == "" && s.Every == 0:
		return invalid("cron", "give a cron expression or an interval (every)")
	case s.Cron != "" && s.Every != 0:
		return invalid("every", "give either a cron expression or an interval, not both")
	case s.Every != 0 && time.Duration(s.Every) < MinEvery:
		return invalid("every", fmt.Sprintf("(%s) must be at least %s", time.Duration(s.Every), MinEvery))
	case s.Every != 0 && s.TZ != "":
		return invalid("tz", "applies to cron expressions only (an interval is the same in every zone)")
	}
	if _, err := s.timetable(); err != nil {
		return err
	}
	if err := task.ValidateTime("start", s.Start); err != nil {
		return err
	}
	if err := task.ValidateTime("end", s.End); err != nil {
		return err
	}
	if !s.Start.IsZero() && !s.End.IsZero() && s.End.Before(s.Start) {
		return invalid("end", fmt.Sprintf("(%s) is before start (%s)", s.End.Format(time.RFC3339), s.Start.Format(time.RFC3339)))
	}
	switch s.CatchUp.Mode {
	case CatchUpNone, CatchUpLast:
	case CatchUpAll:
		if s.CatchUp.N < 1 || s.CatchUp.N > MaxCatchUp {
			return invalid("catch_up", fmt.Sprintf("N in all:N must be from 1 to %d, got %d", MaxCatchUp, s.CatchUp.N))
		}
	default:
		return invalid("catch_up", fmt.Sprintf("%q is not one of none, last, all:N", s.CatchUp.Mode))
	}
	p := s.Template.Params(s.Name, time.Now())
	if err := p.Validate(); err != nil {
		return fmt.Errorf("template: %w", err)
	}
	return nil
}

func invalid(field, msg string) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, msg)
}
