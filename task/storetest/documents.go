// documents.go checks versioned documents: compare-and-set writes, one
// winner among concurrent writers, hostile names and values refused, and
// document writes on the change stream only for the streams that ask.

package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/leasepool/leasepool/task"
)

func (s suite) documents(t *testing.T) {
	t.Run("CompareAndSet", s.documentsCAS)
	t.Run("ConcurrentWriters", s.documentsConcurrent)
	t.Run("Invalid", s.documentsInvalid)
	t.Run("ApartFromTasks", s.documentsApart)
	t.Run("Watch", s.documentsWatch)
	t.Run("WatchResume", s.documentsWatchResume)
	t.Run("WatchCrossHandle", s.documentsWatchCrossHandle)
}

// sameJSON reports whether a and b hold the same JSON value (a backend
// may store the value in its own encoding).
func sameJSON(t *testing.T, a, b json.RawMessage) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("stored value %q is not JSON: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("value %q is not JSON: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

func mustPutDocument(t *testing.T, st task.Store, d task.Document) task.Document {
	t.Helper()
	got, err := st.PutDocument(ctxFor(t), d)
	if err != nil {
		t.Fatalf("PutDocument %s/%s at version %d: %v", d.Namespace, d.ID, d.Version, err)
	}
	if got.Version != d.Version+1 || got.Namespace != d.Namespace || got.ID != d.ID || !sameJSON(t, got.Value, d.Value) {
		t.Fatalf("PutDocument returned %+v; want %s/%s version %d value %s", got, d.Namespace, d.ID, d.Version+1, d.Value)
	}
	return got
}

func (s suite) documentsCAS(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	if _, err := st.GetDocument(ctx, "ns", "a"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("GetDocument of a missing document: %v; want ErrNotFound", err)
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "ns", ID: "a", Version: 3, Value: json.RawMessage(`1`)}); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("PutDocument at version 3 of a missing document: %v; want ErrConflict", err)
	}
	v1 := mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "a", Value: json.RawMessage(`{"n":1}`)})
	if v1.UpdatedAt.IsZero() {
		t.Errorf("PutDocument left UpdatedAt zero")
	}
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "ns", ID: "a", Value: json.RawMessage(`{"n":9}`)}); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("second create of ns/a: %v; want ErrConflict", err)
	}
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "a", Version: 1, Value: json.RawMessage(`{"n":2}`)})
	if _, err := st.PutDocument(ctx, task.Document{Namespace: "ns", ID: "a", Version: 1, Value: json.RawMessage(`{"n":9}`)}); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("put at a stale version: %v; want ErrConflict", err)
	}
	got, err := st.GetDocument(ctx, "ns", "a")
	if err != nil || got.Version != 2 || !sameJSON(t, got.Value, json.RawMessage(`{"n":2}`)) {
		t.Fatalf("GetDocument after two writes: %+v, %v; want version 2 {\"n\":2}", got, err)
	}
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "b", Value: json.RawMessage(`"b"`)})
	mustPutDocument(t, st, task.Document{Namespace: "ns2", ID: "a", Value: json.RawMessage(`null`)})
	docs, err := st.Documents(ctx, "ns")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range docs {
		ids = append(ids, fmt.Sprintf("%s/%s@%d", d.Namespace, d.ID, d.Version))
	}
	if want := []string{"ns/a@2", "ns/b@1"}; !reflect.DeepEqual(ids, want) {
		t.Fatalf("Documents(ns) = %v; want %v", ids, want)
	}
	if docs, err := st.Documents(ctx, "empty"); err != nil || len(docs) != 0 {
		t.Fatalf("Documents of an empty namespace: %v, %v", docs, err)
	}
	if err := st.DeleteDocument(ctx, "ns", "a", 1); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("DeleteDocument at a stale version: %v; want ErrConflict", err)
	}
	if err := st.DeleteDocument(ctx, "ns", "a", 2); err != nil {
		t.Fatalf("DeleteDocument at the stored version: %v", err)
	}
	if _, err := st.GetDocument(ctx, "ns", "a"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("GetDocument after delete: %v; want ErrNotFound", err)
	}
	if err := st.DeleteDocument(ctx, "ns", "a", 0); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("DeleteDocument of a deleted document: %v; want ErrNotFound", err)
	}
	if err := st.DeleteDocument(ctx, "ns", "b", 0); err != nil {
		t.Fatalf("DeleteDocument at any version: %v", err)
	}
	// Deleted, a document is created again from version 0.
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "a", Value: json.RawMessage(`[1,2]`)})
	if d, _ := st.GetDocument(ctx, "ns2", "a"); !sameJSON(t, d.Value, json.RawMessage(`null`)) {
		t.Fatalf("ns2/a holds %s; want null (namespaces apart)", d.Value)
	}
}

