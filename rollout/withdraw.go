// Ending a rollout: withdrawing queued commands when it aborts or is
// cancelled, then the rollback; and publishing what a step recorded.

package rollout

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// errLive: the task has a live attempt, which is left to finish.
var errLive = errors.New("a live attempt runs")

// withdraw cancels the commands not yet running (and makes sure a
// command recorded but never published can no longer be), waits for the
// running ones to end, and then records the rollout aborted or cancelled:
// no command is sent after that moment, which is read after every
// command was seen over (now, the step's start, may be earlier: a
// command claimed since may have run and ended).
func (s *Stepper) withdraw(ctx context.Context, r *Rollout, now time.Time) (bool, error) {
	changed, running := false, 0
	for i := range r.Devices {
		e := &r.Devices[i]
		switch e.Outcome {
		case "":
			if !r.Waves[e.Wave].StartedAt.IsZero() {
				e.Outcome, e.EndedAt, changed = OutcomeCancelled, now, true // queued in a started wave
				continue
			}
			e.Outcome, changed = OutcomeSkipped, true
		case OutcomeQueued:
			e.Outcome, e.EndedAt, changed = OutcomeCancelled, now, true
		case OutcomeRunning:
			key := TaskKey(r.Name, e.Device, e.Attempt)
			t, err := s.withdrawTask(ctx, r, e, key)
			if err != nil {
				return false, err
			}
			if t == nil {
				running++
				continue
			}
			// Cancelled here, or ended on its own since refresh looked:
			// a command that succeeded is rolled back like the others.
			e.Outcome, e.Error = settled(t, r, r.Spec.command(e.Device, false), key)
			e.EndedAt, e.Published, changed = now, true, true
			s.record(key, false)
		}
	}
	if running > 0 {
		return changed, nil
	}
	if at := s.st.Now().UTC(); at.After(now) {
		now = at
	}
	// Every execution of the waves that ran has ended now, and no wave
	// starts any more: they end with the rollout.
	for w := range r.Waves {
		if wave := &r.Waves[w]; !wave.StartedAt.IsZero() && wave.EndedAt.IsZero() {
			wave.EndedAt, wave.Stopped = now, true
		}
	}
	typ := EventCancelled
	if r.State == StateAborting {
		r.State, typ = StateAborted, EventAborted
		if r.Spec.RollbackCommand != "" {
			r.Rollback = &Rollback{Command: r.Spec.RollbackCommand, StartedAt: now}
			n := 0
			for i := range r.Devices {
				if r.Devices[i].Outcome == OutcomeSucceeded {
					r.Devices[i].Rollback = OutcomeQueued
					n++
				}
			}
			r.event(now, EventAborted, r.Reason)
			r.event(now, EventRollbackStarted, fmt.Sprintf("%s on %d devices", r.Spec.RollbackCommand, n))
			r.EndedAt = now
			return true, nil
		}
	} else {
		r.State = StateCancelled
	}
	r.EndedAt = now
	r.event(now, typ, r.Reason)
	return true, nil
}

