package web

// POST /api/v1/tasks/batch: publish many tasks in one request, each with
// the body of POST /api/v1/tasks, each answered in order. The body is read
// as a stream of items within a byte and an item bound, so no body can
// hold more than maxBatchBody in memory.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Bounds of one batch: the tasks it holds and its body's bytes.
const (
	MaxBatchTasks = 10_000
	MaxBatchBody  = 32 << 20
)

// ParsePublish reads one publish body (the JSON object POST
// /api/v1/tasks takes) and validates it as that request does: errors wrap
// task.ErrInvalid and name the field ("body" for the object itself).
// `leasepool publish --file` reads its lines with it.
func ParsePublish(b []byte, now time.Time) (task.PublishParams, error) {
	var body publishBody
	if err := decodeBytes(b, &body, nil); err != nil {
		return task.PublishParams{}, err
	}
	return body.params(now)
}

// BatchItem is one task's outcome in a batch publish: Result is
// inserted, existing, rerun or debounced (State is then the task's), refused (Error
// names the field, as tasks[i].field: reason) or failed (a store error;
// the task may or may not be stored: publish it again).
type BatchItem struct {
	Key    string     `json:"key,omitempty"`
	Result string     `json:"result"`
	State  task.State `json:"state,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// The results of a batch item besides task.PublishResult's.
const (
	ResultRefused = "refused"
	ResultFailed  = "failed"
)

// BatchResponse answers a batch publish: one result per task, in order,
// and their counts. Warnings are the kinds no live worker runs, each once.
type BatchResponse struct {
	Results  []BatchItem `json:"results"`
	Inserted int         `json:"inserted"`
	Existing int         `json:"existing"`
	Rerun    int         `json:"rerun"`
	// Debounced counts the items that moved a pending task (debounce).
	Debounced int      `json:"debounced"`
	Refused   int      `json:"refused"`
	Failed    int      `json:"failed"`
	Warnings  []string `json:"warnings,omitempty"`
}

// readBatch reads {"tasks": [...]} from r's body, item by item, refusing
// more than MaxBatchTasks items or MaxBatchBody bytes as soon as it reads
// past them.
func readBatch(w http.ResponseWriter, r *http.Request) ([]json.RawMessage, error) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBatchBody))
	shape := func(err error) error {
		if me := (*http.MaxBytesError)(nil); errors.As(err, &me) {
			return fmt.Errorf("%w: body: larger than %d bytes", errTooLarge, me.Limit)
		}
		if err != nil {
			return badInput("body", `want {"tasks": [...]}: %v`, err)
		}
		return badInput("body", `want {"tasks": [...]}`)
	}
	want := func(d json.Delim) error {
		tok, err := dec.Token()
		if err != nil || tok != d {
			return shape(err)
		}
		return nil
	}
	if err := want('{'); err != nil {
		return nil, err
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, shape(err)
	}
	if tok != "tasks" {
		return nil, badInput("body", `want {"tasks": [...]}, got field %q`, tok)
	}
	if err := want('['); err != nil {
		return nil, err
	}
	var items []json.RawMessage
	for dec.More() {
		if len(items) == MaxBatchTasks {
			return nil, fmt.Errorf("%w: tasks: more than %d tasks in one request", errTooLarge, MaxBatchTasks)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, shape(err)
		}
		items = append(items, raw)
	}
	if err := want(']'); err != nil {
		return nil, err
	}
	if err := want('}'); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err == nil {
			return nil, badInput("body", `want {"tasks": [...]} alone, got more after it`)
		}
		return nil, shape(err)
	}
	if len(items) == 0 {
		return nil, badInput("tasks", "want at least one task")
	}
	return items, nil
}

// itemError is err, a refusal of tasks[i], naming the field within it.
func itemError(i int, err error) string {
	why := reason(err)
	if rest, ok := strings.CutPrefix(why, "body: "); ok {
		return fmt.Sprintf("tasks[%d]: %s", i, rest)
	}
	return fmt.Sprintf("tasks[%d].%s", i, why)
}

// publishBatch answers 200 with every task's outcome once the body is
// read: a refused task stops none of the others. A body over a bound is
// 413 and one that is not {"tasks": [...]} is 400, with nothing written.
// ?strict=true refuses the tasks of a kind no live worker runs, each as
// refused naming tasks[i].kind.
func (a *api) publishBatch(w http.ResponseWriter, r *http.Request) {
	strict, err := strictParam(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ctx, err := traced(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	items, err := readBatch(w, r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	resp := BatchResponse{Results: make([]BatchItem, len(items))}
	ps := make([]task.PublishParams, 0, len(items))
	at := make([]int, 0, len(items)) // ps[j] is tasks[at[j]]
	var refs []kindRef
	seen := map[string]bool{}
	now := a.store.Now()
	for i, raw := range items {
		p, err := ParsePublish(raw, now)
		if err != nil {
			key := p.Key // echoed only when it is one
			if task.ValidateName("key", key) != nil {
				key = ""
			}
			resp.Results[i] = BatchItem{Key: key, Result: ResultRefused, Error: itemError(i, err)}
			continue
		}
		ps, at = append(ps, p), append(at, i)
		if !seen[p.Kind] {
			seen[p.Kind] = true
			refs = append(refs, kindRef{fmt.Sprintf("tasks[%d].kind", i), p.Kind})
		}
	}
	items = nil // the params hold what they need (payloads) of the body
	if len(refs) > 0 {
		missing, err := task.KindsWithoutWorker(r.Context(), a.store, now, kindsOf(refs)...)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		if strict && len(missing) > 0 {
			ps, at = a.refuseMissing(ps, at, missing, resp.Results)
		} else {
			for _, n := range missing {
				resp.Warnings = append(resp.Warnings, n.Warning())
			}
		}
	}
	out, err := task.PublishMany(ctx, a.store, ps)
	if err != nil {
		a.log.Warn("web: batch publish stopped", "err", err, "tasks", len(ps))
	}
	var failed error
	for j, o := range out {
		i := at[j]
		switch {
		case errors.Is(o.Err, task.ErrInvalid):
			resp.Results[i] = BatchItem{Key: ps[j].Key, Result: ResultRefused, Error: itemError(i, o.Err)}
		case o.Err != nil:
			failed = o.Err
			resp.Results[i] = BatchItem{Key: ps[j].Key, Result: ResultFailed, Error: "store error (logged); publish it again"}
		default:
			resp.Results[i] = BatchItem{Key: o.Task.Key, Result: string(o.Result), State: o.Task.State}
		}
	}
	for _, it := range resp.Results {
		switch it.Result {
		case string(task.Inserted):
			resp.Inserted++
		case string(task.Existing):
			resp.Existing++
		case string(task.Rerun):
			resp.Rerun++
		case string(task.Debounced):
			resp.Debounced++
		case ResultRefused:
			resp.Refused++
		case ResultFailed:
			resp.Failed++
		}
	}
	if failed != nil {
		a.log.Error("web: batch publish: store error", "err", failed, "failed", resp.Failed)
	}
	a.log.Info("web: batch published", "tasks", len(resp.Results), "inserted", resp.Inserted,
		"existing", resp.Existing, "rerun", resp.Rerun, "debounced", resp.Debounced, "refused", resp.Refused, "failed", resp.Failed)
	writeJSON(w, http.StatusOK, resp)
}

// refuseMissing marks refused, in results, the tasks of ps whose kind is
// missing (no live worker runs it), and returns the others.
func (a *api) refuseMissing(ps []task.PublishParams, at []int, missing []task.NoWorker, results []BatchItem) ([]task.PublishParams, []int) {
	no := make(map[string]task.NoWorker, len(missing))
	for _, n := range missing {
		no[n.Kind] = n
	}
	keep, keepAt := ps[:0], at[:0]
	for j, p := range ps {
		n, ok := no[p.Kind]
		if !ok {
			keep, keepAt = append(keep, p), append(keepAt, at[j])
			continue
		}
		i := at[j]
		results[i] = BatchItem{Key: p.Key, Result: ResultRefused, Error: reason(n.Refusal(fmt.Sprintf("tasks[%d].kind", i)))}
	}
	return keep, keepAt
}

func kindsOf(refs []kindRef) []string {
	kinds := make([]string, len(refs))
	for i, r := range refs {
		kinds[i] = r.kind
	}
	return kinds
}
