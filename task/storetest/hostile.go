package storetest

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// hostile: input a caller must never get stored, refused by every backend
// alike, and the lists that must keep answering over what is stored.
func (s suite) hostile(t *testing.T) {
	t.Run("ReservedKeys", s.reservedKeys)
	t.Run("ReservedNamespaces", s.reservedNamespaces)
	t.Run("DeepPayloads", s.deepPayloads)
	t.Run("TimeBounds", s.timeBounds)
}

// nested is JSON nesting arrays n levels deep.
func nested(n int) json.RawMessage {
	return json.RawMessage(strings.Repeat("[", n) + strings.Repeat("]", n))
}

func requireInvalid(t *testing.T, what string, err error, want string) {
	t.Helper()
	if !errors.Is(err, task.ErrInvalid) || err.Error() != want {
		t.Fatalf("%s: %v; want %q", what, err, want)
	}
}

func requireAbsent(t *testing.T, st task.Store, key string) {
	t.Helper()
	if _, err := st.Get(ctxFor(t), key); !errors.Is(err, task.ErrNotFound) {
		t.Fatalf("Get %s after a refused write: %v; want ErrNotFound (nothing written)", key, err)
	}
}

// reservedKeys: keys under task.ReservedPrefix are leasepool's own: neither
// Publish nor Insert takes one from a caller; leasepool's writers, under
// task.WithInternalWrite, still can.
func (s suite) reservedKeys(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	const want = `invalid: key: "leasepool:control" is reserved (the leasepool: prefix is leasepool's own)`
	_, _, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: "leasepool:control", Kind: "k", Rerun: true})
	requireInvalid(t, "Publish leasepool:control", err, want)
	requireAbsent(t, st, "leasepool:control")

	doc := newTask(t, "leasepool:control", "leasepool.control", st.Now(), task.Options{})
	_, _, err = st.Insert(ctxFor(t), doc)
	requireInvalid(t, "Insert leasepool:control", err, want)
	requireAbsent(t, st, "leasepool:control")

	if _, inserted, err := st.Insert(task.WithInternalWrite(ctxFor(t)), doc); err != nil || !inserted {
		t.Fatalf("Insert leasepool:control under WithInternalWrite: inserted=%v err=%v", inserted, err)
	}
	_, res, err := task.Publish(task.WithInternalWrite(ctxFor(t)), st, task.PublishParams{Key: "leasepool:flow:x", Kind: "leasepool.flow"})
	if err != nil || res != task.Inserted {
		t.Fatalf("Publish leasepool:flow:x under WithInternalWrite: %v %v", res, err)
	}

	// A lock key named like a rate-limit slot is the task's own: slots
	// live in task.LockRate, where no task's lock key reaches them.
	stored, _, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: "r", Kind: "k", Options: task.Options{LockKeys: []string{"rate:kind:k#0"}}})
	if err != nil || len(stored.LockKeys) != 1 || stored.LockKeys[0] != "rate:kind:k#0" {
		t.Fatalf("Publish with lock key rate:kind:k#0: %+v, %v; want it stored", stored, err)
	}
}

// reservedNamespaces: document namespaces under task.DocumentPrefix are
// leasepool's own: PutDocument takes no write to one from a caller, neither
// a new document nor over one of leasepool's; leasepool's writers, under
// task.WithInternalWrite, still can. Names that only resemble the prefix
// are free.
func (s suite) reservedNamespaces(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	ctx := ctxFor(t)
	for _, ns := range []string{"leasepool.pause", "leasepool.schedule", "leasepool.anything"} {
		_, err := st.PutDocument(ctx, task.Document{Namespace: ns, ID: "kind:x", Value: json.RawMessage(`{"paused":true}`)})
		requireInvalid(t, "PutDocument "+ns+"/kind:x", err,
			`invalid: document namespace: "`+ns+`" is reserved (the leasepool. prefix is leasepool's own)`)
		if _, err := st.GetDocument(ctx, ns, "kind:x"); !errors.Is(err, task.ErrNotFound) {
			t.Fatalf("GetDocument %s/kind:x after a refused put: %v; want ErrNotFound (nothing written)", ns, err)
		}
	}

	internal := task.WithInternalWrite(ctx)
	own, err := st.PutDocument(internal, task.Document{Namespace: "leasepool.pause", ID: "kind:y", Value: json.RawMessage(`{"paused":true}`)})
	if err != nil || own.Version != 1 {
		t.Fatalf("PutDocument leasepool.pause/kind:y under WithInternalWrite: %+v, %v; want version 1", own, err)
	}
	_, err = st.PutDocument(ctx, task.Document{Namespace: "leasepool.pause", ID: "kind:y", Version: 1, Value: json.RawMessage(`{"paused":false}`)})
	requireInvalid(t, "PutDocument over leasepool.pause/kind:y", err,
		`invalid: document namespace: "leasepool.pause" is reserved (the leasepool. prefix is leasepool's own)`)
	if got, err := st.GetDocument(ctx, "leasepool.pause", "kind:y"); err != nil || got.Version != 1 || string(got.Value) != `{"paused":true}` {
		t.Fatalf("GetDocument leasepool.pause/kind:y after a refused put: %+v, %v; want version 1 unchanged", got, err)
	}
	if _, err := st.PutDocument(internal, task.Document{Namespace: "leasepool.pause", ID: "kind:y", Version: 1, Value: json.RawMessage(`null`)}); err != nil {
		t.Fatalf("PutDocument over leasepool.pause/kind:y under WithInternalWrite: %v", err)
	}

	for _, ns := range []string{"leasepool", "leasepoolx.pause", "LEASEPOOL.pause", "app.leasepool.pause", "leasepool:pause"} {
		if _, err := st.PutDocument(ctx, task.Document{Namespace: ns, ID: "a", Value: json.RawMessage(`1`)}); err != nil {
			t.Errorf("PutDocument %s/a: %v; want it stored (the namespace is free)", ns, err)
		}
	}
}

