package main

// What the demo's pending tasks wait for while nothing runs: a delay, a
// retry backoff, an offline device, a lock, a worker. Read from the task
// documents and the worker registry, as any observer could.

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// maxWaitReasons bounds the reasons a progress line names; the rest are
// counted together.
const maxWaitReasons = 3

// dueNow is the reason of a pending task that waits for nothing: a
// worker's next look claims it.
const dueNow = "due now"

// waitReason is why a pending task is not running, and until when if it
// is held back to a time.
type waitReason struct {
	why   string
	until time.Time // zero: no set time
}

// waitView is what the pending tasks' reasons are read against: the
// tasks running (whose locks are held), the live workers, and the devices
// whose last stored status is offline.
type waitView struct {
	running []*task.Task
	live    []task.WorkerInfo
	offline map[string]bool
}

// pendingReason says what pending task t waits for at now. A command for
// a device stored offline waits for its return, with no set time: the
// workers hold it, writing nothing, until its online status.
func pendingReason(t *task.Task, now time.Time, v waitView) waitReason {
	if t.Kind == mqttdev.Kind {
		if c, err := mqttdev.DecodePayload(t.Payload); err == nil && v.offline[c.Device] {
			return waitReason{why: "device offline"}
		}
	}
	running, live := v.running, v.live
	if t.RunAt.After(now) {
		why := "delayed"
		switch last := lastAttempt(t); {
		case last == nil:
		case last.State == task.WorkerSnoozed:
			why = "snoozed"
		case last.State == task.AttemptFail, last.State == task.AttemptExpired:
			why = "retry backoff"
		}
		return waitReason{why: why, until: t.RunAt}
	}
	runs := func(w task.WorkerInfo) bool { return len(w.Kinds) == 0 || slices.Contains(w.Kinds, t.Kind) }
	if !slices.ContainsFunc(live, runs) {
		return waitReason{why: fmt.Sprintf("no live worker for kind %q", t.Kind)}
	}
	if len(t.SpecificWorkerIDs) > 0 && !slices.ContainsFunc(live, func(w task.WorkerInfo) bool {
		return runs(w) && slices.Contains(t.SpecificWorkerIDs, w.ID)
	}) {
		return waitReason{why: "pinned to workers not live"}
	}
	for _, r := range running {
		for _, k := range t.LockKeys {
			if slices.Contains(r.LockKeys, k) {
				return waitReason{why: "lock " + k}
			}
		}
	}
	return waitReason{why: dueNow}
}

// lastAttempt is t's latest attempt, current or in its history; nil if
// it never ran.
func lastAttempt(t *task.Task) *task.Attempt {
	var last *task.Attempt
	for _, ws := range [][]task.Attempt{t.History, t.Attempts} {
		for i := range ws {
			if last == nil || ws[i].Attempt > last.Attempt {
				last = &ws[i]
			}
		}
	}
	return last
}

// waitSummary says what the pending tasks among all wait for, most
// numerous reason first: "10 waiting: 9 device offline, 1 retry backoff
// until +3s". It is empty when none is pending. live are the live
// workers, offline the devices stored offline.
func waitSummary(all []*task.Task, live []task.WorkerInfo, offline map[string]bool, now time.Time) string {
	var pending, running []*task.Task
	for _, t := range all {
		switch t.State {
		case task.StatePending:
			pending = append(pending, t)
		case task.StateRunning:
			running = append(running, t)
		}
	}
	if len(pending) == 0 {
		return ""
	}
	type group struct {
		why         string
		n           int
		first, last time.Time
	}
	var groups []*group
	for _, t := range pending {
		r := pendingReason(t, now, waitView{running: running, live: live, offline: offline})
		i := slices.IndexFunc(groups, func(g *group) bool { return g.why == r.why })
		if i < 0 {
			groups = append(groups, &group{why: r.why, first: r.until, last: r.until})
			i = len(groups) - 1
		}
		g := groups[i]
		g.n++
		if r.until.Before(g.first) {
			g.first = r.until
		}
		if r.until.After(g.last) {
			g.last = r.until
		}
	}
	// Most numerous first; among equals, due tasks (waiting for nothing
	// but a worker's next look) after those that wait for something.
	due := func(g *group) int {
		if g.why == dueNow {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(groups, func(a, b *group) int {
		return cmp.Or(b.n-a.n, due(a)-due(b), strings.Compare(a.why, b.why))
	})
	var parts []string
	for i, g := range groups {
		if i == maxWaitReasons {
			rest := 0
			for _, g := range groups[i:] {
				rest += g.n
			}
			parts = append(parts, fmt.Sprintf("%d other", rest))
			break
		}
		part := fmt.Sprintf("%d %s", g.n, g.why)
		if !g.last.IsZero() {
			part += " until " + fromNow(g.first, now)
			if a, b := fromNow(g.first, now), fromNow(g.last, now); a != b {
				part += ".." + b
			}
		}
		parts = append(parts, part)
	}
	return fmt.Sprintf("%d waiting: %s", len(pending), strings.Join(parts, ", "))
}

// fromNow spells a time ahead of now as "+12s", in whole seconds rounded up.
func fromNow(t, now time.Time) string {
	return fmt.Sprintf("+%ds", int(math.Ceil(t.Sub(now).Seconds())))
}

// offlineDevices are the devices whose last stored status is offline.
func offlineDevices(ctx context.Context, s task.Store) (map[string]bool, error) {
	states, err := mqttdev.StoreStates(s).DeviceStates(ctx)
	if err != nil {
		return nil, fmt.Errorf("device states: %w", err)
	}
	offline := map[string]bool{}
	for _, st := range states {
		if !st.Online {
			offline[st.ID] = true
		}
	}
	return offline, nil
}

// waitingFor says what pending task t waits for, read from the store as
// any observer could: "device offline", "retry backoff until +3s".
func waitingFor(ctx context.Context, s task.Store, t *task.Task) (string, error) {
	running, err := s.List(ctx, task.ListQuery{State: task.StateRunning})
	if err != nil {
		return "", err
	}
	ws, err := s.Workers(ctx)
	if err != nil {
		return "", err
	}
	offline, err := offlineDevices(ctx, s)
	if err != nil {
		return "", err
	}
	now := s.Now()
	ws = slices.DeleteFunc(ws, func(w task.WorkerInfo) bool { return !w.Live(now) })
	r := pendingReason(t, now, waitView{running: running, live: ws, offline: offline})
	if r.until.IsZero() {
		return r.why, nil
	}
	return r.why + " until " + fromNow(r.until, now), nil
}
