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
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Names in the store.
const (
	// LockKey is the key of the Runner's lease in the lock table.
	LockKey = "leasepool.retention"
	// Namespace and PolicyID name the document (task.Document) of the
	// stored policy.
	Namespace = "leasepool.retention"
	PolicyID  = "policy"
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
	// DeviceStates bounds the device states (mqttdev) by when the device
	// was last seen. Zero (a policy stored before it existed) means
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

// DeviceStateNamespace is the namespace of the documents mqttdev keeps
// device states in (mqttdev.StateNamespace; tests/retention_test.go
// checks that the two agree).
const DeviceStateNamespace = "leasepool.device-state"

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

// Get returns the stored policy, or DefaultPolicy when none is stored. A
// stored policy that does not decode or validate is an error (and is
// reported to task.SkipMalformed): retention deletes nothing by it.
func Get(ctx context.Context, s task.Store) (Policy, error) {
	p, _, err := get(ctx, s)
	return p, err
}

func get(ctx context.Context, s task.Store) (Policy, task.Document, error) {
	d, err := s.GetDocument(ctx, Namespace, PolicyID)
	if errors.Is(err, task.ErrNotFound) {
		return DefaultPolicy, task.Document{Namespace: Namespace, ID: PolicyID}, nil
	}
	if err != nil {
		return Policy{}, d, fmt.Errorf("retention policy: %w", err)
	}
	var p Policy
	if err = json.Unmarshal(d.Value, &p); err == nil {
		err = p.Validate()
	}
	if err != nil {
		task.SkipMalformed(Namespace, PolicyID+"@"+strconv.FormatInt(d.Version, 10), err)
		return Policy{}, d, fmt.Errorf("%w: retention policy: stored document %s/%s: %w (Set replaces it)", task.ErrInvalid, Namespace, PolicyID, err)
	}
	return p, d, nil
}

// Set stores p for every worker; it applies from the next run. It
// replaces a stored policy that does not decode.
func Set(ctx context.Context, s task.Store, p Policy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	for {
		_, d, err := get(ctx, s)
		if err != nil && !errors.Is(err, task.ErrInvalid) {
			return err
		}
		d.Value = b
		_, err = s.PutDocument(task.WithInternalWrite(ctx), d)
		if !errors.Is(err, task.ErrConflict) {
			if err != nil {
				return fmt.Errorf("retention policy: %w", err)
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// Config configures a run of retention. Zero values take defaults.
type Config struct {
	Store     task.Store
	Batch     int // DefaultBatch
	MaxPerRun int // DefaultMaxPerRun
	Logger    *slog.Logger
}

// Counts is how many tasks a run deleted, by state, and how many device
// states (under task.State(DeviceStateNamespace)).
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
		n[task.State(DeviceStateNamespace)] = devices
	}
	return n, err
}

// deleteDeviceStates deletes the device states last seen more than keep
// ago (by the state's seen_at, or for a document without one, by its last
// write). Each delete is conditional on the version read, so a device
// heard from since keeps its state.
func deleteDeviceStates(ctx context.Context, s task.Store, keep time.Duration, now time.Time, budget int) (int, error) {
	if keep <= 0 {
		return 0, nil
	}
	docs, err := s.Documents(ctx, DeviceStateNamespace)
	if err != nil {
		return 0, fmt.Errorf("retention: device states: %w", err)
	}
	n := 0
	for _, d := range docs {
		if n >= budget {
			break
		}
		var v struct {
			SeenAt time.Time `json:"seen_at"`
		}
		seen := d.UpdatedAt
		if json.Unmarshal(d.Value, &v) == nil && !v.SeenAt.IsZero() {
			seen = v.SeenAt
		}
		if !seen.Before(now.Add(-keep)) {
			continue
		}
		err := s.DeleteDocument(ctx, DeviceStateNamespace, d.ID, d.Version)
		if errors.Is(err, task.ErrConflict) || errors.Is(err, task.ErrNotFound) {
			continue // heard from, or deleted, since it was read
		}
		if err != nil {
			return n, fmt.Errorf("retention: device states: %w", err)
		}
		n++
	}
	return n, nil
}
