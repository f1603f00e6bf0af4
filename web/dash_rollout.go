package web

// The Rollouts pages: every rollout with its progress, and one rollout's
// waves drawn as bars filling with their devices' outcomes, the abort
// threshold and the next wave's gate, with pause, resume and approve.

import (
	"cmp"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/leasepool/leasepool/rollout"
)

// rolloutRow is one rollout in the list.
type rolloutRow struct {
	rollout.Progress
	Devices int
}

func (d *dashboard) rollouts(w http.ResponseWriter, r *http.Request) {
	list, err := rollout.List(r.Context(), d.store)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	rows := make([]rolloutRow, 0, len(list))
	for _, ro := range list {
		rows = append(rows, rolloutRow{Progress: ro.Progress(), Devices: ro.DeviceCount})
	}
	// Active first, then the newest.
	slices.SortFunc(rows, func(a, b rolloutRow) int {
		return cmp.Or(cmp.Compare(boolRank(a.State.Final()), boolRank(b.State.Final())), b.CreatedAt.Compare(a.CreatedAt))
	})
	d.render(w, r, http.StatusOK, "rollouts", "Rollouts", rows)
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// rolloutPage is one rollout's page.
type rolloutPage struct {
	rollout.Progress
	Chart template.HTML
	// Events are the rollout's events, newest first.
	Events  []rollout.Event
	Devices int
	// Page is the page of executions shown (DevicePage of them), of
	// Outcome alone when set; Prev and Next the offsets of the pages
	// around it (-1: none).
	Page                   rollout.Page
	Outcome                rollout.Outcome
	Outcomes               []rollout.Outcome
	PrevOffset, NextOffset int
	CanPause               bool
	CanResume              bool
	// CanApprove: the next wave's gate waits for an operator.
	CanApprove bool
}

func (d *dashboard) rollout(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if name == "" {
		d.fail(w, r, badInput("name", "must not be empty"))
		return
	}
	offset, _, outcome, err := devicePageQuery(r, DevicePage)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	// The aggregates and one page of executions: a few documents read,
	// however many devices the rollout has.
	ro, err := rollout.GetHead(r.Context(), d.store, name)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	p := rolloutPage{Progress: ro.Progress(), Devices: ro.DeviceCount, Outcome: outcome, Outcomes: knownOutcomes, PrevOffset: -1, NextOffset: -1}
	if p.Page, err = rollout.Devices(r.Context(), d.store, ro, offset, DevicePage, outcome); err != nil {
		d.fail(w, r, err)
		return
	}
	if offset > 0 {
		p.PrevOffset = max(offset-DevicePage, 0)
	}
	if offset+DevicePage < p.Page.Total {
		p.NextOffset = offset + DevicePage
	}
	p.Chart = rolloutChart("rollout-waves", rolloutBarsOf(p.Progress))
	p.Events = slices.Clone(p.Progress.Events)
	slices.Reverse(p.Events)
	p.CanPause = p.State == rollout.StateRunning || p.State == rollout.StateWaiting
	p.CanResume = p.State == rollout.StatePaused
	p.CanApprove = p.State == rollout.StateWaiting
	d.render(w, r, http.StatusOK, "rollout", "Rollout "+ro.Name, p)
}

// rolloutBarsOf is what the chart draws of p.
func rolloutBarsOf(p rollout.Progress) rolloutBars {
	b := rolloutBars{Current: p.Wave, AbortAt: p.AbortAt, AbortAfter: p.AbortAfter,
		Ended: p.Total.Ended(), Failures: p.Total.Failures(), NextWave: -1}
	for _, w := range p.Waves {
		b.Waves = append(b.Waves, waveBar{Index: w.Index, Size: w.Size, Succeeded: w.Counts.Succeeded,
			Failed: w.Counts.Failures(), Running: w.Counts.Running, Queued: w.Counts.Queued,
			Other: w.Counts.Cancelled + w.Counts.Skipped, Started: w.Started, Ended: w.Ended, State: string(w.State), Gate: string(w.Gate)})
	}
	if n := p.Next; n != nil {
		b.NextWave, b.NextGate, b.GateState = n.Wave, string(n.Gate), n.State
	}
	return b
}

// rolloutAction is a form's operator write on the rollout it names.
func (d *dashboard) rolloutAction(op string) func(r *http.Request) (string, string, error) {
	do := map[string]func(*http.Request, string) (*rollout.Rollout, error){
		"pause": func(r *http.Request, n string) (*rollout.Rollout, error) {
			return rollout.Pause(r.Context(), d.store, n)
		},
		"resume": func(r *http.Request, n string) (*rollout.Rollout, error) {
			return rollout.Resume(r.Context(), d.store, n)
		},
		"approve": func(r *http.Request, n string) (*rollout.Rollout, error) {
			return rollout.Approve(r.Context(), d.store, n)
		},
	}[op]
	return func(r *http.Request) (string, string, error) {
		name := r.PostForm.Get("name")
		if name == "" {
			return "", "", badInput("name", "must not be empty")
		}
		to := "/rollout?name=" + url.QueryEscape(name)
		before, err := rollout.GetHead(r.Context(), d.store, name)
		if err != nil {
			return "", "", err
		}
		switch {
		case op == "pause" && before.State == rollout.StatePaused:
			return to, "rollout-already-paused", nil
		case op == "resume" && before.State == rollout.StateRunning:
			return to, "rollout-not-paused", nil
		}
		_, err = do(r, name)
		if errors.Is(err, rollout.ErrState) {
			return to, "rollout-" + op + "-refused", nil
		}
		if err != nil {
			return "", "", err
		}
		return to, map[string]string{"pause": "rollout-paused", "resume": "rollout-resumed", "approve": "rollout-approved"}[op], nil
	}
}

// DevicePage is how many executions a rollout's page lists.
const DevicePage = 50

// rolloutDevicesURL is the page of rollout name listing its executions
// of outcome (all: "") from offset.
func rolloutDevicesURL(name string, outcome rollout.Outcome, offset int) string {
	q := url.Values{"name": {name}}
	if outcome != "" {
		q.Set("outcome", string(outcome))
	}
	if offset > 0 {
		q.Set("offset", strconv.Itoa(offset))
	}
	return "/rollout?" + q.Encode() + "#rollout-devices"
}

// rolloutURL is the page of rollout name.
func rolloutURL(name string) string { return "/rollout?name=" + url.QueryEscape(name) }
