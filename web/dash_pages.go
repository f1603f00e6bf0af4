package web

// The dashboard's pages. Each reads what it shows straight from the store
// and renders it; nothing is cached between requests.

import (
	"cmp"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/schedule"
	"github.com/leasepool/leasepool/task"
)

// states is every state in the order pages show them.
var states = []task.State{task.StatePending, task.StateRunning, task.StateSucceeded, task.StateFailed, task.StateCancelled}

func (d *dashboard) overview(w http.ResponseWriter, r *http.Request) {
	rg, err := parseRange(r.URL.Query())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	o, err := d.readOverview(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	if o.Charts, err = d.readCharts(r.Context(), rg); err != nil {
		d.fail(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "overview", "Overview", o)
}

// taskPage is the task page's data.
type taskPage struct {
	Task    *task.Task
	Payload string
	// Attempts are every attempt kept (task.AttemptHistory), newest first.
	Attempts   []attemptRow
	MaxHistory int
	// Timeline draws the attempts on one time axis.
	Timeline template.HTML
}

// attemptRow is one entry of the worker list as the page shows it.
type attemptRow struct {
	Entry task.Attempt
	// Shown is the entry's state as seen now: EXPIRED for a RUNNING entry
	// whose lease has passed.
	Shown task.AttemptState
	// ResultText is the attempt's result, indented.
	ResultText string
}

func (d *dashboard) task(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		d.fail(w, r, badInput("key", "must not be empty"))
		return
	}
	if task.Reserved(key) {
		d.fail(w, r, task.ErrNotFound) // leasepool's own document, not a task
		return
	}
	t, err := d.store.Get(r.Context(), key)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	p := taskPage{Task: t, Payload: prettyJSON(t.Payload), MaxHistory: task.MaxHistory}
	now := d.store.Now()
	for _, wk := range t.AttemptHistory() {
		row := attemptRow{Entry: wk, Shown: wk.State, ResultText: prettyJSON(wk.Result)}
		if wk.Expired(now) {
			row.Shown = task.AttemptExpired
		}
		p.Attempts = append(p.Attempts, row)
	}
	slices.SortFunc(p.Attempts, func(a, b attemptRow) int { return cmp.Compare(b.Entry.Attempt, a.Entry.Attempt) })
	p.Timeline = timelineChart("timeline", p.Attempts, now)
	d.render(w, r, http.StatusOK, "task", "Task "+t.Key, p)
}

// prettyJSON indents a payload for reading; one that does not parse is
// shown as it is.
func prettyJSON(b json.RawMessage) string {
	if len(b) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return string(b)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(b)
	}
	return string(out)
}

// workerRow is one registry record with what the page derives from it.
type workerRow struct {
	task.WorkerInfo
	Live bool
	// Tasks are the keys of the running tasks with a live lease of this
	// worker id.
	Tasks []string
}

func (d *dashboard) workers(w http.ResponseWriter, r *http.Request) {
	infos, err := d.store.Workers(r.Context())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	held, err := d.runningByWorker(r)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	now := d.store.Now()
	rows := make([]workerRow, 0, len(infos))
	for _, wi := range infos {
		rows = append(rows, workerRow{WorkerInfo: wi, Live: wi.Live(now), Tasks: held[wi.ID]})
	}
	d.render(w, r, http.StatusOK, "workers", "Workers", rows)
}

// maxRunningShown bounds the running tasks the workers page reads.
const maxRunningShown = 1000

// runningByWorker maps worker ids to the running tasks they hold a live
// lease on (the first maxRunningShown running tasks).
func (d *dashboard) runningByWorker(r *http.Request) (map[string][]string, error) {
	running, err := d.store.List(r.Context(), task.ListQuery{State: task.StateRunning, Limit: maxRunningShown})
	if err != nil {
		return nil, err
	}
	now := d.store.Now()
	held := map[string][]string{}
	for _, t := range running {
		for _, wk := range t.Attempts {
			if wk.Live(now) {
				held[wk.WorkerID] = append(held[wk.WorkerID], t.Key)
			}
		}
	}
	return held, nil
}

// controlsPage is the controls page's data.
type controlsPage struct {
	Pauses    []control.PauseInfo
	Limits    []control.Limit
	Schedules []schedule.Info
	// Now is store time, for the schedules' next slots.
	Now time.Time
}

func (d *dashboard) controls(w http.ResponseWriter, r *http.Request) {
	var p controlsPage
	var err error
	if p.Pauses, err = control.Pauses(r.Context(), d.store); err != nil {
		d.fail(w, r, err)
		return
	}
	if p.Limits, err = control.Limits(r.Context(), d.store); err != nil {
		d.fail(w, r, err)
		return
	}
	if p.Schedules, err = schedule.List(r.Context(), d.store); err != nil {
		d.fail(w, r, err)
		return
	}
	p.Now = d.store.Now()
	d.render(w, r, http.StatusOK, "controls", "Pauses, limits, schedules", p)
}