// documentsConcurrent: of N writers putting the same version, exactly one
// wins and the stored value is its.
func (s suite) documentsConcurrent(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	const n = 8
	for version := int64(0); version < 3; version++ {
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				_, errs[i] = st.PutDocument(ctx, task.Document{Namespace: "ns", ID: "x", Version: version,
					Value: json.RawMessage(fmt.Sprintf(`{"writer":%d}`, i))})
			})
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("version %d: writers %d and %d both won", version, winner, i)
			case err == nil:
				winner = i
			case !errors.Is(err, task.ErrConflict):
				t.Fatalf("version %d: writer %d: %v; want nil or ErrConflict", version, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("version %d: no writer won", version)
		}
		got, err := st.GetDocument(ctx, "ns", "x")
		if err != nil || got.Version != version+1 || !sameJSON(t, got.Value, json.RawMessage(fmt.Sprintf(`{"writer":%d}`, winner))) {
			t.Fatalf("version %d: stored %+v, %v; want version %d with writer %d's value", version, got, err, version+1, winner)
		}
	}
}

func (s suite) documentsInvalid(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	for _, c := range []struct {
		d     task.Document
		field string
	}{
		{task.Document{ID: "a", Value: json.RawMessage(`1`)}, "document namespace"},
		{task.Document{Namespace: "ns", Value: json.RawMessage(`1`)}, "document id"},
		{task.Document{Namespace: "ns\x00", ID: "a", Value: json.RawMessage(`1`)}, "document namespace"},
		{task.Document{Namespace: "ns", ID: strings.Repeat("i", task.MaxNameLen+1), Value: json.RawMessage(`1`)}, "document id"},
		{task.Document{Namespace: "ns", ID: "a", Value: json.RawMessage(`{"x":`)}, "document value"},
		{task.Document{Namespace: "ns", ID: "a", Version: -1, Value: json.RawMessage(`1`)}, "document version"},
		{task.Document{Namespace: "ns", ID: "a", Value: json.RawMessage(`"` + strings.Repeat("v", task.MaxDocumentSize) + `"`)}, "document value"},
	} {
		_, err := st.PutDocument(ctx, c.d)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("PutDocument %.40q/%.40q: %v; want ErrInvalid naming %s", c.d.Namespace, c.d.ID, err, c.field)
		}
	}
	if docs, err := st.Documents(ctx, "ns"); err != nil || len(docs) != 0 {
		t.Fatalf("refused puts left %d documents (%v)", len(docs), err)
	}
	if _, err := st.GetDocument(ctx, "", "a"); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("GetDocument with no namespace: %v; want ErrInvalid", err)
	}
	if err := st.DeleteDocument(ctx, "ns", "", 0); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("DeleteDocument with no id: %v; want ErrInvalid", err)
	}
	if _, err := st.Documents(ctx, ""); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("Documents with no namespace: %v; want ErrInvalid", err)
	}
}

// documentsApart: a document named like a task is not that task, and
// documents never show in task reads.
func (s suite) documentsApart(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
	mustPutDocument(t, st, task.Document{Namespace: "k", ID: "a", Value: json.RawMessage(`{"key":"a","kind":"k","state":"succeeded"}`)})
	mustPutDocument(t, st, task.Document{Namespace: "k", ID: "b", Value: json.RawMessage(`{}`)})
	if got := mustGet(t, st, "a"); got.State != task.StatePending || got.Version != 1 {
		t.Fatalf("task a after a document k/a: state %s version %d", got.State, got.Version)
	}
	if _, err := st.Get(ctx, "b"); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("Get b (a document's id): %v; want ErrNotFound", err)
	}
	ts, err := st.List(ctx, task.ListQuery{Limit: 10})
	if err != nil || len(ts) != 1 {
		t.Fatalf("List: %d tasks, %v; want only task a", len(ts), err)
	}
	stats, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range stats.Counts {
		n += c.N
	}
	if n != 1 {
		t.Fatalf("Stats counts %d tasks; want 1", n)
	}
}

// nextDocument waits for the next event, which must be a document write.
func nextDocument(t *testing.T, cs task.ChangeStream) task.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	ev, err := cs.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if ev.Document == nil || ev.Key != "" || ev.Task != nil {
		t.Fatalf("event %+v; want a document write", ev)
	}
	return ev
}

