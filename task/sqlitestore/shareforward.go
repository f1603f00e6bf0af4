// shareforward.go is the client's side of sharing a store file (share.go):
// each write of the Store is sent to the writer when one is connected,
// and otherwise, or when the writer refused it unapplied, made here. A
// write whose answer never came is resolved here once the writer can no
// longer apply it.

package sqlitestore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// errOutcomeUnknown: a forwarded write whose outcome the file does not
// tell (the task was written again since).
var errOutcomeUnknown = errors.New("sqlitestore: the writer process did not answer and the write may have applied")

type forwardOutcome int

const (
	// forwardDirect: nothing was applied; write the file directly.
	forwardDirect forwardOutcome = iota
	// forwardAnswered: the writer answered (the reply may hold an error).
	forwardAnswered
	// forwardUnknown: the writer did not answer and no longer can apply
	// the request; read the file to learn whether it did.
	forwardUnknown
	// forwardCancelled: the caller's context ended first; the outcome is
	// unknown, as when a caller stops waiting for a write of its own.
	forwardCancelled
)

// forward sends req to the writer, if one is connected, and waits for its
// answer until req's deadline.
func (s *Store) forward(ctx context.Context, req *wireRequest) (*wireReply, forwardOutcome) {
	c := s.writerConn()
	if c == nil || s.closed.Load() {
		return nil, forwardDirect
	}
	now := s.clock.now()
	wait := forwardWait
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d))
	}
	if wait <= 0 {
		return nil, forwardDirect
	}
	req.Deadline = now + int64(wait)
	req.Internal = task.IsInternalWrite(ctx)
	ch, id, err := c.send(req)
	if err != nil {
		return nil, forwardDirect
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case rep := <-ch:
		if rep.Err != nil {
			switch rep.Err.Kind {
			case kindNotApplied:
				return nil, forwardDirect
			case kindUnknown:
				s.fence(req.Deadline)
				return nil, forwardUnknown
			}
		}
		return rep, forwardAnswered
	case <-ctx.Done():
		c.forget(id)
		return nil, forwardCancelled
	case <-t.C:
		c.forget(id)
		s.dropConn(c)
	case <-c.dead:
	}
	s.fence(req.Deadline)
	return nil, forwardUnknown
}

// fence returns once a request with deadline can no longer be applied by
// the writer: after the deadline, when the write lock is free of any
// transaction that began before it.
func (s *Store) fence(deadline int64) {
	if d := time.Duration(deadline - s.clock.now()); d > 0 {
		time.Sleep(d + time.Millisecond)
	}
	if unlock, err := s.lockWrites(); err == nil {
		unlock()
	}
}

// Insert stores t unless its key exists; see task.Store.
func (s *Store) Insert(ctx context.Context, t *task.Task) (*task.Task, bool, error) {
	doc, payload, err := wireTask(t)
	if err != nil {
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
	}
	rep, out := s.forward(ctx, &wireRequest{Method: methodInsert, Task: doc, Payload: payload})
	switch out {
	case forwardAnswered:
		if rep.Err != nil {
			return nil, false, rep.Err.toError()
		}
		if !rep.Inserted {
			stored, err := fromWire(rep.Stored, rep.StoredPayload)
			if err != nil {
				return nil, false, fmt.Errorf("insert %s: %w", t.Key, err)
			}
			stored.Seq, stored.Version = rep.Seq, rep.Version
			s.seen.note(stored)
			return stored, false, nil
		}
		s.inserted(t, rep.Seq, rep.Change)
		return t, true, nil
	case forwardCancelled:
		return nil, false, fmt.Errorf("insert %s: %w", t.Key, ctx.Err())
	case forwardUnknown:
		// A stored task made when t was (CreatedAt is set by the publisher,
		// to the nanosecond) is this insert's.
		stored, err := s.Get(ctx, t.Key)
		if err == nil && stored.Kind == t.Kind && stored.CreatedAt.Equal(t.CreatedAt) && bytes.Equal(stored.Payload, t.Payload) {
			t.ID, t.Seq, t.Version = stored.ID, stored.Seq, 1
			return t, true, nil
		}
	}
	stored, inserted, _, err := s.insert(ctx, t)
	return stored, inserted, err
}

// inserted sets what the writer assigned to t and keeps it for this
// Store's own streams, as insert does for a write of its own.
func (s *Store) inserted(t *task.Task, seq, change int64) {
	t.ID, t.Seq, t.Version = fmt.Sprint(seq), seq, 1
	kept := t.Clone()
	s.remember(change, kept)
	s.seen.note(kept)
}

// Update writes t if the stored version is t.Version; see task.Store.
func (s *Store) Update(ctx context.Context, t *task.Task) error {
	doc, payload, err := wireTask(t)
	if err != nil {
		return fmt.Errorf("update %s: %w", t.Key, err)
	}
	req := &wireRequest{Method: methodUpdate, Task: doc, Payload: payload, Seq: t.Seq, Version: t.Version}
	if kind, state, ok := s.seen.lookup(t.Seq, t.Version); ok {
		req.Prev = &seenWire{Kind: kind, State: state}
	}
	rep, out := s.forward(ctx, req)
	switch out {
	case forwardAnswered:
		if rep.Err != nil {
			return rep.Err.toError()
		}
		t.Version = rep.Version
		kept := t.Clone()
		s.remember(rep.Change, kept)
		s.seen.note(kept)
		return nil
	case forwardCancelled:
		return fmt.Errorf("update %s: %w", t.Key, ctx.Err())
	case forwardUnknown:
		stored, err := s.Get(ctx, t.Key)
		switch {
		case err != nil || stored.Seq != t.Seq || stored.Version < t.Version:
			// Gone or replaced: not this version's to write; update says which.
		case stored.Version == t.Version:
			// Not applied.
		case stored.Version == t.Version+1 && sameDocument(stored, t):
			t.Version = stored.Version
			return nil
		case stored.Version == t.Version+1:
			return fmt.Errorf("update %s: version %d: %w", t.Key, t.Version, task.ErrConflict)
		default:
			return fmt.Errorf("update %s: %w", t.Key, errOutcomeUnknown)
		}
	}
	_, err = s.update(ctx, t)
	return err
}

