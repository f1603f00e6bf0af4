package web

// GET /api/v1/events: the lifecycle events of package events as
// Server-Sent Events. Each event's id is its resume token, so a browser's
// EventSource resumes by itself after a drop (Last-Event-ID) and receives
// every event once; ?since=TOKEN does the same for other clients.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/leasepool/leasepool/events"
	"github.com/leasepool/leasepool/task"
)

// DefaultHeartbeat is how often an idle event stream sends a comment, so
// that proxies keep it open and a dead client is noticed.
const DefaultHeartbeat = 15 * time.Second

// eventParams reads the filters (kind and type: comma-separated lists;
// key; rollout) and where to resume: the Last-Event-ID header, else ?since=.
func eventParams(r *http.Request) (events.Params, error) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "kind", "key", "rollout", "type", "since":
		default:
			return events.Params{}, badInput(k, "unknown parameter (known: kind, key, rollout, type, since)")
		}
	}
	p := events.Params{Key: q.Get("key"), Rollout: q.Get("rollout"), After: q.Get("since")}
	if s := q.Get("kind"); s != "" {
		p.Kinds = strings.Split(s, ",")
	}
	if s := q.Get("type"); s != "" {
		p.Types = strings.Split(s, ",")
		for _, t := range p.Types {
			if !isEventType(t) {
				return p, badInput("type", "%q is not one of %s", t, strings.Join(events.Types, ", "))
			}
		}
	}
	field := "since"
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		p.After, field = id, "Last-Event-ID"
	}
	if p.After != "" {
		if err := events.ValidateToken(p.After); err != nil {
			return p, badInput(field, "%s", reason(err))
		}
	}
	return p, nil
}

func isEventType(t string) bool {
	for _, x := range events.Types {
		if x == t {
			return true
		}
	}
	return false
}

// streamEvents follows the store until the client goes (or the server
// shuts down): one SSE message per event, flushed at once, and a comment
// every heartbeat while idle.
func (a *api) streamEvents(w http.ResponseWriter, r *http.Request) {
	p, err := eventParams(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st, err := events.Follow(ctx, a.store, p)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	next := make(chan nextResult)
	followed := make(chan struct{})
	defer func() {
		// follow is st's one reader: stop it before closing st.
		cancel()
		<-followed
		st.Close()
	}()
	// A stream outlives the server's WriteTimeout by design: each write
	// gets its own bound instead. (The server lifts ReadTimeout itself
	// once the request is read.)
	a.bound(rc)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	// The position now, so a client that drops before the first event
	// still resumes from here (an id alone dispatches no event).
	if tok := st.Token(); tok != "" {
		fmt.Fprintf(w, "id: %s\n\n", tok)
	}
	if err := rc.Flush(); err != nil {
		close(followed)
		return
	}
	go func() {
		defer close(followed)
		follow(ctx, st, next)
	}()
	a.pump(ctx, w, rc, next)
}

type nextResult struct {
	ev  events.Event
	err error
}

// follow is the one reader of st: it hands each event to out until an
// error, which it hands over last.
func follow(ctx context.Context, st *events.Stream, out chan<- nextResult) {
	for {
		ev, err := st.Next(ctx)
		select {
		case out <- nextResult{ev, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// pump writes what follow hands over, and heartbeats, until ctx ends, a
// write fails (the client went) or the stream fails.
func (a *api) pump(ctx context.Context, w http.ResponseWriter, rc *http.ResponseController, next <-chan nextResult) {
	beat := time.NewTicker(a.heartbeat)
	defer beat.Stop()
	for {
		var err error
		select {
		case <-ctx.Done():
			return
		case <-a.stop: // nil: never
			return
		case <-beat.C:
			a.bound(rc)
			_, err = fmt.Fprint(w, ": heartbeat\n\n")
		case n := <-next:
			a.bound(rc)
			if n.err != nil {
				if ctx.Err() == nil {
					a.streamFailed(w, n.err)
				}
				return
			}
			err = writeEvent(w, n.ev)
		}
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			return // the client went away
		}
	}
}

// bound gives the stream's next write (and its flush) its own deadline:
// a client that stops reading is dropped, one that reads is kept.
func (a *api) bound(rc *http.ResponseController) {
	_ = rc.SetWriteDeadline(time.Now().Add(a.writeTimeout))
}

func writeEvent(w http.ResponseWriter, ev events.Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "id: %s\ndata: %s\n\n", ev.Token, b)
	return err
}

// streamFailed ends a stream with an "error" event; the client resumes
// from its last id, or on history_lost starts over by re-listing tasks.
func (a *api) streamFailed(w http.ResponseWriter, err error) {
	code := "internal"
	if errors.Is(err, task.ErrHistoryLost) {
		code = "history_lost"
	} else {
		a.log.Error("web: event stream failed", "err", err)
	}
	b, _ := json.Marshal(map[string]string{"error": code})
	fmt.Fprintf(w, "event: error\ndata: %s\n\n", b)
}
