// One step of a rollout: read the document, learn how the dispatched
// commands ended, apply abort rules and wave gates, dispatch within the
// rate, write it all by compare-and-set, then publish what was recorded.

package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// MaxLost is how many times a device's command is sent again because the
// worker running it died, before the execution counts as timed out.
const MaxLost = 3

// Stepper advances rollouts, one Step at a time. A Driver runs one under
// its singleton lease; two Steppers on one rollout never both advance it
// (every write is a compare-and-set) nor send a device a command twice
// under one attempt (the task key names the attempt).
type Stepper struct {
	st Store

	mu sync.Mutex
	// recorded are the task keys this Stepper recorded as dispatched and
	// has to publish: a recorded key with no task is this Stepper's to
	// publish, and another's (a driver that died between the two) is
	// dispatched again under a fresh rate token.
	recorded map[string]bool

	// Tests: skipPublish stops a step after its write (a driver that dies
	// there); forcePublish publishes whatever the rollout's state (a
	// driver that read it running before it was cancelled).
	skipPublish, forcePublish bool
	orphanAfter               time.Duration

	// cache holds each rollout's shards as this Stepper last read or
	// wrote them: a step reads only the rollout's document and the
	// shards written by others since.
	cache map[string]*shardCache
	// The feed (follow) of the rollouts' device tasks that ended: while
	// it runs, a step reads only the tasks it names (and those no one is
	// known to have published), not every running execution's.
	feed
}

// feed is what follow learned from the store's change stream.
type feed struct {
	// on: a stream is open, opened as the gen-th; synced holds the gen
	// at which each rollout's executions were last all read (a rollout
	// not synced under the current gen is read whole at its next step).
	on     bool
	gen    int
	synced map[string]int
	// ended are the keys of device tasks written finished (or written
	// where the stream could not say), by rollout name.
	ended map[string]map[string]bool
}

// OrphanAfter is how long a dispatch recorded by another driver may stay
// unpublished before it is dispatched again: a live driver publishes
// within a step, a dead one never does.
const OrphanAfter = 5 * time.Second

// NewStepper returns a Stepper over st.
func NewStepper(st Store) *Stepper {
	return &Stepper{st: st, recorded: map[string]bool{}, orphanAfter: OrphanAfter, cache: map[string]*shardCache{},
		feed: feed{synced: map[string]int{}, ended: map[string]map[string]bool{}}}
}

// Follow keeps the feed from the store's change stream until ctx ends,
// opening the stream again after an error; it returns at once where the
// store cannot push (task.ErrWatchUnsupported), leaving every step to
// read each running execution's task. A Driver runs it.
func (s *Stepper) Follow(ctx context.Context) {
	for ctx.Err() == nil {
		cs, err := s.st.Watch(ctx, task.WatchParams{SkipQuiet: true})
		if errors.Is(err, task.ErrWatchUnsupported) {
			return
		}
		if err != nil {
			t := time.NewTimer(time.Second)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		s.mu.Lock()
		// Writes from here on are seen: each rollout is read whole once.
		s.on, s.gen = true, s.gen+1
		s.mu.Unlock()
		for {
			ev, err := cs.Next(ctx)
			if err != nil {
				break
			}
			rest, ok := strings.CutPrefix(ev.Key, "rollout:")
			if !ok || (ev.Task != nil && !ev.Task.State.Finished()) {
				continue
			}
			name, _, _ := strings.Cut(rest, ":")
			s.mu.Lock()
			if s.ended[name] == nil {
				s.ended[name] = map[string]bool{}
			}
			s.ended[name][ev.Key] = true
			s.mu.Unlock()
		}
		_ = cs.Close()
		s.mu.Lock()
		s.on = false
		s.mu.Unlock()
	}
}

// watching returns, while the feed runs, the keys of rollout name's
// tasks that ended since the last call, and whether the rollout was read
// whole under the current stream (else the step reads it whole: whole
// is false) with the gen to mark it synced at.
func (s *Stepper) watching(name string) (keys map[string]bool, whole bool, gen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys = s.ended[name]
	delete(s.ended, name)
	return keys, !s.on || s.synced[name] != s.gen, s.gen
}

func (s *Stepper) markSynced(name string, gen int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen < 0 {
		delete(s.feed.synced, name)
	} else {
		s.feed.synced[name] = gen
	}
}

func (s *Stepper) mine(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recorded[key]
}

func (s *Stepper) record(key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.recorded[key] = true
	} else {
		delete(s.recorded, key)
	}
}

