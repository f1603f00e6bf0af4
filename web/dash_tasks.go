package web

// The overview's figures, the task list with its filters and cursor
// paging, and the task actions (cancel, retry, bulk).

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// overviewData is the overview page's figures.
type overviewData struct {
	// Total counts per state; Kinds the same per kind.
	Total map[string]int
	All   int
	Kinds []kindCounts
	// Succeeded and Failed count the tasks that finished so in the last
	// hour (their updated_at within it); Done is both.
	Succeeded, Failed, Done int
	// OldestReady is the next_claim_at of the pending task that has waited
	// longest for a worker (zero: none waiting).
	OldestReady time.Time
	// Partial: more than maxScan tasks, so the figures cover the first
	// maxScan only.
	Partial bool
	MaxScan int
}

// kindCounts is one kind's counts per state.
type kindCounts struct {
	Kind   string
	Counts map[string]int
	All    int
}

// maxScan bounds the tasks the overview reads.
const maxScan = 100_000

// readOverview counts by reading the tasks page by page (in publish order)
// up to maxScan.
func (d *dashboard) readOverview(ctx context.Context) (*overviewData, error) {
	o := &overviewData{Total: map[string]int{}, MaxScan: maxScan}
	byKind := map[string]*kindCounts{}
	now := d.store.Now()
	hourAgo := now.Add(-time.Hour)
	var after int64
	for o.All < maxScan {
		page, err := d.store.List(ctx, task.ListQuery{AfterSeq: after, Limit: 1000})
		if err != nil {
			return nil, err
		}
		for _, t := range page {
			after = t.Seq
			o.count(t, byKind, now, hourAgo)
		}
		if len(page) < 1000 {
			break
		}
	}
	o.Partial = o.All >= maxScan
	o.Done = o.Succeeded + o.Failed
	for _, k := range sortedKeys(byKind) {
		o.Kinds = append(o.Kinds, *byKind[k])
	}
	return o, nil
}

func (o *overviewData) count(t *task.Task, byKind map[string]*kindCounts, now, hourAgo time.Time) {
	o.All++
	o.Total[string(t.State)]++
	k := byKind[t.Kind]
	if k == nil {
		k = &kindCounts{Kind: t.Kind, Counts: map[string]int{}}
		byKind[t.Kind] = k
	}
	k.Counts[string(t.State)]++
	k.All++
	if !t.UpdatedAt.Before(hourAgo) {
		switch t.State {
		case task.StateSucceeded:
			o.Succeeded++
		case task.StateFailed:
			o.Failed++
		}
	}
	if t.State == task.StatePending && !t.NextClaimAt.After(now) &&
		(o.OldestReady.IsZero() || t.NextClaimAt.Before(o.OldestReady)) {
		o.OldestReady = t.NextClaimAt
	}
}

// pageSize is the task list's page.
const pageSize = 50

// listFilter is the task list's query string.
type listFilter struct {
	State task.State
	Kind  string
	After int64
}

// parseFilter reads the filter, naming the field at fault.
func parseFilter(q url.Values) (listFilter, error) {
	var f listFilter
	if s := q.Get("state"); s != "" {
		st, err := task.ParseState(s)
		if err != nil {
			return f, err
		}
		f.State = st
	}
	f.Kind = q.Get("kind")
	if s := q.Get("after"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return f, badInput("after", "%q is not a cursor from this list", s)
		}
		f.After = n
	}
	return f, nil
}

// query is the filter as the store takes it.
func (f listFilter) query() task.ListQuery {
	return task.ListQuery{State: f.State, Kind: f.Kind, AfterSeq: f.After, Limit: pageSize}
}

// Values is the filter as a query string, without the cursor.
func (f listFilter) Values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("state", string(f.State))
	set("kind", f.Kind)
	return v
}

// tasksPage is the task list's data.
type tasksPage struct {
	Filter listFilter
	States []task.State
	Tasks  []*task.Task
	// Next is the URL of the next page ("" on the last); Self is this
	// page's, where actions return.
	Next, Self string
}

func (d *dashboard) tasks(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	list, err := d.store.List(r.Context(), f.query())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	p := tasksPage{Filter: f, States: states, Tasks: list, Self: r.URL.Path + "?" + r.URL.RawQuery}
	if len(list) == pageSize {
		v := f.Values()
		v.Set("after", strconv.FormatInt(list[len(list)-1].Seq, 10))
		p.Next = "/tasks?" + v.Encode()
	}
	d.render(w, r, http.StatusOK, "tasks", "Tasks", p)
}

// returnTo is the form's "back" field: the page to show after the action.
func returnTo(r *http.Request, fallback string) string {
	if b := r.PostForm.Get("back"); b != "" {
		return b
	}
	return fallback
}

func (d *dashboard) cancelTask(r *http.Request) (string, string, error) {
	return d.one(r, "cancelled", task.Cancel)
}

func (d *dashboard) retryTask(r *http.Request) (string, string, error) {
	return d.one(r, "retried", task.Retry)
}

// one runs fn on the form's task key and returns to its page.
func (d *dashboard) one(r *http.Request, verb string, fn func(context.Context, task.Store, string) (*task.Task, error)) (string, string, error) {
	key := r.PostForm.Get("key")
	if key == "" {
		return "", "", badInput("key", "must not be empty")
	}
	back := returnTo(r, "/task?key="+url.QueryEscape(key))
	if _, err := fn(r.Context(), d.store, key); err != nil {
		if errors.Is(err, task.ErrFinished) || errors.Is(err, task.ErrNotFinished) {
			return back, fmt.Sprintf("%s: %v", key, err), nil
		}
		return "", "", err
	}
	d.log.Info("web: dashboard "+verb, "key", key)
	return back, key + " " + verb, nil
}

// maxBulk bounds the keys of one bulk action.
const maxBulk = 500

// bulk cancels or retries the checked tasks, each on its own: one that
// cannot be (already finished, not finished) is counted and skipped.
func (d *dashboard) bulk(r *http.Request) (string, string, error) {
	var fn func(context.Context, task.Store, string) (*task.Task, error)
	verb := r.PostForm.Get("action")
	switch verb {
	case "cancel":
		fn, verb = task.Cancel, "cancelled"
	case "retry":
		fn, verb = task.Retry, "retried"
	default:
		return "", "", badInput("action", "%q is not one of cancel, retry", verb)
	}
	keys := r.PostForm["key"]
	if len(keys) == 0 {
		return returnTo(r, "/tasks"), "no task selected", nil
	}
	if len(keys) > maxBulk {
		return "", "", badInput("key", "%d tasks selected, at most %d at once", len(keys), maxBulk)
	}
	done, skipped := 0, 0
	for _, key := range keys {
		_, err := fn(r.Context(), d.store, key)
		switch {
		case err == nil:
			done++
		case errors.Is(err, task.ErrFinished), errors.Is(err, task.ErrNotFinished), errors.Is(err, task.ErrNotFound):
			skipped++
		default:
			return "", "", err
		}
	}
	d.log.Info("web: dashboard bulk "+verb, "done", done, "skipped", skipped)
	return returnTo(r, "/tasks"), fmt.Sprintf("%s %d, skipped %d", verb, done, skipped), nil
}
