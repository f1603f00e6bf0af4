package web

// The overview's figures, the task list with its filters and cursor
// paging, and the task actions (cancel, retry, bulk).

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// overviewData is the overview page's figures.
type overviewData struct {
	// Total counts per state; Kinds the same per kind.
	Total map[string]int64
	All   int64
	Kinds []kindCounts
	// Succeeded and Failed count the tasks that finished so in the last
	// hour (updated_at within it) among the newest recentScan tasks of
	// each state; Done is both. Capped says a state had more.
	Succeeded, Failed, Done int
	Capped                  bool
	RecentScan              int
	// OldestReady is the next_claim_at of the pending task that has waited
	// longest for a worker (zero: none waiting).
	OldestReady time.Time
	// Charts are drawn from the workers' counts (package stats).
	Charts *overviewCharts
}

// kindCounts is one kind's counts per state.
type kindCounts struct {
	Kind   string
	Counts map[string]int64
	All    int64
}

// recentScan bounds the finished tasks of each state the overview reads
// for its last-hour figures: newest first, so a busy queue costs the same
// as a quiet one.
const recentScan = 5000

// readOverview reads the counts from the store's Stats (indexes) and the
// last hour's outcomes from the newest finished tasks.
func (d *dashboard) readOverview(ctx context.Context) (*overviewData, error) {
	st, err := d.store.Stats(ctx)
	if err != nil {
		return nil, err
	}
	o := &overviewData{Total: map[string]int64{}, OldestReady: st.OldestReadyAt, RecentScan: recentScan}
	byKind := map[string]*kindCounts{}
	for _, c := range st.Counts {
		o.All += c.N
		o.Total[string(c.State)] += c.N
		k := byKind[c.Kind]
		if k == nil {
			k = &kindCounts{Kind: c.Kind, Counts: map[string]int64{}}
			byKind[c.Kind] = k
		}
		k.Counts[string(c.State)] += c.N
		k.All += c.N
	}
	for _, k := range sortedKeys(byKind) {
		o.Kinds = append(o.Kinds, *byKind[k])
	}
	hourAgo := d.store.Now().Add(-time.Hour)
	var capped bool
	if o.Succeeded, capped, err = d.finishedSince(ctx, task.StateSucceeded, hourAgo); err != nil {
		return nil, err
	}
	o.Capped = capped
	if o.Failed, capped, err = d.finishedSince(ctx, task.StateFailed, hourAgo); err != nil {
		return nil, err
	}
	o.Capped = o.Capped || capped
	o.Done = o.Succeeded + o.Failed
	return o, nil
}

// finishedSince counts the tasks in state updated after since, among the
// newest recentScan of that state; capped says there were more to read.
func (d *dashboard) finishedSince(ctx context.Context, state task.State, since time.Time) (n int, capped bool, err error) {
	const page = 1000
	var before int64
	for read := 0; read < recentScan; read += page {
		list, err := d.store.List(ctx, task.ListQuery{State: state, Desc: true, BeforeSeq: before, Limit: page})
		if err != nil {
			return 0, false, err
		}
		for _, t := range list {
			if t.UpdatedAt.After(since) {
				n++
			}
		}
		if len(list) < page {
			return n, false, nil
		}
		before = list[len(list)-1].Seq
	}
	return n, true, nil
}

// pageSize is the task list's page.
const pageSize = 50

// listFilter is the task list's query string.
type listFilter struct {
	State                       task.State
	Kind, Prefix, Worker, Text  string
	CreatedAfter, CreatedBefore string
	UpdatedAfter, UpdatedBefore string
	// Before is the cursor: the page holds tasks older (lower seq) than it.
	Before int64
	q      task.ListQuery
}

