package events

// Following a store: the change stream, its documents turned into events,
// and the tokens that resume right after any one of them.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// Params selects what Follow delivers.
type Params struct {
	// After resumes right after the event whose Token it is; empty starts
	// from now.
	After string
	// Kinds keeps events of tasks of these kinds (and no rollout event);
	// empty keeps all.
	Kinds []string
	// Key keeps events of this task only (and no rollout event); empty
	// keeps all.
	Key string
	// Rollout keeps events of this rollout only (and no task event);
	// empty keeps all.
	Rollout string
	// Types keeps these event types (Published, …); empty keeps all.
	Types []string
}

// Stream delivers events in the store's write order. It is not safe for
// concurrent use.
type Stream struct {
	s  task.Store
	cs task.ChangeStream
	p  Params

	prev    task.Token // the change before the one pending came from
	pending []Event
	skip    int              // events of the first change already delivered before a resume
	tok     string           // resumes after the last event returned (or change passed)
	derived map[string]int64 // rollout document id → the last version derived
	// tasksOnly: rollout events were asked for but the store could not
	// carry them (see Follow).
	tasksOnly bool
}

// Follow opens a stream of lifecycle events from s. Resuming from a token
// the store no longer has history for fails with an error wrapping
// task.ErrHistoryLost: the caller decides whether to start from now.
//
// Where a backend's change event carries no document (task.Event.Task
// nil), the task is re-read by key; the document read may be of a later
// write, so that change's own events are lost and the later write's events
// come twice (once here, once with its own change). The same holds where
// the stream carries the current document rather than the write's own:
// MongoDB's change streams look the document up when the event is read,
// so it may be a later write's (task.Event.Version tells): such a change
// yields its claims alone (DeriveClaims), whose attempts record the
// version of their write; its other events are lost, none is repeated.
// So a follower gets every claim however fast the task ran on, and the
// other events of every write not overtaken by the task's next write
// before the follower read it. The embedded store records each write's
// own document: exact.
//
// Rollout events come from the writes of rollouts' documents
// (WatchParams.Documents), each write's own events told apart by the
// version every event carries: exact on the embedded store. MongoDB
// delivers document writes from a second stream, in order among themselves
// but not with task writes, and a replace carries the document it wrote;
// where it carries a later one (a looked-up document), a write already
// derived is not derived again, so none is repeated on one stream. Params
// that keep rollout events alone (Rollout, or rollout Types only) follow
// the document writes alone (task.WatchParams.NoTasks); their tokens
// resume such a stream only. Params that keep both kinds need a token
// naming both streams' positions: a store that cannot name one when the
// stream opens (the MongoDB wire test server names none for a document
// stream before its first event) could hand out none, so Follow then
// follows task events alone and TasksOnly says so.
//
// Where the store gives no
// position before the first change (a MongoDB stream that has seen no
// batch yet), the first change's events all carry its own token, so a
// resume from one of its earlier events skips the rest of that change.
func Follow(ctx context.Context, s task.Store, p Params) (*Stream, error) {
	after, skip, err := parseToken(p.After)
	if err != nil {
		return nil, err
	}
	rolloutsOnly := !p.keepsTasks()
	cs, err := s.Watch(ctx, task.WatchParams{ResumeAfter: after, Documents: []string{RolloutNamespace}, NoTasks: rolloutsOnly})
	tasksOnly := false
	if err == nil && !rolloutsOnly && len(cs.ResumeToken()) == 0 {
		_ = cs.Close()
		cs, err = s.Watch(ctx, task.WatchParams{ResumeAfter: after})
		tasksOnly = p.keepsRollouts()
	}
	if err != nil {
		return nil, fmt.Errorf("events: follow: %w", err)
	}
	st := &Stream{s: s, cs: cs, p: p, prev: after, skip: skip, tok: p.After, derived: map[string]int64{}, tasksOnly: tasksOnly}
	if st.prev == nil {
		// From now: a token of the current position, where the store gives
		// one, so the caller can resume before the first event too.
		if st.prev = cs.ResumeToken(); len(st.prev) > 0 {
			st.tok = formatToken(st.prev, 0)
		}
	}
	return st, nil
}

// TasksOnly reports whether the stream follows task events alone although
// its Params keep rollout events too: the store could name no position
// for rollouts' document writes when it opened (see Follow). Following
// with Params that keep rollout events alone delivers them there.
func (st *Stream) TasksOnly() bool { return st.tasksOnly }

// Token resumes right after the last event Next returned, or after the
// last change passed over; it equals the last returned event's Token
// unless later changes yielded no event this stream keeps.
func (st *Stream) Token() string { return st.tok }

// Close ends the stream.
func (st *Stream) Close() error { return st.cs.Close() }

