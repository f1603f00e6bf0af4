// Package storetest is the one conformance suite that every task.Store
// backend passes: insert and get, compare-and-set updates, publish through
// the store, candidate and list queries with paging, change streams within
// and across handles, and resource locks. A backend's test calls Run with a
// constructor that opens a fresh, empty store for each subtest.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Opened is one fresh store handed to a subtest.
type Opened struct {
	// Store is empty and used by this subtest only; the constructor arranges
	// for it to be closed (t.Cleanup).
	Store task.Store
	// Reopen opens a second, independent handle on the same underlying
	// database, as another process would see it. Nil skips the cross-handle
	// tests.
	Reopen func(t *testing.T) task.Store
	// NoWatch, when not empty, says why this backend cannot push changes:
	// the watch tests then accept task.ErrWatchUnsupported and skip.
	NoWatch string
}

// Run runs the whole suite. open is called once per subtest, from that
// subtest, and must return a fresh, empty store.
func Run(t *testing.T, open func(t *testing.T) Opened) {
	t.Helper()
	s := suite{open: open}
	t.Run("Insert", s.insert)
	t.Run("Get", s.get)
	t.Run("Update", s.update)
	t.Run("Publish", s.publish)
	t.Run("PublishMany", s.publishMany)
	t.Run("Debounce", s.debounce)
	t.Run("Candidates", s.candidates)
	t.Run("List", s.list)
	t.Run("ListFilters", s.listFilters)
	t.Run("ListPagingConcurrent", s.listPagingConcurrent)
	t.Run("Stats", s.stats)
	t.Run("Watch", s.watch)
	t.Run("Locks", s.locks)
	t.Run("Documents", s.documents)
	t.Run("DocumentTerms", s.terms)
	t.Run("DeleteFinished", s.deleteFinished)
	t.Run("LockInstances", s.lockInstances)
	t.Run("LockLines", s.lockLines)
	t.Run("LockNamespaces", s.lockNamespaces)
	t.Run("Groups", s.groups)
	t.Run("Registry", s.registry)
	t.Run("Hostile", s.hostile)
	t.Run("Now", func(t *testing.T) {
		t.Parallel()
		st := open(t).Store
		if d := time.Since(st.Now()).Abs(); d > 5*time.Second {
			t.Errorf("Now() is %s away from time.Now()", d)
		}
	})
}

type suite struct {
	open func(t *testing.T) Opened
}

// store opens a fresh store for one parallel subtest.
func (s suite) store(t *testing.T) task.Store {
	t.Helper()
	t.Parallel()
	return s.open(t).Store
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newTask builds a valid document whose RunAt (and so NextClaimAt) is at.
func newTask(t *testing.T, key, kind string, at time.Time, opt task.Options) *task.Task {
	t.Helper()
	opt.RunAt = at
	// A reserved key (leasepool's own documents) is refused by NewTask:
	// build the document under another key, as its writer's Publish would.
	tk, err := task.NewTask(task.PublishParams{Key: strings.TrimPrefix(key, task.ReservedPrefix), Kind: kind, Options: opt}, at)
	if err != nil {
		t.Fatalf("NewTask %s: %v", key, err)
	}
	tk.Key = key
	return tk
}

func mustInsert(t *testing.T, st task.Store, tk *task.Task) *task.Task {
	t.Helper()
	ctx := ctxFor(t)
	if task.Reserved(tk.Key) {
		ctx = task.WithInternalWrite(ctx)
	}
	got, inserted, err := st.Insert(ctx, tk)
	if err != nil || !inserted {
		t.Fatalf("Insert %s: inserted=%v err=%v", tk.Key, inserted, err)
	}
	return got
}

func mustGet(t *testing.T, st task.Store, key string) *task.Task {
	t.Helper()
	got, err := st.Get(ctxFor(t), key)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	return got
}

func mustModify(t *testing.T, st task.Store, key string, fn func(tk *task.Task) error) *task.Task {
	t.Helper()
	got, err := task.Modify(ctxFor(t), st, key, fn)
	if err != nil {
		t.Fatalf("Modify %s: %v", key, err)
	}
	return got
}

// norm makes two documents comparable across backends: times in UTC at
// millisecond precision, compact payload, empty slices as nil.
func norm(tk *task.Task) *task.Task {
	c := tk.Clone()
	ms := func(x *time.Time) { *x = x.Truncate(time.Millisecond).UTC() }
	ms(&c.RunAt)
	ms(&c.NextClaimAt)
	ms(&c.CreatedAt)
	ms(&c.UpdatedAt)
	for _, ws := range [][]task.Attempt{c.Attempts, c.History} {
		normWorkers(ws, ms)
	}
	for i := range c.Changes {
		ms(&c.Changes[i].Until)
	}
	if len(c.Payload) > 0 {
		var b bytes.Buffer
		if err := json.Compact(&b, c.Payload); err == nil {
			c.Payload = b.Bytes()
		}
	} else {
		c.Payload = nil
	}
	if len(c.SpecificWorkerIDs) == 0 {
		c.SpecificWorkerIDs = nil
	}
	if len(c.LockKeys) == 0 {
		c.LockKeys = nil
	}
	if len(c.Attempts) == 0 {
		c.Attempts = nil
	}
	if len(c.History) == 0 {
		c.History = nil
	}
	return c
}

// normWorkers is norm for worker entries.
func normWorkers(ws []task.Attempt, ms func(*time.Time)) {
	for i := range ws {
		ms(&ws[i].LeaseUntil)
		ms(&ws[i].StartedAt)
		ms(&ws[i].EndedAt)
		for j := range ws[i].Log {
			ms(&ws[i].Log[j].At)
		}
		if len(ws[i].Result) > 0 {
			var b bytes.Buffer
			if err := json.Compact(&b, ws[i].Result); err == nil {
				ws[i].Result = b.Bytes()
			}
		}
	}
}

func requireSame(t *testing.T, what string, got, want *task.Task) {
	t.Helper()
	g, w := norm(got), norm(want)
	if !reflect.DeepEqual(g, w) {
		gj, _ := json.MarshalIndent(g, "", " ")
		wj, _ := json.MarshalIndent(w, "", " ")
		t.Fatalf("%s: stored task differs\n got: %s\nwant: %s", what, gj, wj)
	}
}

func keys(ts []*task.Task) []string {
	out := make([]string, len(ts))
	for i, tk := range ts {
		out[i] = tk.Key
	}
	return out
}

// bigPayload is valid JSON one byte over task.MaxPayloadSize.
func bigPayload() json.RawMessage { return payloadOf(task.MaxPayloadSize + 1) }

// payloadOf is a JSON object of exactly n bytes (n ≥ 8).
func payloadOf(n int) json.RawMessage {
	b := append(make([]byte, 0, n), `{"s":"`...)
	for len(b) < n-2 {
		b = append(b, 'x')
	}
	return append(b, '"', '}')
}