// deepPayloads: a payload nested past task.MaxJSONDepth is refused at
// publish, past task.MaxStoredDepth at every write; what is stored at the
// bounds reads back equal and leaves every filtered list answering (SQLite's
// JSON functions stop at 1,000 levels, MongoDB's documents at 100).
func (s suite) deepPayloads(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	ctx := ctxFor(t)
	_, _, err := task.Publish(ctx, st, task.PublishParams{Key: "deep", Kind: "k", Payload: nested(1001)})
	requireInvalid(t, "Publish a payload 1,001 deep", err, "invalid: payload: nested deeper than 64 levels")
	_, _, err = task.Publish(ctx, st, task.PublishParams{Key: "deep", Kind: "k", Payload: nested(task.MaxJSONDepth + 1)})
	requireInvalid(t, "Publish a payload 65 deep", err, "invalid: payload: nested deeper than 64 levels")
	requireAbsent(t, st, "deep")

	tk := newTask(t, "deep", "k", st.Now(), task.Options{})
	tk.Payload = nested(1001)
	_, _, err = st.Insert(ctx, tk)
	requireInvalid(t, "Insert a payload 1,001 deep", err, "insert deep: invalid: payload: nested deeper than 80 levels")
	requireAbsent(t, st, "deep")

	at64, _, err := task.Publish(ctx, st, task.PublishParams{Key: "at64", Kind: "k", Payload: json.RawMessage(`{"t":"<a>&é",` +
		`"n":` + string(nested(task.MaxJSONDepth-1)) + `}`)})
	if err != nil {
		t.Fatalf("Publish a payload %d deep: %v", task.MaxJSONDepth, err)
	}
	requireSame(t, "Get at64", mustGet(t, st, "at64"), at64)
	internal := newTask(t, "leasepool:flow:deep", "leasepool.flow", st.Now(), task.Options{})
	internal.Payload = nested(task.MaxStoredDepth)
	mustInsert(t, st, internal)

	// An Update may not go deeper either.
	next := at64.Clone()
	next.Payload = nested(task.MaxStoredDepth + 1)
	if err := st.Update(ctx, next); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("Update to a payload %d deep: %v; want ErrInvalid", task.MaxStoredDepth+1, err)
	}

	long := st.Now().Add(-time.Hour)
	for _, q := range []task.ListQuery{
		{CreatedAfter: long}, {UpdatedBefore: st.Now().Add(time.Hour)}, {Text: "<a>&é"}, {Text: "é"}, {Text: "&"},
		{Reserved: true, CreatedAfter: long, Text: "["},
	} {
		got, err := st.List(ctx, q)
		if err != nil {
			t.Fatalf("List %+v over deep payloads: %v", q, err)
		}
		if !q.Reserved && !q.CreatedAfter.IsZero() && len(got) != 1 {
			t.Errorf("List %+v: %d tasks; want at64 only", q, len(got))
		}
	}
	if _, err := st.Stats(ctx); err != nil {
		t.Fatalf("Stats over deep payloads: %v", err)
	}
}

// timeBounds: run_at outside task.MinTime..MaxTime is refused naming the
// field; at the far bound the stats still read sense.
func (s suite) timeBounds(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	ctx := ctxFor(t)
	for _, at := range []time.Time{time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1816, 3, 4, 0, 0, 0, 0, time.UTC)} {
		_, _, err := task.Publish(ctx, st, task.PublishParams{Key: "far", Kind: "k", Options: task.Options{RunAt: at}})
		requireInvalid(t, "Publish run_at "+at.Format(time.DateOnly), err,
			"invalid: run_at: "+at.Format(time.RFC3339)+" is outside 2000-01-01 .. 2200-01-01")
	}
	requireAbsent(t, st, "far")

	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "far", Kind: "k", Options: task.Options{RunAt: task.MaxTime}}); err != nil {
		t.Fatalf("Publish run_at %s: %v", task.MaxTime, err)
	}
	stats, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !stats.OldestReadyAt.IsZero() {
		t.Fatalf("Stats with one task due in %d: oldest_ready_at %s; want none ready", task.MaxTime.Year(), stats.OldestReadyAt)
	}
	before := st.Now()
	if _, _, err := task.Publish(ctx, st, task.PublishParams{Key: "now", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	if stats, err = st.Stats(ctx); err != nil {
		t.Fatal(err)
	}
	if at := stats.OldestReadyAt; at.Before(before.Add(-time.Second)) || at.After(st.Now()) {
		t.Fatalf("Stats: oldest_ready_at %s; want the ready task's, about %s", at, before)
	}
}
