// What a simulation saw, and its summary.

package device

import (
	"fmt"
	"io"
	"time"
)

// Run is one command a simulated device ran.
type Run struct {
	Device        string `json:"device"`
	TaskKey       string `json:"task_key"`
	Attempt       int    `json:"attempt"`
	CorrelationID string `json:"correlation_id"`
	Command       string `json:"command"`
	// SentAt is when the worker sent the copy the device ran.
	SentAt time.Time `json:"sent_at"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	OK     bool      `json:"ok"`
	// Traceparent is the trace context the command carried: the span of
	// the attempt that sent it.
	Traceparent string `json:"traceparent,omitempty"`
}

// Overlap is a command that arrived while another ran (or waited) on the
// same device: the one-command-per-device rule was broken.
type Overlap struct {
	Device         string    `json:"device"`
	RunningTask    string    `json:"running_task"`
	RunningAttempt int       `json:"running_attempt"`
	TaskKey        string    `json:"task_key"`
	Attempt        int       `json:"attempt"`
	At             time.Time `json:"at"`
}

// StaleAttempt is a command refused because a later attempt of its task
// had been seen.
type StaleAttempt struct {
	Device  string    `json:"device"`
	TaskKey string    `json:"task_key"`
	Attempt int       `json:"attempt"`
	Highest int       `json:"highest"`
	At      time.Time `json:"at"`
}

// Outage is one time a simulated device was away: cut at From, kept away
// until Until, back at Back (its online status published; zero while
// still away).
type Outage struct {
	Device string    `json:"device"`
	From   time.Time `json:"from"`
	Until  time.Time `json:"until"`
	Back   time.Time `json:"back,omitzero"`
}

// Late is how long after Until the device was back (its online status
// published), or -1 while it is still away.
func (o Outage) Late() time.Duration {
	if o.Back.IsZero() {
		return -1
	}
	return o.Back.Sub(o.Until)
}

// Counts are one simulated device's counters.
type Counts struct {
	ID          string `json:"id"`
	Received    int    `json:"received"`
	Duplicates  int    `json:"duplicates"`
	Ran         int    `json:"ran"`
	Failed      int    `json:"failed"`
	DroppedAcks int    `json:"dropped_acks"`
	Outages     int    `json:"outages"`
	Expired     int    `json:"expired"`
	BadMessages int    `json:"bad_messages"`
}

// Report is what a simulation saw.
type Report struct {
	Devices       []Counts       `json:"devices"`
	Runs          []Run          `json:"runs"`
	Overlaps      []Overlap      `json:"overlaps"`
	StaleAttempts []StaleAttempt `json:"stale_attempts"`
	Outages       []Outage       `json:"outages"`
}

// Totals sums the device counters.
func (r *Report) Totals() Counts {
	var t Counts
	t.ID = "total"
	for _, d := range r.Devices {
		t.Received += d.Received
		t.Duplicates += d.Duplicates
		t.Ran += d.Ran
		t.Failed += d.Failed
		t.DroppedAcks += d.DroppedAcks
		t.Outages += d.Outages
		t.Expired += d.Expired
		t.BadMessages += d.BadMessages
	}
	return t
}

// WriteSummary prints one line per device, the totals, and every overlap
// and stale attempt.
func (r *Report) WriteSummary(w io.Writer) error {
	line := func(d Counts) string {
		return fmt.Sprintf("%-16s %8d %6d %6d %6d %8d %7d %7d %4d\n", d.ID, d.Received, d.Duplicates, d.Ran, d.Failed, d.DroppedAcks, d.Outages, d.Expired, d.BadMessages)
	}
	out := fmt.Sprintf("%-16s %8s %6s %6s %6s %8s %7s %7s %4s\n", "DEVICE", "RECEIVED", "DUPS", "RAN", "FAILED", "NOACKS", "OUTAGES", "EXPIRED", "BAD")
	for _, d := range r.Devices {
		out += line(d)
	}
	out += line(r.Totals())
	out += fmt.Sprintf("overlaps: %d, stale attempts: %d\n", len(r.Overlaps), len(r.StaleAttempts))
	for _, o := range r.Overlaps {
		out += fmt.Sprintf("OVERLAP %s: %s#%d arrived while %s#%d ran (%s)\n", o.Device, o.TaskKey, o.Attempt, o.RunningTask, o.RunningAttempt, o.At.Format(time.RFC3339Nano))
	}
	for _, s := range r.StaleAttempts {
		out += fmt.Sprintf("STALE %s: %s attempt %d < %d (%s)\n", s.Device, s.TaskKey, s.Attempt, s.Highest, s.At.Format(time.RFC3339Nano))
	}
	_, err := io.WriteString(w, out)
	return err
}