// parseFilter reads the filter, naming the field at fault.
func parseFilter(q url.Values, now time.Time) (listFilter, error) {
	f := listFilter{Kind: q.Get("kind"), Prefix: q.Get("prefix"), Worker: q.Get("worker"), Text: q.Get("text"),
		CreatedAfter: q.Get("created_after"), CreatedBefore: q.Get("created_before"),
		UpdatedAfter: q.Get("updated_after"), UpdatedBefore: q.Get("updated_before")}
	f.q = task.ListQuery{Kind: f.Kind, KeyPrefix: f.Prefix, WorkerID: f.Worker, Text: f.Text, Desc: true, Limit: pageSize}
	if s := q.Get("state"); s != "" {
		st, err := task.ParseState(s)
		if err != nil {
			return f, err
		}
		f.State, f.q.State = st, st
	}
	for _, tf := range []struct {
		name, value string
		to          *time.Time
	}{
		{"created_after", f.CreatedAfter, &f.q.CreatedAfter}, {"created_before", f.CreatedBefore, &f.q.CreatedBefore},
		{"updated_after", f.UpdatedAfter, &f.q.UpdatedAfter}, {"updated_before", f.UpdatedBefore, &f.q.UpdatedBefore},
	} {
		t, err := parseWhen(tf.name, tf.value, now)
		if err != nil {
			return f, err
		}
		*tf.to = t
	}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return f, badInput("before", "%q is not a cursor from this list", s)
		}
		f.Before, f.q.BeforeSeq = n, n
	}
	if err := f.q.Validate(); err != nil {
		return f, err
	}
	return f, nil
}

// parseWhen reads a time filter: RFC 3339, a browser's datetime-local
// ("2006-01-02T15:04", read as UTC), or a duration meaning that long
// before now ("90m"). Empty is no bound.
func parseWhen(field, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, badInput(field, "%q: want a time (2006-01-02T15:04:05Z) or a duration ago (90m)", s)
}

// Values is the filter as a query string, without the cursor.
func (f listFilter) Values() url.Values {
	v := url.Values{}
	for _, kv := range [][2]string{{"state", string(f.State)}, {"kind", f.Kind}, {"prefix", f.Prefix},
		{"worker", f.Worker}, {"text", f.Text}, {"created_after", f.CreatedAfter}, {"created_before", f.CreatedBefore},
		{"updated_after", f.UpdatedAfter}, {"updated_before", f.UpdatedBefore}} {
		if kv[1] != "" {
			v.Set(kv[0], kv[1])
		}
	}
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
	f, err := parseFilter(r.URL.Query(), d.store.Now())
	if err != nil {
		d.fail(w, r, err)
		return
	}
	list, err := d.store.List(r.Context(), f.q)
	if err != nil {
		d.fail(w, r, err)
		return
	}
	p := tasksPage{Filter: f, States: states, Tasks: list, Self: r.URL.Path + "?" + r.URL.RawQuery}
	if len(list) == pageSize {
		v := f.Values()
		v.Set("before", strconv.FormatInt(list[len(list)-1].Seq, 10))
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
	return d.one(r, "cancel", "cancelled", task.Cancel)
}

func (d *dashboard) retryTask(r *http.Request) (string, string, error) {
	return d.one(r, "retry", "retried", task.Retry)
}

// one runs fn on the form's task key and returns to its page.
func (d *dashboard) one(r *http.Request, action, verb string, fn func(context.Context, task.Store, string) (*task.Task, error)) (string, string, error) {
	key := r.PostForm.Get("key")
	if key == "" {
		return "", "", badInput("key", "must not be empty")
	}
	if task.Reserved(key) {
		return "", "", task.ErrNotFound // leasepool's own document, not a task
	}
	back := returnTo(r, "/task?key="+url.QueryEscape(key))
	if _, err := fn(r.Context(), d.store, key); err != nil {
		if errors.Is(err, task.ErrFinished) || errors.Is(err, task.ErrNotFinished) {
			return back, action + "-refused", nil
		}
		return "", "", err
	}
	d.log.Info("web: dashboard "+verb, "key", key)
	return back, verb, nil
}

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
		return returnTo(r, "/tasks"), "none-selected", nil
	}
	if len(keys) > maxBulk {
		return "", "", badInput("key", "%d tasks selected, at most %d at once", len(keys), maxBulk)
	}
	done, skipped, failed := 0, 0, 0
	for _, key := range keys {
		var err error
		if task.Reserved(key) {
			err = task.ErrNotFound // leasepool's own document, not a task
		} else {
			_, err = fn(r.Context(), d.store, key)
		}
		switch {
		case err == nil:
			done++
		case errors.Is(err, task.ErrFinished), errors.Is(err, task.ErrNotFinished), errors.Is(err, task.ErrNotFound):
			skipped++
		default:
			// Carry on: the others are independent, and the count says it.
			failed++
			d.log.Error("web: dashboard bulk "+verb, "key", key, "err", err)
		}
	}
	d.log.Info("web: dashboard bulk "+verb, "done", done, "skipped", skipped, "failed", failed)
	return returnTo(r, "/tasks"), bulkCode(verb, done, skipped, failed), nil
}
