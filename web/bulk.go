package web

// POST /api/v1/tasks/bulk: cancel or retry many tasks, named or matched by
// a filter, bounded per request, with each task's outcome.

import (
	"context"
	"net/http"

	"github.com/leasepool/leasepool/task"
)

// maxBulk bounds one bulk request: the keys it names, or the tasks its
// filter reaches (the response says where to continue).
const maxBulk = 1000

type modifyFunc func(ctx context.Context, s task.Store, key string) (*task.Task, error)

// bulkBody names the tasks by keys or by filter (one of them).
type bulkBody struct {
	Action string      `json:"action"`
	Keys   []string    `json:"keys"`
	Filter *filterBody `json:"filter"`
	// Limit bounds how many tasks a filter reaches (default and at most
	// maxBulk), oldest first; Cursor continues after a response's
	// next_cursor.
	Limit  int    `json:"limit"`
	Cursor string `json:"cursor"`
}

// bulkResult is one task's outcome: its state after, or the error (with
// the status a single request would have answered).
type bulkResult struct {
	Key    string     `json:"key"`
	OK     bool       `json:"ok"`
	State  task.State `json:"state,omitempty"`
	Status int        `json:"status,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// bulkResponse counts the outcomes; NextCursor, when set, says the filter
// reached its limit: the same request with this cursor goes on.
type bulkResponse struct {
	Results    []bulkResult `json:"results"`
	OK         int          `json:"ok"`
	Failed     int          `json:"failed"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// validate checks b and returns its action's function.
func (b bulkBody) validate() (modifyFunc, error) {
	var fn modifyFunc
	switch b.Action {
	case "cancel":
		fn = task.Cancel
	case "retry":
		fn = task.Retry
	default:
		return nil, badInput("action", "%q is not one of cancel, retry", b.Action)
	}
	switch {
	case (b.Keys == nil) == (b.Filter == nil):
		return nil, badInput("keys", "give keys or filter, exactly one")
	case len(b.Keys) > maxBulk:
		return nil, badInput("keys", "%d keys, more than the limit of %d per request", len(b.Keys), maxBulk)
	case b.Keys != nil && b.Limit != 0:
		return nil, badInput("limit", "applies to a filter only")
	case b.Keys != nil && b.Cursor != "":
		return nil, badInput("cursor", "applies to a filter only")
	case b.Limit < 0 || b.Limit > maxBulk:
		return nil, badInput("limit", "must be from 1 to %d", maxBulk)
	}
	for _, k := range b.Keys {
		if err := task.ValidateKey("keys", k); err != nil {
			return nil, err
		}
	}
	return fn, nil
}

func (a *api) bulk(w http.ResponseWriter, r *http.Request) {
	var body bulkBody
	if err := decode(w, r, &body); err != nil {
		a.fail(w, r, err)
		return
	}
	fn, err := body.validate()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	keys, next := body.Keys, ""
	if body.Filter != nil {
		if keys, next, err = a.bulkKeys(r.Context(), body); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	resp := bulkResponse{Results: make([]bulkResult, 0, len(keys)), NextCursor: next}
	for _, k := range keys {
		res := a.bulkOne(r.Context(), fn, k)
		if res.OK {
			resp.OK++
		} else {
			resp.Failed++
		}
		resp.Results = append(resp.Results, res)
	}
	a.log.Info("web: bulk "+body.Action, "ok", resp.OK, "failed", resp.Failed)
	writeJSON(w, http.StatusOK, resp)
}

// bulkKeys lists the keys b's filter matches, oldest first, from its
// cursor up to its limit, and the cursor after them when more match.
func (a *api) bulkKeys(ctx context.Context, b bulkBody) (keys []string, next string, err error) {
	q, err := b.Filter.query()
	if err != nil {
		return nil, "", err
	}
	if b.Cursor != "" {
		c, err := parseCursor(b.Cursor)
		if err != nil {
			return nil, "", err
		}
		q.AfterSeq = c.seq
	}
	limit := b.Limit
	if limit == 0 {
		limit = maxBulk
	}
	q.Limit = limit + 1
	ts, err := a.store.List(ctx, q)
	if err != nil {
		return nil, "", err
	}
	if len(ts) > limit {
		ts = ts[:limit]
		next = cursor{after: true, seq: ts[limit-1].Seq}.String()
	}
	for _, t := range ts {
		keys = append(keys, t.Key)
	}
	return keys, next, nil
}

func (a *api) bulkOne(ctx context.Context, fn modifyFunc, key string) bulkResult {
	if task.Reserved(key) {
		return bulkResult{Key: key, Status: http.StatusNotFound, Error: "task not found"}
	}
	t, err := fn(ctx, a.store, key)
	if err == nil {
		return bulkResult{Key: key, OK: true, State: t.State}
	}
	code := taskStatus(err)
	msg := reason(err)
	if code == 0 {
		a.log.Error("web: bulk", "key", key, "err", err)
		code, msg = http.StatusInternalServerError, "internal error (see the server log)"
	}
	return bulkResult{Key: key, Status: code, Error: msg}
}
