package web

// The list query as the API takes it (query parameters, or a bulk body's
// filter) and its cursors.
//
// A cursor is opaque to clients: "a" or "b" and a seq, in base64url, for
// "the tasks after (newer than) / before (older than) this seq". A page
// reads toward its cursor's side from the seq, by the seq indexes, and is
// shown in the requested order; next_cursor continues in that order,
// prev_cursor goes back. Neither counts anything, so every page costs the
// same on a million tasks.

import (
	"context"
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Page sizes of GET /api/v1/tasks.
const (
	defaultLimit = 50
	maxLimit     = 1000
)

// filterBody is the list filter by the names of the query parameters.
type filterBody struct {
	State         string    `json:"state"`
	Kind          string    `json:"kind"`
	KeyPrefix     string    `json:"key_prefix"`
	Worker        string    `json:"worker"`
	Text          string    `json:"text"`
	CreatedAfter  time.Time `json:"created_after"`
	CreatedBefore time.Time `json:"created_before"`
	UpdatedAfter  time.Time `json:"updated_after"`
	UpdatedBefore time.Time `json:"updated_before"`
}

// query validates f into a store query, naming the field at fault.
func (f filterBody) query() (task.ListQuery, error) {
	q := task.ListQuery{Kind: f.Kind, KeyPrefix: f.KeyPrefix, WorkerID: f.Worker, Text: f.Text,
		CreatedAfter: f.CreatedAfter, CreatedBefore: f.CreatedBefore,
		UpdatedAfter: f.UpdatedAfter, UpdatedBefore: f.UpdatedBefore}
	if f.State != "" {
		st, err := task.ParseState(f.State)
		if err != nil {
			return q, err // names state
		}
		q.State = st
	}
	for _, s := range []struct{ name, v string }{{"kind", f.Kind}, {"key_prefix", f.KeyPrefix}, {"worker", f.Worker}, {"text", f.Text}} {
		if len(s.v) > task.MaxNameLen {
			return q, badInput(s.name, "is longer than %d bytes", task.MaxNameLen)
		}
	}
	return q, nil
}

// listQuery is one GET /api/v1/tasks request.
type listQuery struct {
	q      task.ListQuery // filters only
	asc    bool           // oldest first; default newest first
	limit  int
	cursor cursor
}

// cursor is a seq bound: newer than Seq (after) or older than it.
type cursor struct {
	after bool
	seq   int64
}

func (c cursor) String() string {
	p := "b"
	if c.after {
		p = "a"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(p + strconv.FormatInt(c.seq, 10)))
}

func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil && len(b) > 1 && (b[0] == 'a' || b[0] == 'b') {
		n, err := strconv.ParseInt(string(b[1:]), 10, 64)
		if err == nil && n >= 0 {
			return cursor{after: b[0] == 'a', seq: n}, nil
		}
	}
	return cursor{}, badInput("cursor", "%q is not a cursor this API gave", s)
}

// parseListQuery reads the query parameters: the filter's names, order
// (desc, asc), limit and cursor. Unknown parameters are refused, so a typo
// does not silently list everything.
func parseListQuery(v url.Values) (listQuery, error) {
	known := []string{"state", "kind", "key_prefix", "worker", "text", "created_after", "created_before",
		"updated_after", "updated_before", "order", "limit", "cursor"}
	for k := range v {
		if !slices.Contains(known, k) {
			return listQuery{}, badInput(k, "unknown parameter (known: %s)", strings.Join(known, ", "))
		}
	}
	f := filterBody{State: v.Get("state"), Kind: v.Get("kind"), KeyPrefix: v.Get("key_prefix"), Worker: v.Get("worker"), Text: v.Get("text")}
	for _, t := range []struct {
		name string
		dst  *time.Time
	}{{"created_after", &f.CreatedAfter}, {"created_before", &f.CreatedBefore}, {"updated_after", &f.UpdatedAfter}, {"updated_before", &f.UpdatedBefore}} {
		if s := v.Get(t.name); s != "" {
			at, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return listQuery{}, badInput(t.name, "%q is not an RFC 3339 time", s)
			}
			*t.dst = at
		}
	}
	q, err := f.query()
	if err != nil {
		return listQuery{}, err
	}
	lq := listQuery{q: q, limit: defaultLimit}
	switch o := v.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, badInput("order", "%q is not one of desc, asc", o)
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			return lq, badInput("limit", "%q is not a number from 1 to %d", s, maxLimit)
		}
		lq.limit = n
	}
	lq.cursor = cursor{after: lq.asc}
	if s := v.Get("cursor"); s != "" {
		if lq.cursor, err = parseCursor(s); err != nil {
			return lq, err
		}
	}
	return lq, nil
}

// page reads one page: limit+1 tasks toward the cursor's side (the extra
// one tells whether more lie that way), shown in the requested order.
func (lq listQuery) page(ctx context.Context, st task.Store) (listResponse, error) {
	q := lq.q
	q.Limit = lq.limit + 1
	c := lq.cursor
	q.Desc = !c.after
	if c.after {
		q.AfterSeq = c.seq
	} else {
		q.BeforeSeq = c.seq
	}
	ts, err := st.List(ctx, q)
	if err != nil {
		return listResponse{}, err
	}
	more := len(ts) > lq.limit
	ts = ts[:min(len(ts), lq.limit)]
	toward := c.after == lq.asc // read in the order shown
	if !toward {
		slices.Reverse(ts)
	}
	resp := listResponse{Tasks: ts}
	if resp.Tasks == nil {
		resp.Tasks = []*task.Task{}
	}
	if len(ts) == 0 {
		return resp, nil
	}
	first, last := ts[0].Seq, ts[len(ts)-1].Seq
	// Forward: more in the order shown past the last; back: before the first.
	if !toward || more {
		resp.NextCursor = cursor{after: lq.asc, seq: last}.String()
	}
	if (toward && c.seq != 0) || (!toward && more) {
		resp.PrevCursor = cursor{after: !lq.asc, seq: first}.String()
	}
	return resp, nil
}