// withdrawTask cancels the task of a running execution unless an attempt
// of it is live; once the execution is over (cancelled, never to be
// published, or ended on its own) it returns the task, else nil.
func (s *Stepper) withdrawTask(ctx context.Context, r *Rollout, e *Exec, key string) (*task.Task, error) {
	t, err := s.st.Get(ctx, key)
	if errors.Is(err, task.ErrNotFound) {
		// Recorded, not published (or not yet): take the key with a
		// cancelled task, so a driver that publishes it late inserts
		// nothing.
		p, err := publishParams(r, e.Device, key, false)
		if err != nil {
			return nil, err
		}
		p.RunAt = s.st.Now().Add(24 * time.Hour)
		if t, _, err = task.Publish(ctx, s.st, p); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if t.State.Finished() {
		return t, nil
	}
	t, err = task.ModifyFrom(ctx, s.st, key, t, func(t *task.Task) error {
		if t.State.Finished() {
			return nil
		}
		now := s.st.Now()
		for _, a := range t.Attempts {
			if a.Live(now) {
				return errLive
			}
		}
		return t.Cancel(now)
	})
	switch {
	case errors.Is(err, errLive):
		return nil, nil
	case err != nil:
		return nil, err
	}
	return t, nil
}

// settled is how the finished task t of an execution ended, in a rollout
// that retries and resends nothing any more: a lost worker counts as
// timed out, and a task at key that would not send want (not the
// rollout's) as failed.
func settled(t *task.Task, r *Rollout, want mqttdev.Command, key string) (Outcome, string) {
	if why := foreign(t, r, want); why != "" {
		return OutcomeFailed, foreignError(key, why)
	}
	o, msg, lost := classify(t)
	if lost {
		o = OutcomeTimedOut
	}
	return o, msg
}

// rollback publishes the rollback command to each device that succeeded
// and records how it ended: with whole, reading every running rollback's
// task, else those the feed named (ended).
func (s *Stepper) rollback(ctx context.Context, r *Rollout, now time.Time, whole bool, ended map[string]bool) (bool, error) {
	changed, open := false, 0
	for i := range r.Devices {
		e := &r.Devices[i]
		key := RollbackKey(r.Name, e.Device)
		switch e.Rollback {
		case OutcomeQueued:
			p, err := publishParams(r, e.Device, key, true)
			if err != nil {
				return false, err
			}
			if _, _, err := task.Publish(ctx, s.st, p); err != nil {
				return false, err
			}
			e.Rollback, changed = OutcomeRunning, true
			open++
		case OutcomeRunning:
			if !whole && !ended[key] {
				open++
				continue
			}
			t, err := s.st.Get(ctx, key)
			if errors.Is(err, task.ErrNotFound) {
				e.Rollback, changed = OutcomeQueued, true // publish again
				open++
				continue
			}
			if err != nil {
				return false, err
			}
			if foreign(t, r, r.Spec.command(e.Device, true)) != "" {
				e.Rollback, changed = OutcomeFailed, true
				continue
			}
			if !t.State.Finished() {
				open++
				continue
			}
			o, _, lost := classify(t)
			if lost {
				o = OutcomeTimedOut
			}
			e.Rollback, changed = o, true
		}
	}
	if open == 0 {
		r.Rollback.EndedAt = now
		var c Counts
		for _, e := range r.Devices {
			if e.Rollback != "" {
				c.add(e.Rollback)
			}
		}
		r.event(now, EventRollbackEnded, fmt.Sprintf("%d rolled back, %d failed", c.Succeeded, c.Failures()))
		changed = true
	}
	return changed, nil
}

// publishParams is the device task of device's execution (or rollback)
// under key.
func publishParams(r *Rollout, device, key string, rollback bool) (task.PublishParams, error) {
	p, err := mqttdev.PublishParams(key, r.Spec.command(device, rollback), task.Options{
		Priority: r.Spec.Priority, MaxUnexpectedRetries: task.NoRetries,
	})
	p.Trace = r.Trace // the device tasks are children of the rollout's span
	return p, err
}

// publishRecorded publishes the tasks this Stepper recorded, if the
// rollout, read again, is still running and still holds them as running
// (an abort or a cancel written since is never followed by a publish of
// this Stepper's; a driver that is late anyway finds the keys taken by
// withdraw's cancelled tasks). r is the rollout as this Stepper read or
// wrote it last: its executions are read again only when its document
// changed since.
func (s *Stepper) publishRecorded(ctx context.Context, r *Rollout) error {
	head, err := GetHead(ctx, s.st, r.Name)
	if err != nil {
		return err
	}
	if !s.forcePublish && head.State != StateRunning && head.State != StatePaused && head.State != StateWaiting {
		return nil
	}
	if head.Version != r.Version {
		if err := load(ctx, s.st, head, s.cache[r.Name]); err != nil {
			return err
		}
		r = head
	}
	for i := range r.Devices {
		e := &r.Devices[i]
		if e.Outcome != OutcomeRunning || e.Published {
			continue
		}
		key := TaskKey(r.Name, e.Device, e.Attempt)
		if !s.mine(key) {
			continue
		}
		p, err := publishParams(r, e.Device, key, false)
		if err != nil {
			return err
		}
		if _, _, err := task.Publish(ctx, s.st, p); err != nil {
			return err
		}
		// Published: the feed names it once it ends. Known here, stored
		// with the shard's next write (a driver taking over reads it).
		s.record(key, false)
		e.Published = true
	}
	return nil
}

func trimFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
