package web

// The triggers API (package trigger): GET and POST /api/v1/triggers,
// DELETE /api/v1/triggers/{name}, POST .../{name}/pause and .../resume.
// A POST takes a trigger as GET shows it (less what the store sets), and
// is validated like `leasepool trigger add`, the server's checks of the
// collection and the filter included, before anything is written.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/trigger"
)

// triggerBody is POST /api/v1/triggers.
type triggerBody struct {
	Name         string             `json:"name"`
	Collection   string             `json:"collection"`
	Table        string             `json:"table"`
	Filter       json.RawMessage    `json:"filter"`
	Operations   []string           `json:"operations"`
	Fields       []string           `json:"fields"`
	VersionField string             `json:"version_field"`
	Kind         string             `json:"kind"`
	Options      triggerOptionsBody `json:"options"`
	Replace      bool               `json:"replace"`
}

// triggerOptionsBody is the task options a trigger's tasks take, in the
// task document's field names.
type triggerOptionsBody struct {
	Priority            int      `json:"priority"`
	SpecificWorkerIDs   []string `json:"specific_worker_ids"`
	ConcurrentWorkerCnt int      `json:"concurrent_worker_cnt"`
	SuccessWorkerCnt    int      `json:"success_worker_cnt"`
	// MaxUnexpectedRetries absent takes the default; 0 means none.
	MaxUnexpectedRetries *int          `json:"max_unexpected_retries"`
	PingInterval         task.Duration `json:"ping_interval"`
	WorkerTimeout        task.Duration `json:"worker_timeout"`
	LockKeys             []string      `json:"lock_keys"`
}

func (b triggerBody) trigger() (trigger.Trigger, error) {
	o := b.Options
	t := trigger.Trigger{Name: b.Name, Collection: b.Collection, Table: b.Table, Operations: b.Operations, Fields: b.Fields,
		VersionField: b.VersionField, Kind: b.Kind, Options: task.Options{
			Priority: o.Priority, SpecificWorkerIDs: o.SpecificWorkerIDs, ConcurrentWorkerCnt: o.ConcurrentWorkerCnt,
			SuccessWorkerCnt: o.SuccessWorkerCnt, PingInterval: time.Duration(o.PingInterval),
			WorkerTimeout: time.Duration(o.WorkerTimeout), LockKeys: o.LockKeys,
		}}
	if len(b.Filter) > 0 && string(b.Filter) != "null" {
		t.Filter = b.Filter
	}
	if r := o.MaxUnexpectedRetries; r != nil {
		switch {
		case *r < 0:
			return t, badInput("options.max_unexpected_retries", "must not be negative")
		case *r == 0:
			t.Options.MaxUnexpectedRetries = task.NoRetries
		default:
			t.Options.MaxUnexpectedRetries = *r
		}
	}
	return t, nil
}

func (a *api) listTriggers(w http.ResponseWriter, r *http.Request) {
	list(a, w, r, trigger.List)
}

// addTrigger answers 201 and the trigger as stored.
func (a *api) addTrigger(w http.ResponseWriter, r *http.Request) {
	var body triggerBody
	if err := decode(w, r, &body); err != nil {
		a.fail(w, r, err)
		return
	}
	t, err := body.trigger()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	added, err := trigger.Add(r.Context(), a.store, t, body.Replace)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: added trigger", "name", added.Name, "collection", added.Collection, "table", added.Table)
	writeJSON(w, http.StatusCreated, added)
}

func (a *api) removeTrigger(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := trigger.Remove(r.Context(), a.store, name); err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: removed trigger", "name", name)
	writeJSON(w, http.StatusOK, changedBody{Changed: true})
}

func (a *api) pauseTrigger(w http.ResponseWriter, r *http.Request) {
	a.modifyTrigger(w, r, "paused trigger", trigger.Pause)
}

func (a *api) resumeTrigger(w http.ResponseWriter, r *http.Request) {
	a.modifyTrigger(w, r, "resumed trigger", trigger.Resume)
}

func (a *api) modifyTrigger(w http.ResponseWriter, r *http.Request, verb string,
	fn func(ctx context.Context, st task.Store, name string) (*trigger.Trigger, error)) {
	name := r.PathValue("name")
	t, err := fn(r.Context(), a.store, name)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: "+verb, "name", name)
	writeJSON(w, http.StatusOK, t)
}

// triggerStatus is the status of a trigger error, or 0.
func triggerStatus(err error) int {
	switch {
	case errors.Is(err, trigger.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, trigger.ErrExists):
		return http.StatusConflict
	}
	return 0
}
