// Package retention removes finished tasks once they are old enough: every
// worker runs a Runner, and the one holding its lease (a singleton, see
// internal/singleton) deletes every minute, in bounded batches, the tasks
// that finished (succeeded, failed or cancelled) longer ago than the stored
// policy allows, and the device states not seen for as long. A holder that
// dies is replaced within a lease; the store's conditional delete never
// touches a task that is not finished, or that was rerun since.
package retention

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Names in the store.
const (
	// LockKey is the key of the Runner's lease in the lock table.
	LockKey = "leasepool.retention"
	// RecordKind and recordID hold the stored policy.
	RecordKind = "retention"
	recordID   = "policy"
)

// Defaults.
const (
	// DefaultEvery is how often the Runner's holder runs.
	DefaultEvery = time.Minute
	// DefaultBatch bounds one delete, so a large backlog never holds the
	// store long enough to stall claims.
	DefaultBatch = 500
	// DefaultMaxPerRun bounds one run; the next run carries on.
	DefaultMaxPerRun = 100_000
)

// Forever in a Policy field keeps those tasks.
const Forever = task.Duration(-1)

// Policy is how long finished tasks are kept, by state, after their last
// write (updated_at: when they finished or were cancelled), and how long
// the state of a device not heard from is kept.
type Policy struct {
	Succeeded task.Duration `json:"succeeded"`
	Failed    task.Duration `json:"failed"`
	Cancelled task.Duration `json:"cancelled"`
	// DeviceStates bounds the device-state records (mqttdev) by when the
	// device was last seen. Zero (a policy stored before it existed) means
	// the default.
	DeviceStates task.Duration `json:"device_states,omitempty"`
}

// DefaultPolicy keeps failures a week for inspection and the rest a day;
// a device unseen for 30 days is forgotten.
var DefaultPolicy = Policy{
	Succeeded:    task.Duration(24 * time.Hour),
	Failed:       task.Duration(7 * 24 * time.Hour),
	Cancelled:    task.Duration(24 * time.Hour),
	DeviceStates: task.Duration(30 * 24 * time.Hour),
}

// DeviceStateKind is the record kind mqttdev keeps device states under
// (tests/retention_test.go checks that the two agree).
const DeviceStateKind = "device-state"

// Validate accepts a positive period or Forever in each field.
func (p Policy) Validate() error {
	for _, f := range []struct {
		name string
		d    task.Duration
	}{{"succeeded", p.Succeeded}, {"failed", p.Failed}, {"cancelled", p.Cancelled}, {"device_states", p.withDefaults().DeviceStates}} {
		if f.d <= 0 && f.d != Forever {
			return fmt.Errorf("%w: %s: %s: want a positive period, or -1 to keep forever", task.ErrInvalid, f.name, time.Duration(f.d))
		}
	}
	return nil
}

func (p Policy) withDefaults() Policy {
	if p.DeviceStates == 0 {
		p.DeviceStates = DefaultPolicy.DeviceStates
	}
	return p
}

// keep returns the period for state and whether it is bounded.
func (p Policy) keep(state task.State) (time.Duration, bool) {
	d := map[task.State]task.Duration{task.StateSucceeded: p.Succeeded, task.StateFailed: p.Failed, task.StateCancelled: p.Cancelled}[state]
	return time.Duration(d), d > 0
}

// Get returns the stored policy, or DefaultPolicy when none is stored.
func Get(ctx context.Context, s task.Store) (Policy, error) {
	rs, ok := s.(task.RecordStore)
	if !ok {
		return DefaultPolicy, nil
	}
	recs, err := rs.Records(ctx, RecordKind)
	if err != nil {
		return Policy{}, fmt.Errorf("retention policy: %w", err)
	}
	for _, r := range recs {
		if r.ID == recordID {
			var p Policy
			if err := json.Unmarshal(r.Value, &p); err != nil {
				return Policy{}, fmt.Errorf("retention policy: stored record: %w", err)
			}
			return p, nil
		}
	}
	return DefaultPolicy, nil
}

// Set stores p for every worker; it applies from the next run.
func Set(ctx context.Context, s task.Store, p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	rs, ok := s.(task.RecordStore)
	if !ok {
		return fmt.Errorf("retention policy: store %T has no shared records", s)
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return rs.PutRecord(ctx, task.Record{Kind: RecordKind, ID: recordID, Value: b, At: s.Now()})
}

// Config configures a run of retention. Zero values take defaults.
type Config struct {
	Store     task.Store
	Batch     int // DefaultBatch
	MaxPerRun int // DefaultMaxPerRun
	Logger    *slog.Logger
}

// Counts is how many tasks a run deleted, by state, and how many device
// states (under task.State(DeviceStateKind)).
type Counts map[task.State]int

// Total is the sum over states.
func (c Counts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// Run deletes, in batches of cfg.Batch and at most cfg.MaxPerRun in all,
// the finished tasks older than the stored policy allows, and returns how
// many of each state. It stops early when ctx ends (the lease is lost, or
// the worker stops): the next run carries on.
func Run(ctx context.Context, cfg Config) (Counts, error) {
	p, err := Get(ctx, cfg.Store)
	if err != nil {
		return nil, err
	}
	batch, budget := max(cfg.Batch, 1), cfg.MaxPerRun
	if budget <= 0 {
		budget = DefaultMaxPerRun
	}
	now := cfg.Store.Now()
	n := Counts{}
	for _, state := range []task.State{task.StateSucceeded, task.StateFailed, task.StateCancelled} {
		keep, bounded := p.keep(state)
		if !bounded {
			continue
		}
		for budget > 0 {
			if err := ctx.Err(); err != nil {
				return n, context.Cause(ctx)
			}
			got, err := cfg.Store.DeleteFinished(ctx, task.DeleteParams{State: state, Before: now.Add(-keep), Limit: min(batch, budget)})
			if err != nil {
				return n, fmt.Errorf("retention: %w", err)
			}
			n[state] += got
			budget -= got
			if got < batch {
				break
			}
		}
	}
	devices, err := deleteDeviceStates(ctx, cfg.Store, time.Duration(p.withDefaults().DeviceStates), now, budget)
	if devices > 0 {
		n[task.State(DeviceStateKind)] = devices
	}
	return n, err
}

// deleteDeviceStates deletes the device-state records last seen more than
// keep ago. A device heard from between the read and the delete loses its
// record until its next status message puts it again.
func deleteDeviceStates(ctx context.Context, s task.Store, keep time.Duration, now time.Time, budget int) (int, error) {
	rs, ok := s.(task.RecordStore)
	rd, ok2 := s.(task.RecordDeleter)
	if keep <= 0 || !ok || !ok2 {
		return 0, nil
	}
	recs, err := rs.Records(ctx, DeviceStateKind)
	if err != nil {
		return 0, fmt.Errorf("retention: device states: %w", err)
	}
	n := 0
	for _, r := range recs {
		if n >= budget || !r.At.Before(now.Add(-keep)) {
			continue
		}
		if err := rd.DeleteRecord(ctx, DeviceStateKind, r.ID); err != nil {
			return n, fmt.Errorf("retention: device states: %w", err)
		}
		n++
	}
	return n, nil
}
