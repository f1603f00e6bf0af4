package rollout

import (
	"fmt"
	"strconv"
)

func itoa(n int) string { return strconv.Itoa(n) }

// Progress computes the read model.
func (r *Rollout) Progress() Progress {
	p := Progress{
		Name: r.Name, State: r.State, Reason: r.Reason, Spec: r.Spec, Wave: r.Wave,
		GateFailures: r.Spec.gateFailures(), Rollback: r.Rollback,
		Events: r.Events, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, EndedAt: r.EndedAt, Version: r.Version,
	}
	counts, rolledBack := r.counts()
	if rule, ok := r.Spec.tightestRule(); ok {
		p.AbortAt, p.AbortAfter = rule.Percent, rule.After
	}
	for i, w := range r.Waves {
		wp := WaveProgress{
			Index: i, State: r.waveState(i), Target: w.End, Size: w.End - w.Start, Spec: w.Target, Gate: w.Gate,
			Started: !w.StartedAt.IsZero(), Ended: !w.EndedAt.IsZero(), StartedAt: w.StartedAt, EndedAt: w.EndedAt,
		}
		if (wp.State == WaveAborted || wp.State == WaveCancelled) && !wp.Ended {
			// Stored before stopping a wave ended it: it ended with the
			// rollout.
			wp.Ended, wp.EndedAt = true, r.EndedAt
		}
		wp.Counts = counts[i]
		add(&p.Total, wp.Counts)
		wp.FailureRate = percent(wp.Counts.Failures(), wp.Counts.Ended())
		p.Waves = append(p.Waves, wp)
	}
	p.RolledBack = rolledBack
	p.FailureRate = percent(p.Total.Failures(), p.Total.Ended())
	if next := r.Wave + 1; !r.State.Final() && next < len(r.Waves) {
		g := &GateState{Wave: next, Gate: r.Waves[next].Gate, State: "closed"}
		switch {
		case r.Waves[r.Wave].EndedAt.IsZero():
		case r.State == StateWaiting:
			g.State, g.Reason = "waiting", r.Reason
		default:
			g.State = "open"
		}
		p.Next = g
	}
	return p
}

// counts are each wave's executions and the rollback's by outcome:
// counted from Devices when they are loaded, else as stored.
func (r *Rollout) counts() ([]Counts, Counts) {
	out := make([]Counts, len(r.Waves))
	if r.Devices == nil {
		for i, w := range r.Waves {
			out[i] = w.Counts
		}
		return out, r.RolledBack
	}
	var rb Counts
	for i, w := range r.Waves {
		for _, e := range r.Devices[w.Start:w.End] {
			out[i].add(e.Outcome)
		}
	}
	for _, e := range r.Devices {
		if e.Rollback != "" {
			rb.add(e.Rollback)
		}
	}
	return out, rb
}

func add(to *Counts, c Counts) {
	to.Total += c.Total
	to.Queued += c.Queued
	to.Running += c.Running
	to.Succeeded += c.Succeeded
	to.Failed += c.Failed
	to.Refused += c.Refused
	to.TimedOut += c.TimedOut
	to.Offline += c.Offline
	to.Cancelled += c.Cancelled
	to.Skipped += c.Skipped
}

// Plan is what a rollout will send where: each wave's target, gate and
// devices, as a dry run (DryRun) shows it before anything is written.
type Plan struct {
	Name    string     `json:"name"`
	Command string     `json:"command"`
	Devices int        `json:"devices"`
	Waves   []PlanWave `json:"waves"`
	// MaxSize is the largest the rollout's document can grow to, in
	// bytes (at most task.MaxDocumentSize).
	MaxSize int `json:"max_size"`
}

// PlanWave is one wave of a Plan. Target is the cumulative number of
// devices once it ended.
type PlanWave struct {
	Index   int        `json:"index"`
	Spec    WaveTarget `json:"spec"`
	Target  int        `json:"target"`
	Gate    Gate       `json:"gate"`
	Devices []string   `json:"devices"`
}

// Plan is r's plan.
func (r *Rollout) Plan() Plan {
	p := Plan{Name: r.Name, Command: r.Spec.Command, Devices: len(r.Devices)}
	p.MaxSize, _ = r.MaxSize()
	for i, w := range r.Waves {
		pw := PlanWave{Index: i, Spec: w.Target, Target: w.End, Gate: w.Gate, Devices: []string{}}
		for _, e := range r.Devices[w.Start:w.End] {
			pw.Devices = append(pw.Devices, e.Device)
		}
		p.Waves = append(p.Waves, pw)
	}
	return p
}

// waveState is where wave i stands. A wave that never started in a
// rollout aborting or cancelling never will; one that ran when it was
// aborted or cancelled ended with it.
func (r *Rollout) waveState(i int) WaveState {
	w := r.Waves[i]
	var stop WaveState // how the rollout stops, if it does
	switch r.State {
	case StateAborting, StateAborted:
		stop = WaveAborted
	case StateCancelling, StateCancelled:
		stop = WaveCancelled
	}
	switch {
	case w.StartedAt.IsZero() && stop != "":
		return WaveSkipped
	case w.StartedAt.IsZero():
		return WavePending
	case w.Stopped, w.EndedAt.IsZero() && stop != "" && r.State.Final():
		return stop
	case w.EndedAt.IsZero():
		return WaveRunning
	}
	return WaveEnded
}

func percent(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// gateFailures is the wave failure percentage that holds the next wave.
func (s Spec) gateFailures() float64 {
	if s.GateFailures > 0 {
		return s.GateFailures
	}
	if r, ok := s.tightestRule(); ok {
		return r.Percent
	}
	return 0
}

// gateKinds are the failures the wave gate counts: those of the tightest
// abort rule when the gate takes its threshold, every kind when
// GateFailures is given.
func (s Spec) gateKinds() []Outcome {
	if r, ok := s.tightestRule(); ok && s.GateFailures == 0 {
		return r.Kinds
	}
	return FailureKinds
}

// tightestRule is the abort rule with the lowest percentage.
func (s Spec) tightestRule() (AbortRule, bool) {
	var best AbortRule
	for i, r := range s.AbortWhen {
		if i == 0 || r.Percent < best.Percent {
			best = r
		}
	}
	return best, len(s.AbortWhen) > 0
}

// String is the rule as ParseAbortRule reads it.
func (r AbortRule) String() string {
	kinds := ""
	for i, k := range r.Kinds {
		if i > 0 {
			kinds += "|"
		}
		kinds += string(k)
	}
	return fmt.Sprintf("%s>%s%% after %d", kinds, strconv.FormatFloat(r.Percent, 'f', -1, 64), r.After)
}

// String is the target as ParseWaves reads it.
func (t WaveTarget) String() string {
	if t.Percent > 0 {
		return strconv.FormatFloat(t.Percent, 'f', -1, 64) + "%"
	}
	return itoa(t.Count)
}