func (s suite) documentsWatch(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	st := o.Store
	plain := watch(t, o, st, task.WatchParams{})
	docs := watch(t, o, st, task.WatchParams{Documents: []string{"ns"}})
	alone := watch(t, o, st, task.WatchParams{Documents: []string{"ns"}, NoTasks: true})
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "d", Value: json.RawMessage(`{"n":1}`)})
	mustPutDocument(t, st, task.Document{Namespace: "other", ID: "d", Value: json.RawMessage(`1`)})
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "d", Version: 1, Value: json.RawMessage(`{"n":2}`)})
	if err := st.DeleteDocument(ctxFor(t), "ns", "d", 2); err != nil {
		t.Fatal(err)
	}
	mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
	// A stream opened for tasks sees the task and nothing before it.
	if ev := next(t, plain, wait); ev.Key != "a" || ev.Document != nil {
		t.Fatalf("a stream opened without Documents saw %+v first; want task a", ev)
	}
	// One that asks for ns sees its three writes in order, and the task
	// (a backend keeping two streams may deliver it first).
	var got []string
	for len(got) < 4 {
		ev := nextEvent(t, docs)
		switch d := ev.Document; {
		case d == nil:
			got = append(got, "task "+ev.Key)
		case ev.DocumentDeleted:
			got = append(got, fmt.Sprintf("deleted %s/%s", d.Namespace, d.ID))
		default:
			if !sameJSON(t, d.Value, json.RawMessage(fmt.Sprintf(`{"n":%d}`, d.Version))) {
				t.Fatalf("document %s/%s version %d holds %s", d.Namespace, d.ID, d.Version, d.Value)
			}
			got = append(got, fmt.Sprintf("%s/%s@%d", d.Namespace, d.ID, d.Version))
		}
	}
	var docsOnly []string
	for _, g := range got {
		if !strings.HasPrefix(g, "task ") {
			docsOnly = append(docsOnly, g)
		}
	}
	if want := []string{"ns/d@1", "ns/d@2", "deleted ns/d"}; !reflect.DeepEqual(docsOnly, want) || !slices.Contains(got, "task a") {
		t.Fatalf("stream asking for ns saw %v; want %v in order, and task a", got, want)
	}
	// One that leaves tasks out sees the same writes of ns, then the next
	// one, not task a in between.
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "e", Value: json.RawMessage(`{"n":1}`)})
	got = nil
	for len(got) < 4 {
		ev := nextEvent(t, alone)
		switch d := ev.Document; {
		case d == nil:
			got = append(got, "task "+ev.Key)
		case ev.DocumentDeleted:
			got = append(got, fmt.Sprintf("deleted %s/%s", d.Namespace, d.ID))
		default:
			got = append(got, fmt.Sprintf("%s/%s@%d", d.Namespace, d.ID, d.Version))
		}
	}
	if want := []string{"ns/d@1", "ns/d@2", "deleted ns/d", "ns/e@1"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("stream asking for ns and no tasks saw %v; want %v", got, want)
	}
}

// nextEvent waits for the next event.
func nextEvent(t *testing.T, cs task.ChangeStream) task.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	ev, err := cs.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return ev
}

func (s suite) documentsWatchResume(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	st := o.Store
	p := task.WatchParams{Documents: []string{"ns"}}
	cs := watch(t, o, st, p)
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "d", Value: json.RawMessage(`1`)})
	mustInsert(t, st, newTask(t, "first", "k", st.Now(), task.Options{}))
	nextEvent(t, cs)
	nextEvent(t, cs)
	tok := cs.ResumeToken()
	if len(tok) == 0 {
		t.Fatal("no resume token after a task and a document event")
	}
	cs.Close()
	mustPutDocument(t, st, task.Document{Namespace: "ns", ID: "d", Version: 1, Value: json.RawMessage(`2`)})
	mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
	p.ResumeAfter = tok
	cs2 := watch(t, o, st, p)
	seen := map[string]bool{}
	for range 2 {
		ctx, cancel := context.WithTimeout(t.Context(), wait)
		ev, err := cs2.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Next after resume: %v", err)
		}
		switch {
		case ev.Document != nil && ev.Document.Version == 2:
			seen["document"] = true
		case ev.Key == "a":
			seen["task"] = true
		default:
			t.Fatalf("after resume: %+v; want ns/d version 2 and task a", ev)
		}
	}
	if !seen["document"] || !seen["task"] {
		t.Fatalf("after resume saw %v; want the document write and the task", seen)
	}
}

func (s suite) documentsWatchCrossHandle(t *testing.T) {
	t.Parallel()
	o := s.open(t)
	if o.Reopen == nil {
		t.Skip("Opened.Reopen is nil")
	}
	other := o.Reopen(t)
	cs := watch(t, o, other, task.WatchParams{Documents: []string{"ns"}})
	mustPutDocument(t, o.Store, task.Document{Namespace: "ns", ID: "d", Value: json.RawMessage(`{"x":true}`)})
	if ev := nextDocument(t, cs); ev.Document.ID != "d" || ev.Document.Version != 1 {
		t.Fatalf("cross-handle document event %+v", ev.Document)
	}
	if d, err := other.GetDocument(ctxFor(t), "ns", "d"); err != nil || d.Version != 1 {
		t.Fatalf("other handle reads %+v, %v", d, err)
	}
}
