package web

// Read-only views: the worker registry, the devices, the queue's counts.

import (
	"context"
	"net/http"
	"slices"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// workerView is a registry record with whether it is live now (store
// time), as `leasepool workers` shows it.
type workerView struct {
	task.WorkerInfo
	Live bool `json:"live"`
}

func (a *api) listWorkers(w http.ResponseWriter, r *http.Request) {
	ws, err := a.store.Workers(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	now := a.store.Now()
	out := make([]workerView, 0, len(ws))
	for _, x := range ws {
		out = append(out, workerView{WorkerInfo: x, Live: x.Live(now)})
	}
	writeJSON(w, http.StatusOK, out)
}

// listDevices answers what `leasepool devices --json` prints: each
// device's recorded online state, running command and holder, queue, its
// announced attributes and operator labels apart; ?select= (ParseSelector:
// k=v for a label, attr:k=v for an attribute) keeps those that match.
func (a *api) listDevices(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query().Get("select")
	if v == "" {
		list(a, w, r, mqttdev.StoredDevices)
		return
	}
	sel, err := mqttdev.ParseSelector(v)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	list(a, w, r, func(ctx context.Context, s task.Store) ([]mqttdev.DeviceInfo, error) {
		all, err := mqttdev.StoredDevices(ctx, s)
		return slices.DeleteFunc(all, func(d mqttdev.DeviceInfo) bool { return !sel.Matches(d.Labels, d.Attributes) }), err
	})
}

// statsResponse is task.Stats with the per-state sums and the registry's
// live workers.
type statsResponse struct {
	task.Stats
	ByState     map[task.State]int64 `json:"by_state"`
	Workers     int                  `json:"workers"`
	LiveWorkers int                  `json:"live_workers"`
}

func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	st, err := a.store.Stats(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ws, err := a.store.Workers(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	resp := statsResponse{Stats: st, ByState: st.ByState(), Workers: len(ws)}
	if resp.Counts == nil {
		resp.Counts = []task.StateCount{}
	}
	now := a.store.Now()
	for _, x := range ws {
		if x.Live(now) {
			resp.LiveWorkers++
		}
	}
	writeJSON(w, http.StatusOK, resp)
}
