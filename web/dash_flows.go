package web

// The dashboard's flows: the list (rollback_failed ones first: they need a
// human) and one flow's steps, shared parameters and events, with cancel
// and retry.

import (
	"cmp"
	"errors"
	"net/http"
	"net/url"
	"slices"

	"github.com/leasepool/leasepool/flow"
)

// flowsShown bounds the flows the list reads.
const flowsShown = 500

func (d *dashboard) flows(w http.ResponseWriter, r *http.Request) {
	active := r.URL.Query().Get("active") == "true"
	fs, err := flow.List(r.Context(), d.store, flow.ListQuery{Active: active, Limit: flowsShown})
	if err != nil {
		d.fail(w, r, err)
		return
	}
	// Newest first, with the flows that need a human on top.
	slices.Reverse(fs)
	slices.SortStableFunc(fs, func(a, b *flow.Flow) int {
		return cmp.Compare(rank(b.State), rank(a.State))
	})
	rows := make([]flowRow, len(fs))
	for i, f := range fs {
		rows[i] = flowRow{Flow: f}
		for k, p := range f.Progress {
			if p.Do.State == flow.RunSucceeded {
				rows[i].Done++
			}
			if (p.Do.State == flow.RunActive || p.Undo.State == flow.RunActive) && k < len(f.Steps) {
				rows[i].Running = append(rows[i].Running, f.Steps[k].Name)
			}
		}
	}
	d.render(w, r, http.StatusOK, "flows", "Flows", struct {
		Flows  []flowRow
		Active bool
		Limit  int
	}{rows, active, flowsShown})
}

// flowRow is a flow in the list: how many steps' work succeeded, and the
// steps running (in a DAG, several at once).
type flowRow struct {
	*flow.Flow
	Done    int
	Running []string
}

func rank(s flow.State) int {
	if s == flow.StateRollbackFailed {
		return 1
	}
	return 0
}

// flowStep is one step of the flow page.
type flowStep struct {
	N    int
	Step flow.Step
	Prog flow.Progress
	// Result is the step's result in the shared parameters, indented.
	Result string
	// Current marks a step whose work or rollback runs (in a DAG, several).
	Current bool
}

func (d *dashboard) flow(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if key == "" {
		d.fail(w, r, badInput("key", "must not be empty"))
		return
	}
	f, err := flow.Get(r.Context(), d.store, key)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	if len(f.Steps) > largeFlowSteps {
		levels, err := levelsOf(f, r.URL.Query())
		if err != nil {
			d.fail(w, r, err)
			return
		}
		d.render(w, r, http.StatusOK, "flow", "Flow "+f.Key, struct {
			Flow    *flow.Flow
			Steps   []flowStep
			Picture flowPicture
			Levels  *flowLevels
		}{f, levels.Steps, flowPicture{Signals: awaitingSignals(f)}, &levels})
		return
	}
	steps := make([]flowStep, len(f.Steps))
	for i := range f.Steps {
		steps[i] = stepRow(f, i)
	}
	pic, err := d.picture(r.Context(), f)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	d.render(w, r, http.StatusOK, "flow", "Flow "+f.Key, struct {
		Flow    *flow.Flow
		Steps   []flowStep
		Picture flowPicture
		Levels  *flowLevels
	}{f, steps, pic, nil})
}

func (d *dashboard) cancelFlow(r *http.Request) (string, string, error) {
	rollback := r.PostForm.Get("rollback") == "true"
	return d.flowAction(r, "cancelled", func(key string) error {
		_, err := flow.Cancel(r.Context(), d.store, key, rollback)
		return err
	})
}

func (d *dashboard) retryFlow(r *http.Request) (string, string, error) {
	return d.flowAction(r, "retried", func(key string) error {
		_, err := flow.Retry(r.Context(), d.store, key)
		return err
	})
}

// flowAction runs fn on the form's flow key and returns to its page; a
// flow whose state refuses it says so there.
func (d *dashboard) flowAction(r *http.Request, verb string, fn func(key string) error) (string, string, error) {
	key := r.PostForm.Get("key")
	if key == "" {
		return "", "", badInput("key", "must not be empty")
	}
	back := "/flow?key=" + url.QueryEscape(key)
	if err := fn(key); err != nil {
		if errors.Is(err, flow.ErrFinished) || errors.Is(err, flow.ErrNotFinished) {
			return back, map[string]string{"cancelled": "flow-cancel-refused", "retried": "flow-retry-refused"}[verb], nil
		}
		return "", "", err
	}
	d.log.Info("web: dashboard flow "+verb, "key", key)
	return back, "flow-" + verb, nil
}