func (s *Stepper) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recorded) > 0
}

// Step advances rollout name once. It returns task.ErrConflict when
// another writer changed the rollout first (nothing of this step was
// written or sent; the next step starts over).
func (s *Stepper) Step(ctx context.Context, name string) (err error) {
	r, err := GetHead(ctx, s.st, name)
	if err != nil {
		return err
	}
	if r.Over() {
		delete(s.cache, name)
		return nil
	}
	if err := load(ctx, s.st, r, s.cache[name]); err != nil {
		delete(s.cache, name)
		return err
	}
	if r.stale && s.st.Now().Sub(r.staleAt) < s.orphanAfter {
		// A shard written since the rollout's document: its writer may
		// be about to write the document (which counts its dispatches in
		// the rate's window). Let it, rather than write first and make
		// its dispatches records no window counted.
		delete(s.cache, name)
		return fmt.Errorf("rollout %s: shard written since its document, %w", name, task.ErrConflict)
	}
	ended, whole, gen := s.watching(name)
	defer func() {
		if err != nil {
			// r's executions are the cache's, changed in place.
			delete(s.cache, name)
			// What the feed named may not be recorded: read it all again.
			s.markSynced(name, -1)
		} else if whole {
			s.markSynced(name, gen)
		}
	}()
	now := s.st.Now().UTC()
	before := r.Version
	changed, err := s.refresh(ctx, r, now, whole, ended)
	if err != nil {
		return err
	}
	changed = changed || r.stale
	if r.active() {
		changed = r.checkAbort(now) || changed
	}
	if r.State == StateAborting || r.State == StateCancelling {
		c, err := s.withdraw(ctx, r, now)
		if err != nil {
			return err
		}
		changed = c || changed
	}
	if r.State == StateAborted && r.Rollback != nil && r.Rollback.EndedAt.IsZero() {
		c, err := s.rollback(ctx, r, now, whole, ended)
		if err != nil {
			return err
		}
		changed = c || changed
	}
	if r.active() {
		changed = r.advanceWaves(now) || changed
	}
	var dispatched []int
	if r.State == StateRunning {
		dispatched = r.dispatch(now)
		changed = changed || len(dispatched) > 0
	}
	if s.skipPublish {
		if changed {
			r.UpdatedAt = now
			if err := s.put(ctx, r); err != nil {
				return err
			}
			for _, i := range dispatched {
				s.record(TaskKey(r.Name, r.Devices[i].Device, r.Devices[i].Attempt), true)
			}
		}
		return nil
	}
	if !changed {
		if s.pending() {
			return s.publishRecorded(ctx, r)
		}
		return nil
	}
	for _, i := range dispatched {
		s.record(TaskKey(r.Name, r.Devices[i].Device, r.Devices[i].Attempt), true)
	}
	r.UpdatedAt = now
	if err := s.put(ctx, r); err != nil {
		for _, i := range dispatched {
			s.record(TaskKey(r.Name, r.Devices[i].Device, r.Devices[i].Attempt), false)
		}
		return fmt.Errorf("rollout %s step at version %d: %w", name, before, err)
	}
	return s.publishRecorded(ctx, r)
}

// put writes r and keeps its shards for the next step; after a failed
// write the next step reads them again.
func (s *Stepper) put(ctx context.Context, r *Rollout) error {
	if err := put(ctx, s.st, r); err != nil {
		delete(s.cache, r.Name)
		return err
	}
	s.cache[r.Name] = r.cache()
	return nil
}

// active reports whether the rollout may still dispatch or advance.
func (r *Rollout) active() bool {
	return r.State == StateRunning || r.State == StatePaused || r.State == StateWaiting
}