// Next blocks until the next event this stream keeps, an error, or ctx
// ends. A store error (task.ErrHistoryLost among them) is returned
// wrapped; the stream is dead then and may be followed again from Token.
func (st *Stream) Next(ctx context.Context) (Event, error) {
	for {
		for len(st.pending) > 0 {
			e := st.pending[0]
			st.pending = st.pending[1:]
			st.tok = e.Token
			if st.keep(e) {
				return e, nil
			}
		}
		if err := st.fill(ctx); err != nil {
			return Event{}, err
		}
	}
}

// fill derives the events of the next change into pending.
func (st *Stream) fill(ctx context.Context) error {
	ch, err := st.cs.Next(ctx)
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	evs, err := st.derive(ctx, ch)
	if err != nil {
		return err
	}
	last := formatToken(ch.Token, 0)
	for i := range evs {
		evs[i].Token = last
		if i < len(evs)-1 && len(st.prev) > 0 {
			// Mid-change: after the previous change, skipping i+1 events.
			evs[i].Token = formatToken(st.prev, i+1)
		}
	}
	evs = evs[min(st.skip, len(evs)):]
	st.skip = 0
	st.prev = ch.Token
	st.tok = last
	st.pending = evs
	return nil
}

// derive returns the events of one change.
func (st *Stream) derive(ctx context.Context, ch task.Event) ([]Event, error) {
	if d := ch.Document; d != nil {
		if ch.DocumentDeleted {
			delete(st.derived, d.ID) // a rollout made again starts at version 1
			return nil, nil
		}
		// A change that could not carry its document (Version 0) yields
		// none: a re-read could be a later write's, whose events its own
		// change yields. So does one that carries a document this stream
		// derived already (MongoDB's looked-up documents).
		if d.Namespace != RolloutNamespace || d.Version <= st.derived[d.ID] {
			return nil, nil
		}
		st.derived[d.ID] = d.Version
		return DeriveRollout(d), nil
	}
	doc := ch.Task
	if doc == nil && !strings.HasPrefix(ch.Key, ReservedPrefix) {
		var err error
		if doc, err = st.s.Get(ctx, ch.Key); errors.Is(err, task.ErrNotFound) {
			doc = nil
		} else if err != nil {
			return nil, fmt.Errorf("events: re-read %s: %w", ch.Key, err)
		}
	}
	if ch.Version != 0 && doc != nil && doc.Version != ch.Version {
		// The document is a later write's, whose own change yields its
		// events: of this write's, only its claim can be told.
		return DeriveClaims(doc, ch.Version), nil
	}
	return Derive(doc), nil
}

// keepsTasks reports whether p keeps any task event.
func (p Params) keepsTasks() bool {
	return p.Rollout == "" && (len(p.Types) == 0 || slices.ContainsFunc(p.Types, func(t string) bool { return !isRolloutType(t) }))
}

// keepsRollouts reports whether p keeps any rollout event.
func (p Params) keepsRollouts() bool {
	return len(p.Kinds) == 0 && p.Key == "" && (len(p.Types) == 0 || slices.ContainsFunc(p.Types, isRolloutType))
}

func (st *Stream) keep(e Event) bool {
	if e.Rollout != "" {
		return len(st.p.Kinds) == 0 && st.p.Key == "" &&
			(st.p.Rollout == "" || e.Rollout == st.p.Rollout) &&
			(len(st.p.Types) == 0 || slices.Contains(st.p.Types, e.Type))
	}
	return st.p.Rollout == "" && (st.p.Key == "" || e.Key == st.p.Key) &&
		(len(st.p.Kinds) == 0 || slices.Contains(st.p.Kinds, e.Kind)) &&
		(len(st.p.Types) == 0 || slices.Contains(st.p.Types, e.Type))
}

// A token is the store's change token in unpadded base64url, followed for
// an event that is not its change's last by "." and how many events of the
// next change to skip.
func formatToken(t task.Token, skip int) string {
	s := base64.RawURLEncoding.EncodeToString(t)
	if skip > 0 {
		s += "." + strconv.Itoa(skip)
	}
	return s
}

func parseToken(s string) (task.Token, int, error) {
	if s == "" {
		return nil, 0, nil
	}
	b, n, found := strings.Cut(s, ".")
	tok, err := base64.RawURLEncoding.DecodeString(b)
	skip := 0
	if err == nil && found {
		skip, err = strconv.Atoi(n)
		if err == nil && skip <= 0 {
			err = errors.New("skip count not positive")
		}
	}
	if err != nil || len(tok) == 0 {
		return nil, 0, fmt.Errorf("%w: events token %q: %v", task.ErrInvalid, s, err)
	}
	return tok, skip, nil
}

// ValidateToken checks that s is a token as Stream gives them (it may
// still be one whose history the store no longer has), so a caller can
// refuse bad input before it follows.
func ValidateToken(s string) error {
	_, _, err := parseToken(s)
	return err
}
