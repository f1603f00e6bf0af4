package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// MaxDebounce bounds PublishParams.Debounce: a debounce is a quiet period
// of a burst of publishes, not a schedule (use run_at for that).
const MaxDebounce = 24 * time.Hour

// errClaimed is Debounce's refusal of a task a worker has claimed: the
// publish leaves it as it is (Existing).
var errClaimed = errors.New("task claimed")

// validateDebounce checks PublishParams.Debounce; zero is off.
func validateDebounce(d time.Duration) error {
	switch {
	case d < 0:
		return invalid("debounce", fmt.Sprintf("(%s) must be positive", d))
	case d > MaxDebounce:
		return invalid("debounce", fmt.Sprintf("(%s) must be at most %s", d, MaxDebounce))
	}
	return nil
}

// ValidateDebounce checks a debounce given explicitly (the API's field,
// the CLI's flag), where zero is a mistake rather than "off". Its errors
// wrap ErrInvalid and name field.
func ValidateDebounce(field string, d time.Duration) error {
	switch {
	case d <= 0:
		return invalid(field, fmt.Sprintf("(%s) must be positive", d))
	case d > MaxDebounce:
		return invalid(field, fmt.Sprintf("(%s) must be at most %s", d, MaxDebounce))
	}
	return nil
}

// Debounceable reports whether a debounced publish may still change t:
// pending and never claimed. Once any worker has claimed it (running,
// retrying after a failure, snoozed) or it finished, its payload is what
// a handler saw or may be seeing, and stays.
func (t *Task) Debounceable() bool {
	return t.State == StatePending && t.AttemptsStarted == 0 && len(t.Attempts) == 0 && !t.Cancelled
}

// Debounce replaces a debounceable task's payload (and trace, when given)
// and moves its run_at to runAt: the task then runs once, after the last
// of a burst of publishes, with the last payload. A task that is not
// debounceable is left as it is, with errClaimed.
func (t *Task) Debounce(payload json.RawMessage, trace Trace, runAt, now time.Time) error {
	if !t.Debounceable() {
		return fmt.Errorf("debounce %s: %w (it is %s, %d attempts)", t.Key, errClaimed, t.State, t.AttemptsStarted)
	}
	if len(payload) == 0 {
		payload = json.RawMessage("{}")
	}
	t.Payload = slices.Clone(payload)
	if !trace.IsZero() {
		t.Trace = trace
	}
	t.RunAt = clampTime(runAt).UTC()
	t.touch(now)
	return nil
}

// debounceRunAt is when a debounced publish at now lets its task run: a
// debounce after now, or p.RunAt when that is later.
func (p PublishParams) debounceRunAt(now time.Time) time.Time {
	at := now.Add(p.Debounce)
	if p.RunAt.After(at) {
		at = p.RunAt
	}
	return at
}