// refresh learns how the dispatched commands ended. With whole, it
// reads the task of every running execution; else those of ended (the
// feed's) and of the executions no one is known to have published yet.
func (s *Stepper) refresh(ctx context.Context, r *Rollout, now time.Time, whole bool, ended map[string]bool) (bool, error) {
	changed := false
	for i := range r.Devices {
		e := &r.Devices[i]
		if e.Outcome != OutcomeRunning {
			continue
		}
		if !whole && e.Published && len(ended) == 0 {
			continue // the feed names it once it ends
		}
		key := TaskKey(r.Name, e.Device, e.Attempt)
		if !whole && !ended[key] && (e.Published || s.mine(key)) {
			continue
		}
		t, err := s.st.Get(ctx, key)
		if errors.Is(err, task.ErrNotFound) {
			if s.mine(key) || !r.active() || now.Sub(e.DispatchedAt) < s.orphanAfter {
				continue // publishRecorded, withdraw, or the peer sees to it
			}
			// Recorded by a driver that died before publishing: dispatch
			// it again (same key) under a fresh rate token.
			e.Outcome, e.Attempt = OutcomeQueued, e.Attempt-1
			changed = true
			continue
		}
		if err != nil {
			return false, err
		}
		if !e.Published {
			e.Published, changed = true, true
			s.record(key, false)
		}
		if why := foreign(t, r, r.Spec.command(e.Device, false)); why != "" {
			// Never counted as this rollout's, nor retried under its key.
			e.Outcome, e.EndedAt, e.Error = OutcomeFailed, now, foreignError(key, why)
			changed = true
			continue
		}
		if !t.State.Finished() {
			continue
		}
		outcome, msg, lost := classify(t)
		changed = true
		switch {
		case lost && r.active() && e.Lost < MaxLost:
			e.Lost++
			e.Outcome, e.Error = OutcomeQueued, msg
			continue
		case lost:
			outcome = OutcomeTimedOut
		case outcome.Failure() && r.active() && e.Attempt-e.Lost-1 < r.Spec.Retries && r.Spec.retries(outcome):
			e.Outcome, e.Error = OutcomeQueued, msg
			continue
		}
		e.Outcome, e.EndedAt, e.Error = outcome, now, msg
	}
	return changed, nil
}

// classify says how a finished device task ended: its outcome, the error
// text of its last attempt, and whether that attempt's worker died (its
// lease expired) rather than the device answering.
func classify(t *task.Task) (Outcome, string, bool) {
	switch t.State {
	case task.StateSucceeded:
		return OutcomeSucceeded, "", false
	case task.StateCancelled:
		return OutcomeCancelled, "cancelled", false
	}
	var last task.Attempt
	for _, a := range append(append([]task.Attempt{}, t.History...), t.Attempts...) {
		if a.Attempt >= last.Attempt {
			last = a
		}
	}
	msg := firstLine(last.Error, 120)
	if last.State == task.AttemptExpired || last.State == task.AttemptRunning || (last.State == task.AttemptFail && last.Error == "") {
		return OutcomeFailed, "worker lost", true
	}
	switch mqttdev.FailureOf(last.Error) {
	case mqttdev.CommandRefused:
		return OutcomeRefused, msg, false
	case mqttdev.CommandNoAck, mqttdev.CommandResultTimeout:
		return OutcomeTimedOut, msg, false
	case mqttdev.CommandOffline:
		return OutcomeOffline, msg, false
	}
	return OutcomeFailed, msg, false
}

func firstLine(s string, n int) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			s = s[:i]
			break
		}
	}
	if len(s) > n {
		s = s[:n]
	}
	return s
}

// checkAbort applies the abort rules to the executions ended so far.
func (r *Rollout) checkAbort(now time.Time) bool {
	var c Counts
	for _, e := range r.Devices {
		if e.Outcome.Done() {
			c.add(e.Outcome)
		}
	}
	ended := c.Ended()
	for _, rule := range r.Spec.AbortWhen {
		if ended < max(rule.After, 1) {
			continue
		}
		n := 0
		for _, k := range rule.Kinds {
			n += c.Of(k)
		}
		if pct := percent(n, ended); pct > rule.Percent {
			r.State = StateAborting
			r.Reason = fmt.Sprintf("%s: %d of %d ended (%.1f%%)", rule, n, ended, pct)
			return true
		}
	}
	return false
}