// sameDocument reports whether stored is t as written by Update(t).
func sameDocument(stored, t *task.Task) bool {
	c := *t
	c.Version++
	_, a, err1 := encode(&c)
	_, b, err2 := encode(stored)
	return err1 == nil && err2 == nil && a == b
}

// AcquireLocks takes every key for p.Holder or none; see task.Store.
// Acquiring again renews, so a forwarded acquire whose outcome is unknown
// is made again here.
func (s *Store) AcquireLocks(ctx context.Context, p task.LockParams) error {
	rep, out := s.forward(ctx, &wireRequest{Method: methodAcquireLocks, Locks: &p})
	if err, done := answered(ctx, rep, out); done {
		return err
	}
	return s.acquireLocks(ctx, p)
}

// ReleaseLocks frees what p.Holder holds; see task.Store. Releasing again
// frees nothing more.
func (s *Store) ReleaseLocks(ctx context.Context, p task.LockParams) error {
	rep, out := s.forward(ctx, &wireRequest{Method: methodReleaseLocks, Locks: &p})
	if err, done := answered(ctx, rep, out); done {
		return err
	}
	return s.releaseLocks(ctx, p)
}

// DeleteFinished deletes old finished tasks; see task.Store. Of a
// forwarded delete whose outcome is unknown, the tasks still there are
// deleted here (and only those counted).
func (s *Store) DeleteFinished(ctx context.Context, p task.DeleteParams) (int, error) {
	rep, out := s.forward(ctx, &wireRequest{Method: methodDeleteFinished, Delete: &p})
	if err, done := answered(ctx, rep, out); done {
		if rep != nil {
			return rep.Deleted, err
		}
		return 0, err
	}
	return s.deleteFinished(ctx, p)
}

// RegisterWorker implements task.Registry; registering again as the same
// instance renews.
func (s *Store) RegisterWorker(ctx context.Context, p task.RegisterParams) error {
	rep, out := s.forward(ctx, &wireRequest{Method: methodRegister, Register: &p})
	if err, done := answered(ctx, rep, out); done {
		return err
	}
	return s.registerWorker(ctx, p)
}

// UnregisterWorker implements task.Registry.
func (s *Store) UnregisterWorker(ctx context.Context, id, instance string) error {
	rep, out := s.forward(ctx, &wireRequest{Method: methodUnregister, ID: id, Instance: instance})
	if err, done := answered(ctx, rep, out); done {
		return err
	}
	return s.unregisterWorker(ctx, id, instance)
}

// PutDocument writes d by compare-and-set; see task.DocumentStore.
func (s *Store) PutDocument(ctx context.Context, d task.Document) (task.Document, error) {
	rep, out := s.forward(ctx, &wireRequest{Method: methodPutDocument, Document: &d})
	switch out {
	case forwardAnswered:
		if rep.Err != nil {
			return task.Document{}, rep.Err.toError()
		}
		if rep.Document == nil {
			return task.Document{}, errors.New("sqlitestore: the writer's answer to put-document holds no document")
		}
		return *rep.Document, nil
	case forwardCancelled:
		return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, ctx.Err())
	case forwardUnknown:
		stored, err := s.GetDocument(ctx, d.Namespace, d.ID)
		switch {
		case errors.Is(err, task.ErrNotFound) && d.Version == 0, err == nil && stored.Version == d.Version:
			// Not applied.
		case err == nil && stored.Version == d.Version+1:
			if sameJSON(stored.Value, d.Value) {
				return stored, nil
			}
			return task.Document{}, fmt.Errorf("put document %s/%s version %d: %w", d.Namespace, d.ID, d.Version, task.ErrConflict)
		case err == nil && stored.Version > d.Version+1:
			return task.Document{}, fmt.Errorf("put document %s/%s: %w", d.Namespace, d.ID, errOutcomeUnknown)
		}
	}
	return s.putDocument(ctx, d)
}

func sameJSON(a, b json.RawMessage) bool {
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}

// DeleteDocument deletes the document; see task.DocumentStore. A
// forwarded delete whose outcome is unknown is made again here, and a
// document found gone then counts as deleted by it.
func (s *Store) DeleteDocument(ctx context.Context, namespace, id string, version int64) error {
	rep, out := s.forward(ctx, &wireRequest{Method: methodDeleteDocument, Namespace: namespace, ID: id, Version: version})
	if err, done := answered(ctx, rep, out); done {
		return err
	}
	err := s.deleteDocument(ctx, namespace, id, version)
	if out == forwardUnknown && errors.Is(err, task.ErrNotFound) {
		return nil
	}
	return err
}

// answered returns the outcome of a forwarded write that is safe to make
// again, with done false when the caller should make it here.
func answered(ctx context.Context, rep *wireReply, out forwardOutcome) (err error, done bool) {
	switch out {
	case forwardAnswered:
		return rep.Err.toError(), true
	case forwardCancelled:
		return ctx.Err(), true
	}
	return nil, false
}
