package web

// The tasks API: one task, the list with its filters and cursors, cancel
// and retry, and their bulk form.

import (
	"errors"
	"net/http"

	"github.com/leasepool/leasepool/task"
)

// getTask answers the task document, 404 when there is none.
func (a *api) getTask(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if task.Reserved(key) {
		a.fail(w, r, task.ErrNotFound) // leasepool's own document, not a task
		return
	}
	t, err := a.store.Get(r.Context(), key)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

// listResponse is one page of GET /api/v1/tasks. A cursor is absent when
// there is nothing further that way.
type listResponse struct {
	Tasks      []*task.Task `json:"tasks"`
	NextCursor string       `json:"next_cursor,omitempty"`
	PrevCursor string       `json:"prev_cursor,omitempty"`
}

func (a *api) listTasks(w http.ResponseWriter, r *http.Request) {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	resp, err := lq.page(r.Context(), a.store)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (a *api) cancelTask(w http.ResponseWriter, r *http.Request) {
	a.modifyTask(w, r, "cancelled", task.Cancel)
}

func (a *api) retryTask(w http.ResponseWriter, r *http.Request) {
	a.modifyTask(w, r, "retried", task.Retry)
}

// modifyTask runs a cancel or retry of {key} and answers the task as
// written: 400 for one of leasepool's own documents (naming the key), 404
// when unknown, 409 when its state does not allow it.
func (a *api) modifyTask(w http.ResponseWriter, r *http.Request, verb string, fn modifyFunc) {
	key := r.PathValue("key")
	if task.Reserved(key) {
		a.fail(w, r, task.ValidateKey("key", key))
		return
	}
	t, err := fn(r.Context(), a.store, key)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.Info("web: "+verb, "key", key)
	writeJSON(w, http.StatusOK, t)
}

// taskStatus is the status a task error answers with; 0 for an
// unexpected one.
func taskStatus(err error) int {
	switch {
	case errors.Is(err, task.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, task.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, task.ErrFinished), errors.Is(err, task.ErrNotFinished):
		return http.StatusConflict
	}
	return 0
}