// advanceWaves ends the waves whose devices all ended, starts the next
// when its gate opens, and completes the rollout after the last.
func (r *Rollout) advanceWaves(now time.Time) bool {
	changed := false
	if r.Waves[0].StartedAt.IsZero() {
		r.startWave(0, now)
		changed = true
	}
	for w := 0; w <= r.Wave; w++ {
		wave := &r.Waves[w]
		if !wave.EndedAt.IsZero() || wave.StartedAt.IsZero() {
			continue
		}
		var c Counts
		for _, e := range r.Devices[wave.Start:wave.End] {
			if !e.Outcome.Done() {
				c.Total = -1
				break
			}
			c.add(e.Outcome)
		}
		if c.Total < 0 {
			continue
		}
		wave.EndedAt, changed = now, true
		r.event(now, EventWaveEnded, fmt.Sprintf("wave %d: %d succeeded, %d failed (%.1f%%)",
			w+1, c.Succeeded, c.Failures(), percent(c.Failures(), c.Ended())))
	}
	cur := r.Waves[r.Wave]
	if cur.EndedAt.IsZero() || r.State == StatePaused {
		return changed
	}
	if r.Wave == len(r.Waves)-1 {
		for _, w := range r.Waves {
			if w.EndedAt.IsZero() {
				return changed
			}
		}
		r.State, r.Reason, r.EndedAt = StateCompleted, "", now
		r.event(now, EventCompleted, "")
		return true
	}
	next := r.Wave + 1
	if !r.Waves[next].Approved {
		var c Counts
		for _, e := range r.Devices[cur.Start:cur.End] {
			c.add(e.Outcome)
		}
		reason := ""
		failed := 0
		for _, k := range r.Spec.gateKinds() {
			failed += c.Of(k)
		}
		if g := r.Spec.gateFailures(); g > 0 && percent(failed, c.Ended()) >= g {
			reason = fmt.Sprintf("wave %d failed %.1f%%, at or above %s%%: approve to go on", r.Wave+1, percent(failed, c.Ended()), trimFloat(g))
		} else if r.Waves[next].Gate == GateApproval {
			reason = fmt.Sprintf("wave %d waits for approval", next+1)
		}
		if reason != "" {
			if r.State != StateWaiting || r.Reason != reason {
				r.State, r.Reason = StateWaiting, reason
				r.event(now, EventWaiting, reason)
				return true
			}
			return changed
		}
	}
	r.State, r.Reason = StateRunning, ""
	r.startWave(next, now)
	return true
}

func (r *Rollout) startWave(w int, now time.Time) {
	r.Wave = w
	wave := &r.Waves[w]
	// Its executions stay as they are (no outcome: queued once their
	// wave started), so starting a wave writes no shard.
	wave.StartedAt = now
	r.event(now, EventWaveStarted, fmt.Sprintf("wave %d: %d devices", w+1, wave.End-wave.Start))
}

// dispatch records the queued executions of started waves as running,
// in order, as far as the rate allows, and returns their indexes.
func (r *Rollout) dispatch(now time.Time) []int {
	var out []int
	for i := range r.Devices {
		e := &r.Devices[i]
		if e.Outcome != OutcomeQueued && (e.Outcome != "" || r.Waves[e.Wave].StartedAt.IsZero()) || e.Wave > r.Wave {
			continue
		}
		at, ok := r.token(now)
		if !ok {
			break
		}
		e.Attempt++
		e.Outcome, e.Published, e.DispatchedAt = OutcomeRunning, false, at
		e.Dispatched = append(e.Dispatched, at)
		out = append(out, i)
	}
	return out
}

// token takes a rate token at now (or at the last dispatch, if the store
// clock reads earlier): at most Rate.N dispatches in any window of
// Rate.Per, counted on the times recorded in the document, so a driver
// that takes over keeps the same window.
func (r *Rollout) token(now time.Time) (time.Time, bool) {
	if r.Spec.Rate.N == 0 {
		return now, true
	}
	at := now
	if n := len(r.Dispatches); n > 0 && r.Dispatches[n-1].After(at) {
		at = r.Dispatches[n-1]
	}
	if n := len(r.Dispatches); n >= r.Spec.Rate.N && r.Dispatches[n-r.Spec.Rate.N].After(at.Add(-time.Duration(r.Spec.Rate.Per))) {
		return time.Time{}, false
	}
	r.Dispatches = append(r.Dispatches, at)
	if n := len(r.Dispatches) - r.Spec.Rate.N; n > 0 {
		r.Dispatches = r.Dispatches[n:]
	}
	return at, true
}
