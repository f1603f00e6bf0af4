package web

// The flow page's Send signal form.

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

// signalFlow sends the form's signal (step, optional JSON payload) to the
// form's flow and returns to its page; a signal the flow refuses (sent
// already, the flow finished) says so there.
func (d *dashboard) signalFlow(r *http.Request) (string, string, error) {
	key, step := r.PostForm.Get("key"), r.PostForm.Get("step")
	if key == "" {
		return "", "", badInput("key", "must not be empty")
	}
	if step == "" {
		return "", "", badInput("step", "must not be empty")
	}
	var payload json.RawMessage
	if p := strings.TrimSpace(r.PostForm.Get("payload")); p != "" {
		// Checked here too so that the error names the form's field.
		if err := task.ValidateJSON("payload", []byte(p), task.MaxJSONDepth); err != nil {
			return "", "", err
		}
		payload = json.RawMessage(p)
	}
	back := "/flow?key=" + url.QueryEscape(key)
	if _, err := flow.Signal(r.Context(), d.store, key, step, payload); err != nil {
		switch {
		case errors.Is(err, flow.ErrFinished):
			return back, "signal-finished", nil
		case errors.Is(err, flow.ErrAlreadySignalled):
			return back, "signal-twice", nil
		case errors.Is(err, flow.ErrStepNotFound), errors.Is(err, flow.ErrNotSignalStep):
			return "", "", badInput("step", "%v", err)
		}
		return "", "", err
	}
	d.log.Info("web: dashboard flow signalled", "key", key, "step", step)
	return back, "signal-sent", nil
}
