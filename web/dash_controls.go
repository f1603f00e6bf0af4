package web

// The controls page's actions: pause and resume a target, pause and
// resume a schedule. They validate like the API (targetBody) does.

import (
	"cmp"
	"net/http"
	"slices"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/schedule"
)

func (d *dashboard) pause(r *http.Request) (string, string, error) {
	t, err := targetBody{Scope: r.PostForm.Get("scope"), Name: r.PostForm.Get("name")}.target()
	if err != nil {
		return "", "", err
	}
	changed, err := control.Pause(r.Context(), d.store, t)
	if err != nil {
		return "", "", err
	}
	if !changed {
		return "/controls", "already-paused", nil
	}
	d.log.Info("web: dashboard paused", "target", t.String())
	return "/controls", "paused", nil
}

func (d *dashboard) resume(r *http.Request) (string, string, error) {
	t, err := targetBody{Scope: r.PostForm.Get("scope"), Name: r.PostForm.Get("name")}.target()
	if err != nil {
		return "", "", err
	}
	changed, err := control.Resume(r.Context(), d.store, t)
	if err != nil {
		return "", "", err
	}
	if !changed {
		return "/controls", "not-paused", nil
	}
	d.log.Info("web: dashboard resumed", "target", t.String())
	return "/controls", "resumed", nil
}

// schedule pauses or resumes the named schedule.
func (d *dashboard) schedule(r *http.Request) (string, string, error) {
	name, op := r.PostForm.Get("name"), r.PostForm.Get("op")
	fn := schedule.Pause
	switch op {
	case "pause":
	case "resume":
		fn = schedule.Resume
	default:
		return "", "", badInput("op", "%q is not one of pause, resume", op)
	}
	if _, err := fn(r.Context(), d.store, name); err != nil {
		return "", "", err
	}
	d.log.Info("web: dashboard "+op+"d schedule", "name", name)
	return "/controls", "schedule-" + op + "d", nil
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp.Compare)
	return keys
}
