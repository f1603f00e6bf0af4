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
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
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
	t.Run("Candidates", s.candidates)
	t.Run("List", s.list)
	t.Run("Watch", s.watch)
	t.Run("Locks", s.locks)
	t.Run("Records", s.records)
	t.Run("DeleteRecord", s.deleteRecord)
	t.Run("DeleteFinished", s.deleteFinished)
	t.Run("LockInstances", s.lockInstances)
	t.Run("Registry", s.registry)
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
	tk, err := task.NewTask(task.PublishParams{Key: key, Kind: kind, Options: opt}, at)
	if err != nil {
		t.Fatalf("NewTask %s: %v", key, err)
	}
	return tk
}

func mustInsert(t *testing.T, st task.Store, tk *task.Task) *task.Task {
	t.Helper()
	got, inserted, err := st.Insert(ctxFor(t), tk)
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
	for i := range c.Workers {
		ms(&c.Workers[i].LeaseUntil)
		ms(&c.Workers[i].StartedAt)
		ms(&c.Workers[i].EndedAt)
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
	if len(c.Workers) == 0 {
		c.Workers = nil
	}
	return c
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

func (s suite) insert(t *testing.T) {
	t.Run("New", func(t *testing.T) {
		st := s.store(t)
		tk := newTask(t, "a", "k", st.Now(), task.Options{})
		got, inserted, err := st.Insert(ctxFor(t), tk)
		if err != nil || !inserted {
			t.Fatalf("Insert: inserted=%v err=%v", inserted, err)
		}
		if got.ID == "" || got.Seq <= 0 || got.Version != 1 {
			t.Fatalf("Insert returned ID=%q Seq=%d Version=%d; want an ID, Seq>0, Version 1", got.ID, got.Seq, got.Version)
		}
		if tk.ID != got.ID || tk.Seq != got.Seq || tk.Version != 1 {
			t.Errorf("Insert did not update its argument in place: ID=%q Seq=%d Version=%d", tk.ID, tk.Seq, tk.Version)
		}
		requireSame(t, "Get after Insert", mustGet(t, st, "a"), got)
	})
	t.Run("Existing", func(t *testing.T) {
		st := s.store(t)
		first := mustInsert(t, st, newTask(t, "a", "k1", st.Now(), task.Options{Priority: 1}))
		again := newTask(t, "a", "k2", st.Now(), task.Options{Priority: 9})
		got, inserted, err := st.Insert(ctxFor(t), again)
		if err != nil || inserted {
			t.Fatalf("second Insert: inserted=%v err=%v; want false, nil", inserted, err)
		}
		requireSame(t, "second Insert result", got, first)
		requireSame(t, "Get after second Insert", mustGet(t, st, "a"), first)
	})
	t.Run("PayloadTooBig", func(t *testing.T) {
		// The backend refuses it itself, whatever built the document.
		st := s.store(t)
		tk := newTask(t, "big", "k", st.Now(), task.Options{})
		tk.Payload = bigPayload()
		if _, _, err := st.Insert(ctxFor(t), tk); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "payload") {
			t.Fatalf("Insert of a %d-byte payload: %v; want ErrInvalid naming payload", len(tk.Payload), err)
		}
		if _, err := st.Get(ctxFor(t), "big"); !errors.Is(err, task.ErrNotFound) {
			t.Fatalf("Get after refused Insert: %v; want ErrNotFound", err)
		}
		mustInsert(t, st, newTask(t, "small", "k", st.Now(), task.Options{}))
		cur := mustGet(t, st, "small")
		next := cur.Clone()
		next.Payload = bigPayload()
		if err := st.Update(ctxFor(t), next); !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "payload") {
			t.Fatalf("Update to a %d-byte payload: %v; want ErrInvalid naming payload", len(next.Payload), err)
		}
		requireSame(t, "Get after refused Update", mustGet(t, st, "small"), cur)
		// Exactly at the limit is accepted.
		at := newTask(t, "at-limit", "k", st.Now(), task.Options{})
		at.Payload = payloadOf(task.MaxPayloadSize)
		mustInsert(t, st, at)
	})
	t.Run("Concurrent", func(t *testing.T) {
		st := s.store(t)
		const n = 20
		var wg sync.WaitGroup
		ids := make([]string, n)
		ins := make([]bool, n)
		errs := make([]error, n)
		now := st.Now()
		for i := range n {
			wg.Go(func() {
				tk, err := task.NewTask(task.PublishParams{Key: "same", Kind: "k", Options: task.Options{Priority: i}}, now)
				if err != nil {
					errs[i] = err
					return
				}
				got, inserted, err := st.Insert(context.Background(), tk)
				if err != nil {
					errs[i] = err
					return
				}
				ids[i], ins[i] = got.ID, inserted
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("concurrent Insert: %v", err)
		}
		if c := countTrue(ins); c != 1 {
			t.Errorf("%d of %d concurrent inserts reported inserted=true; want 1", c, n)
		}
		for i, id := range ids {
			if id != ids[0] {
				t.Errorf("insert %d saw ID %q, insert 0 saw %q", i, id, ids[0])
			}
		}
	})
	t.Run("SeqGrows", func(t *testing.T) {
		st := s.store(t)
		var last int64
		for i := range 5 {
			got := mustInsert(t, st, newTask(t, fmt.Sprint("k", i), "k", st.Now(), task.Options{}))
			if got.Seq <= last {
				t.Fatalf("insert %d got Seq %d, not after %d", i, got.Seq, last)
			}
			last = got.Seq
		}
	})
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func (s suite) get(t *testing.T) {
	t.Run("NotFound", func(t *testing.T) {
		st := s.store(t)
		if _, err := st.Get(ctxFor(t), "missing"); !errors.Is(err, task.ErrNotFound) {
			t.Fatalf("Get missing: %v; want ErrNotFound", err)
		}
	})
	t.Run("RoundTrip", func(t *testing.T) {
		st := s.store(t)
		now := st.Now()
		tk := &task.Task{
			Key:                  "round/trip:é",
			Kind:                 "kind.x",
			Payload:              json.RawMessage(`{"a": [1, 2, {"b": "c"}], "n": 1.5, "s": "é\u0000", "nil": null}`),
			Priority:             -7,
			RunAt:                now.Add(time.Minute + 123456789),
			SpecificWorkerIDs:    []string{"w1", "w2"},
			ConcurrentWorkerCnt:  3,
			SuccessWorkerCnt:     2,
			MaxUnexpectedRetries: 4,
			PingInterval:         task.Duration(1500 * time.Millisecond),
			WorkerTimeout:        task.Duration(7 * time.Second),
			LockKeys:             []string{"device:1", "device:2"},
			Workers: []task.Worker{
				{WorkerID: "w1", State: task.WorkerRunning, Attempt: 3, LeaseUntil: now.Add(5 * time.Second), StartedAt: now.Add(-time.Second)},
				{WorkerID: "w2", State: task.WorkerFail, Attempt: 2, LeaseUntil: now.Add(-time.Hour), StartedAt: now.Add(-2 * time.Hour), EndedAt: now.Add(-90 * time.Minute), Error: "boom: \"quoted\""},
				{WorkerID: "w1", State: task.WorkerExpired, Attempt: 1, LeaseUntil: now.Add(-3 * time.Hour), StartedAt: now.Add(-4 * time.Hour), EndedAt: now.Add(-3 * time.Hour), Error: "lease expired"},
			},
			Attempts:    3,
			State:       task.StateRunning,
			NextClaimAt: now.Add(time.Minute + 123456789),
			Version:     1,
			CreatedAt:   now.Add(-4 * time.Hour),
			UpdatedAt:   now,
		}
		want := tk.Clone()
		got := mustInsert(t, st, tk)
		want.ID, want.Seq = got.ID, got.Seq
		requireSame(t, "Get after Insert", mustGet(t, st, tk.Key), want)

		// Every field changed by an update survives too.
		next := mustGet(t, st, tk.Key)
		next.Payload = json.RawMessage(`[true,false]`)
		next.Kind = "kind.y"
		next.Priority = 42
		next.SpecificWorkerIDs = nil
		next.LockKeys = []string{"device:3"}
		next.Workers = append(next.Workers, task.Worker{WorkerID: "w3", State: task.WorkerSuccess, Attempt: 4, LeaseUntil: now, StartedAt: now, EndedAt: now.Add(time.Millisecond)})
		next.Attempts = 4
		next.Cancelled = true
		next.State = task.StateCancelled
		next.NextClaimAt = time.Time{}
		next.PingInterval = task.Duration(time.Second)
		next.WorkerTimeout = task.Duration(time.Hour)
		next.UpdatedAt = now.Add(time.Second)
		want = next.Clone()
		if err := st.Update(ctxFor(t), next); err != nil {
			t.Fatalf("Update: %v", err)
		}
		want.Version = 2
		requireSame(t, "Get after Update", mustGet(t, st, tk.Key), want)
	})
}

func (s suite) update(t *testing.T) {
	t.Run("CompareAndSet", func(t *testing.T) {
		st := s.store(t)
		mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
		a := mustGet(t, st, "a")
		b := a.Clone()
		a.Priority = 1
		if err := st.Update(ctxFor(t), a); err != nil {
			t.Fatalf("first Update: %v", err)
		}
		if a.Version != 2 {
			t.Errorf("after Update t.Version = %d; want 2", a.Version)
		}
		b.Priority = 2
		if err := st.Update(ctxFor(t), b); !errors.Is(err, task.ErrConflict) {
			t.Fatalf("second Update of the same version: %v; want ErrConflict", err)
		}
		if b.Version != 1 {
			t.Errorf("a failed Update changed t.Version to %d", b.Version)
		}
		got := mustGet(t, st, "a")
		if got.Priority != 1 || got.Version != 2 {
			t.Errorf("stored Priority=%d Version=%d; want 1, 2", got.Priority, got.Version)
		}
	})
	t.Run("Missing", func(t *testing.T) {
		st := s.store(t)
		tk := newTask(t, "ghost", "k", st.Now(), task.Options{})
		err := st.Update(ctxFor(t), tk)
		if !errors.Is(err, task.ErrNotFound) && !errors.Is(err, task.ErrConflict) {
			t.Fatalf("Update of a missing task: %v; want ErrNotFound or ErrConflict", err)
		}
		if _, err := st.Get(ctxFor(t), "ghost"); !errors.Is(err, task.ErrNotFound) {
			t.Fatalf("Get after Update of a missing task: %v; want ErrNotFound", err)
		}
	})
	t.Run("NoLostUpdate", func(t *testing.T) {
		st := s.store(t)
		mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
		var wg sync.WaitGroup
		errs := make([]error, 10)
		for i := range 10 {
			wg.Go(func() {
				for range 10 {
					if _, err := task.Modify(context.Background(), st, "a", func(tk *task.Task) error {
						tk.Priority++
						return nil
					}); err != nil {
						errs[i] = err
						return
					}
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("Modify: %v", err)
		}
		got := mustGet(t, st, "a")
		if got.Priority != 100 || got.Version != 101 {
			t.Errorf("after 100 increments Priority=%d Version=%d; want 100, 101", got.Priority, got.Version)
		}
	})
}

// addWorker makes tk running with a live worker leased until lease.
func addWorker(id string, lease, now time.Time) func(tk *task.Task) error {
	return func(tk *task.Task) error {
		tk.Attempts++
		tk.Workers = append(tk.Workers, task.Worker{WorkerID: id, State: task.WorkerRunning, Attempt: tk.Attempts, LeaseUntil: lease, StartedAt: now})
		tk.Recompute(now)
		return nil
	}
}

func (s suite) publish(t *testing.T) {
	pub := func(t *testing.T, st task.Store, key string, rerun bool) (*task.Task, task.PublishResult) {
		t.Helper()
		got, res, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: key, Kind: "k", Payload: json.RawMessage(`{"x":1}`), Rerun: rerun})
		if err != nil {
			t.Fatalf("Publish %s rerun=%v: %v", key, rerun, err)
		}
		return got, res
	}
	t.Run("RerunFinished", func(t *testing.T) {
		st := s.store(t)
		if _, res := pub(t, st, "a", false); res != task.Inserted {
			t.Fatalf("first Publish: %s; want inserted", res)
		}
		now := st.Now()
		mustModify(t, st, "a", addWorker("w1", now.Add(time.Minute), now))
		done := mustModify(t, st, "a", func(tk *task.Task) error {
			return tk.Succeed(task.Holder{WorkerID: "w1", Attempt: 1}, now)
		})
		if done.State != task.StateSucceeded {
			t.Fatalf("state after finish = %s", done.State)
		}
		if got, res := pub(t, st, "a", false); res != task.Existing || got.State != task.StateSucceeded {
			t.Fatalf("Publish without rerun of a finished task: %s, state %s; want existing, succeeded", res, got.State)
		}
		got, res := pub(t, st, "a", true)
		if res != task.Rerun {
			t.Fatalf("Publish rerun of a finished task: %s; want rerun", res)
		}
		stored := mustGet(t, st, "a")
		if stored.State != task.StatePending || len(stored.Workers) != 0 || stored.Version != done.Version+1 || got.Version != stored.Version {
			t.Fatalf("after rerun: state %s, %d workers, version %d (returned %d); want pending, 0, %d",
				stored.State, len(stored.Workers), stored.Version, got.Version, done.Version+1)
		}
		if stored.Attempts != 1 {
			t.Errorf("rerun lost the attempt counter: Attempts=%d", stored.Attempts)
		}

		// A cancelled task reruns too.
		mustModify(t, st, "a", func(tk *task.Task) error { return tk.Cancel(st.Now()) })
		if _, res := pub(t, st, "a", true); res != task.Rerun {
			t.Fatalf("Publish rerun of a cancelled task: %s; want rerun", res)
		}
		if got := mustGet(t, st, "a"); got.Cancelled || got.State != task.StatePending {
			t.Fatalf("after rerun of cancelled: cancelled=%v state=%s", got.Cancelled, got.State)
		}
	})
	t.Run("RerunRunning", func(t *testing.T) {
		st := s.store(t)
		pub(t, st, "a", false)
		now := st.Now()
		running := mustModify(t, st, "a", addWorker("w1", now.Add(time.Minute), now))
		got, res := pub(t, st, "a", true)
		if res != task.Existing {
			t.Fatalf("Publish rerun of a running task: %s; want existing", res)
		}
		requireSame(t, "returned task", got, running)
		requireSame(t, "stored task", mustGet(t, st, "a"), running)
	})
	t.Run("Invalid", func(t *testing.T) {
		st := s.store(t)
		for name, p := range map[string]task.PublishParams{
			"payload":        {Key: "bad1", Kind: "k", Payload: json.RawMessage(`{`)},
			"kind":           {Key: "bad2"},
			"worker_timeout": {Key: "bad3", Kind: "k", Options: task.Options{PingInterval: time.Second, WorkerTimeout: time.Second}},
			"payload size":   {Key: "bad4", Kind: "k", Payload: bigPayload()},
			"key UTF-8":      {Key: "bad5\xff", Kind: "k"},
			"short lease":    {Key: "bad6", Kind: "k", Options: task.Options{PingInterval: time.Nanosecond, WorkerTimeout: 2 * time.Nanosecond}},
		} {
			if _, _, err := task.Publish(ctxFor(t), st, p); !errors.Is(err, task.ErrInvalid) {
				t.Errorf("%s: Publish: %v; want ErrInvalid", name, err)
			}
			if _, err := st.Get(ctxFor(t), p.Key); !errors.Is(err, task.ErrNotFound) {
				t.Errorf("%s: Get after invalid Publish: %v; want ErrNotFound", name, err)
			}
		}
	})
}

// candidateFixture fills st with tasks around now and returns the keys
// expected as ready and as upcoming (unordered).
func candidateFixture(t *testing.T, st task.Store, now time.Time) (ready, upcoming map[string]*task.Task) {
	t.Helper()
	past := now.Add(-time.Hour)
	ins := func(key, kind string, at time.Time, opt task.Options) {
		mustInsert(t, st, newTask(t, key, kind, at, opt))
	}
	// Ready, interleaving priorities with insert order.
	for i, p := range []int{0, 5, 0, 10, 5, 0, -3, 10, 5, 0} {
		kind := "k1"
		if i%3 == 0 {
			kind = "k2"
		}
		ins(fmt.Sprintf("r%02d", i), kind, past.Add(time.Duration(i)*time.Second), task.Options{Priority: p})
	}
	ins("pin-w1", "k1", past, task.Options{Priority: 5, SpecificWorkerIDs: []string{"w1"}})
	ins("pin-w2w3", "k1", past, task.Options{Priority: 5, SpecificWorkerIDs: []string{"w2", "w3"}})
	// Running with a free slot: ready.
	ins("run-free", "k1", past, task.Options{Priority: 5, ConcurrentWorkerCnt: 2})
	mustModify(t, st, "run-free", addWorker("wx", now.Add(30*time.Second), now))
	// Finished: never a candidate.
	ins("done", "k1", past, task.Options{Priority: 100})
	mustModify(t, st, "done", func(tk *task.Task) error { return tk.Cancel(now) })
	ins("done-later", "k1", now.Add(time.Minute), task.Options{})
	mustModify(t, st, "done-later", func(tk *task.Task) error { return tk.Cancel(now) })
	// Upcoming, with ties on next_claim_at.
	for i, d := range []time.Duration{3, 1, 2, 1, 5, 2} {
		ins(fmt.Sprintf("u%02d", i), []string{"k1", "k2"}[i%2], now.Add(d*time.Minute), task.Options{Priority: i})
	}
	// Running and full: upcoming at its lease end.
	ins("run-full", "k2", past, task.Options{})
	mustModify(t, st, "run-full", addWorker("wx", now.Add(30*time.Second), now))
	// Exactly at now: ready.
	ins("at-now", "k1", now, task.Options{Priority: 1})

	ready, upcoming = map[string]*task.Task{}, map[string]*task.Task{}
	all, err := st.List(ctxFor(t), task.ListQuery{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	for _, tk := range all {
		switch {
		case tk.State.Finished():
		case !tk.NextClaimAt.After(now):
			ready[tk.Key] = tk
		default:
			upcoming[tk.Key] = tk
		}
	}
	return ready, upcoming
}

func (s suite) candidates(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	now := st.Now().Truncate(time.Millisecond)
	ready, upcoming := candidateFixture(t, st, now)
	if len(ready) != 14 || len(upcoming) != 7 {
		t.Fatalf("fixture: %d ready, %d upcoming; want 14, 7", len(ready), len(upcoming))
	}
	// expect returns the keys of want that pass keep, in q's order.
	expect := func(q task.CandidateQuery, want map[string]*task.Task, keep func(*task.Task) bool) []string {
		var ts []*task.Task
		for _, tk := range want {
			if keep == nil || keep(tk) {
				ts = append(ts, tk)
			}
		}
		slices.SortFunc(ts, func(a, b *task.Task) int {
			if q.Less(a, b) {
				return -1
			}
			if q.Less(b, a) {
				return 1
			}
			return 0
		})
		return keys(ts)
	}
	query := func(t *testing.T, q task.CandidateQuery) []*task.Task {
		t.Helper()
		got, err := st.Candidates(ctxFor(t), q)
		if err != nil {
			t.Fatalf("Candidates(%+v): %v", q, err)
		}
		for _, tk := range got {
			if tk.State.Finished() {
				t.Errorf("Candidates returned %s in state %s", tk.Key, tk.State)
			}
		}
		return got
	}
	for _, mode := range []bool{true, false} {
		want := upcoming
		if mode {
			want = ready
		}
		t.Run(fmt.Sprintf("Ready=%v", mode), func(t *testing.T) {
			t.Run("All", func(t *testing.T) {
				q := task.CandidateQuery{Now: now, Ready: mode, Limit: 100}
				if got, w := keys(query(t, q)), expect(q, want, nil); !slices.Equal(got, w) {
					t.Fatalf("got  %v\nwant %v", got, w)
				}
			})
			t.Run("Limit", func(t *testing.T) {
				q := task.CandidateQuery{Now: now, Ready: mode, Limit: 3}
				if got, w := keys(query(t, q)), expect(q, want, nil)[:3]; !slices.Equal(got, w) {
					t.Fatalf("got  %v\nwant %v", got, w)
				}
			})
			t.Run("Paging", func(t *testing.T) {
				for _, limit := range []int{1, 2, 3, 5} {
					q := task.CandidateQuery{Now: now, Ready: mode, Limit: limit}
					var got []string
					for pages := 0; ; pages++ {
						if pages > 50 {
							t.Fatalf("limit %d: paging does not end: %v", limit, got)
						}
						page := query(t, q)
						if len(page) > limit {
							t.Fatalf("limit %d: page of %d", limit, len(page))
						}
						got = append(got, keys(page)...)
						if len(page) < limit {
							break
						}
						q.After = page[len(page)-1]
					}
					if w := expect(q, want, nil); !slices.Equal(got, w) {
						t.Fatalf("limit %d: pages gave\n %v\nwant\n %v", limit, got, w)
					}
				}
			})
			t.Run("Kinds", func(t *testing.T) {
				q := task.CandidateQuery{Now: now, Ready: mode, Limit: 100, Kinds: []string{"k2"}}
				w := expect(q, want, func(tk *task.Task) bool { return tk.Kind == "k2" })
				if got := keys(query(t, q)); !slices.Equal(got, w) || len(w) == 0 {
					t.Fatalf("got  %v\nwant %v", got, w)
				}
				q.Kinds = []string{"k1", "k2"}
				if got, w := keys(query(t, q)), expect(q, want, nil); !slices.Equal(got, w) {
					t.Fatalf("both kinds: got  %v\nwant %v", got, w)
				}
			})
			t.Run("WorkerID", func(t *testing.T) {
				for _, w := range []string{"w1", "w2", "w9"} {
					q := task.CandidateQuery{Now: now, Ready: mode, Limit: 100, WorkerID: w}
					exp := expect(q, want, func(tk *task.Task) bool { return tk.Allows(w) })
					if got := keys(query(t, q)); !slices.Equal(got, exp) {
						t.Fatalf("worker %s: got  %v\nwant %v", w, got, exp)
					}
				}
			})
		})
	}
}

func (s suite) list(t *testing.T) {
	t.Parallel()
	st := s.open(t).Store
	now := st.Now()
	var all []string
	for i := range 10 {
		key := fmt.Sprintf("t%02d", i)
		mustInsert(t, st, newTask(t, key, []string{"k1", "k2"}[i%2], now, task.Options{Priority: 10 - i}))
		all = append(all, key)
	}
	for _, k := range []string{"t03", "t04", "t07"} {
		mustModify(t, st, k, func(tk *task.Task) error { return tk.Cancel(now) })
	}
	run := func(t *testing.T, q task.ListQuery) []*task.Task {
		t.Helper()
		got, err := st.List(ctxFor(t), q)
		if err != nil {
			t.Fatalf("List(%+v): %v", q, err)
		}
		return got
	}
	t.Run("All", func(t *testing.T) {
		if got := keys(run(t, task.ListQuery{})); !slices.Equal(got, all) {
			t.Fatalf("got %v; want %v", got, all)
		}
	})
	t.Run("State", func(t *testing.T) {
		if got := keys(run(t, task.ListQuery{State: task.StateCancelled})); !slices.Equal(got, []string{"t03", "t04", "t07"}) {
			t.Fatalf("cancelled: got %v", got)
		}
		if got := keys(run(t, task.ListQuery{State: task.StatePending, Kind: "k2"})); !slices.Equal(got, []string{"t01", "t05", "t09"}) {
			t.Fatalf("pending k2: got %v", got)
		}
	})
	t.Run("Kind", func(t *testing.T) {
		if got := keys(run(t, task.ListQuery{Kind: "k1"})); !slices.Equal(got, []string{"t00", "t02", "t04", "t06", "t08"}) {
			t.Fatalf("k1: got %v", got)
		}
	})
	t.Run("Paging", func(t *testing.T) {
		var got []string
		q := task.ListQuery{Limit: 3}
		for range 10 {
			page := run(t, q)
			if len(page) > 3 {
				t.Fatalf("page of %d with Limit 3", len(page))
			}
			if len(page) == 0 {
				break
			}
			got = append(got, keys(page)...)
			q.AfterSeq = page[len(page)-1].Seq
		}
		if !slices.Equal(got, all) {
			t.Fatalf("pages gave %v; want %v", got, all)
		}
	})
}

// watch opens a change stream, skipping when the backend declared it
// cannot push and failing on ErrWatchUnsupported otherwise.
func watch(t *testing.T, o Opened, st task.Store, p task.WatchParams) task.ChangeStream {
	t.Helper()
	cs, err := st.Watch(t.Context(), p)
	if errors.Is(err, task.ErrWatchUnsupported) {
		if o.NoWatch != "" {
			t.Skipf("no change streams: %s", o.NoWatch)
		}
		t.Fatalf("Watch: %v, and Opened.NoWatch does not declare it", err)
	}
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// next waits up to d for the next event.
func next(t *testing.T, cs task.ChangeStream, d time.Duration) task.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	ev, err := cs.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if ev.Key == "" || len(ev.Token) == 0 {
		t.Fatalf("event without key or token: %+v", ev)
	}
	return ev
}

func (s suite) watch(t *testing.T) {
	const wait = 10 * time.Second
	t.Run("SeesWrites", func(t *testing.T) {
		t.Parallel()
		o := s.open(t)
		st := o.Store
		cs := watch(t, o, st, task.WatchParams{})
		mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
		for i := range 3 {
			mustModify(t, st, "a", func(tk *task.Task) error { tk.Priority = i + 1; return nil })
		}
		var last int64
		for v := int64(1); v <= 4; v++ {
			ev := next(t, cs, wait)
			if ev.Key != "a" {
				t.Fatalf("event %d for key %q; want a", v, ev.Key)
			}
			if ev.Task != nil {
				if ev.Task.Key != "a" || ev.Task.Version < v || ev.Task.Version < last {
					t.Fatalf("event %d carries key %q version %d (previous %d); want a, >= %d", v, ev.Task.Key, ev.Task.Version, last, v)
				}
				last = ev.Task.Version
			}
			if tok := cs.ResumeToken(); len(tok) == 0 {
				t.Fatalf("no resume token after event %d", v)
			}
		}
	})
	t.Run("Resume", func(t *testing.T) {
		t.Parallel()
		o := s.open(t)
		st := o.Store
		cs := watch(t, o, st, task.WatchParams{})
		mustInsert(t, st, newTask(t, "a", "k", st.Now(), task.Options{}))
		if ev := next(t, cs, wait); ev.Key != "a" {
			t.Fatalf("first event for %q; want a", ev.Key)
		}
		tok := cs.ResumeToken()
		cs.Close()
		mustInsert(t, st, newTask(t, "b", "k", st.Now(), task.Options{}))
		mustModify(t, st, "a", func(tk *task.Task) error { tk.Priority = 7; return nil })
		cs2 := watch(t, o, st, task.WatchParams{ResumeAfter: tok})
		if ev := next(t, cs2, wait); ev.Key != "b" {
			t.Fatalf("first event after resume for %q; want b", ev.Key)
		}
		ev := next(t, cs2, wait)
		if ev.Key != "a" || (ev.Task != nil && ev.Task.Version < 2) {
			t.Fatalf("second event after resume: %q %+v; want a at version 2", ev.Key, ev.Task)
		}
	})
	t.Run("CrossHandle", func(t *testing.T) {
		t.Parallel()
		o := s.open(t)
		if o.Reopen == nil {
			t.Skip("Opened.Reopen is nil")
		}
		other := o.Reopen(t)
		cs := watch(t, o, other, task.WatchParams{})
		start := time.Now()
		mustInsert(t, o.Store, newTask(t, "a", "k", o.Store.Now(), task.Options{}))
		ev := next(t, cs, 3*time.Second)
		if ev.Key != "a" {
			t.Fatalf("event for %q; want a", ev.Key)
		}
		t.Logf("cross-handle event after %s", time.Since(start))
		if got := mustGet(t, other, "a"); got.Version != 1 {
			t.Fatalf("other handle reads version %d", got.Version)
		}
	})
	t.Run("Closed", func(t *testing.T) {
		t.Parallel()
		o := s.open(t)
		cs := watch(t, o, o.Store, task.WatchParams{})
		if err := cs.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), wait)
		defer cancel()
		if _, err := cs.Next(ctx); err == nil {
			t.Fatal("Next on a closed stream returned no error")
		} else if ctx.Err() != nil {
			t.Fatalf("Next on a closed stream blocked until the deadline: %v", err)
		}
	})
	t.Run("ContextCancel", func(t *testing.T) {
		t.Parallel()
		o := s.open(t)
		cs := watch(t, o, o.Store, task.WatchParams{})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := cs.Next(ctx)
			done <- err
		}()
		cancel()
		select {
		case err := <-done:
			if err == nil {
				t.Fatal("Next returned no error after ctx was cancelled")
			}
		case <-time.After(wait):
			t.Fatal("Next ignored ctx cancellation")
		}
		// The stream is still usable with a live context.
		mustInsert(t, o.Store, newTask(t, "a", "k", o.Store.Now(), task.Options{}))
		if ev := next(t, cs, wait); ev.Key != "a" {
			t.Logf("after a cancelled Next, event for %q", ev.Key)
		}
	})
}

func (s suite) locks(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	A := task.Holder{TaskKey: "ta", WorkerID: "wa", Attempt: 1}
	B := task.Holder{TaskKey: "tb", WorkerID: "wb", Attempt: 1}
	C := task.Holder{TaskKey: "tc", WorkerID: "wc", Attempt: 1}
	untilA := now.Add(time.Minute)
	lock := func(h task.Holder, at, until time.Time, keys ...string) error {
		return st.AcquireLocks(ctx, task.LockParams{Keys: keys, Holder: h, Now: at, Until: until})
	}
	locked := func(what string, err error, key string, h task.Holder, until time.Time) {
		t.Helper()
		var le *task.LockedError
		if !errors.As(err, &le) || !errors.Is(err, task.ErrLocked) {
			t.Fatalf("%s: %v; want a *task.LockedError", what, err)
		}
		if le.Key != key || le.Holder != h || !le.Until.Truncate(time.Millisecond).Equal(until) {
			t.Fatalf("%s: LockedError{%s %+v %s}; want {%s %+v %s}", what, le.Key, le.Holder, le.Until, key, h, until)
		}
	}
	if err := lock(A, now, untilA, "k1", "k2"); err != nil {
		t.Fatalf("A acquires k1, k2: %v", err)
	}
	locked("B on k2", lock(B, now, now.Add(time.Minute), "k2"), "k2", A, untilA)
	locked("B on free, k1", lock(B, now, now.Add(time.Minute), "free", "k1"), "k1", A, untilA)
	if err := lock(C, now, now.Add(time.Minute), "free"); err != nil {
		t.Fatalf("C on free after B's failed call: %v (B's call was not all-or-nothing)", err)
	}
	otherAttempt := A
	otherAttempt.Attempt = 2
	locked("A's next attempt on k1", lock(otherAttempt, now, now.Add(time.Minute), "k1"), "k1", A, untilA)

	// Renew: A's lease moves later.
	untilA2 := now.Add(2 * time.Minute)
	if err := lock(A, now, untilA2, "k1", "k2"); err != nil {
		t.Fatalf("A renews: %v", err)
	}
	locked("B between A's old and new Until", lock(B, untilA.Add(time.Second), untilA2.Add(time.Minute), "k1"), "k1", A, untilA2)

	// A's lease passes: B takes k1.
	if err := lock(B, untilA2, untilA2.Add(time.Minute), "k1"); err != nil {
		t.Fatalf("B on k1 at A's Until: %v", err)
	}
	locked("A on k1 after B took it", lock(A, untilA2, untilA2.Add(time.Minute), "k1"), "k1", B, untilA2.Add(time.Minute))

	// Release: only the holder frees.
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"k2"}, Holder: C}); err != nil {
		t.Fatalf("C releases k2: %v", err)
	}
	locked("B on k2 after a non-holder released it", lock(B, now, now.Add(time.Minute), "k2"), "k2", A, untilA2)
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"k2"}, Holder: A}); err != nil {
		t.Fatalf("A releases k2: %v", err)
	}
	if err := lock(B, now, now.Add(time.Minute), "k2"); err != nil {
		t.Fatalf("B on k2 after A released it: %v", err)
	}
}

// lockInstances checks that two processes under one worker id, differing
// only in instance, never renew or release each other's locks.
func (s suite) lockInstances(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	first := task.Holder{TaskKey: "t", WorkerID: "dup", Attempt: 1, Instance: "i1"}
	second := first
	second.Instance = "i2"
	until := now.Add(time.Minute)
	if err := st.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: first, Now: now, Until: until}); err != nil {
		t.Fatalf("first acquires: %v", err)
	}
	var le *task.LockedError
	err := st.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: second, Now: now, Until: until.Add(time.Minute)})
	if !errors.As(err, &le) || le.Holder != first {
		t.Fatalf("second instance renews the first's lock: %v; want a *task.LockedError naming %+v", err, first)
	}
	if err := st.ReleaseLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: second}); err != nil {
		t.Fatalf("second instance releases: %v", err)
	}
	err = st.AcquireLocks(ctx, task.LockParams{Keys: []string{"dev"}, Holder: task.Holder{TaskKey: "u", WorkerID: "w"}, Now: now, Until: until})
	if !errors.As(err, &le) || le.Holder != first {
		t.Fatalf("after the second instance's release, a third takes the lock: %v; want it still held by %+v", err, first)
	}
}

// registry checks the worker registry: one live process per worker id.
func (s suite) registry(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	now := st.Now().Truncate(time.Millisecond)
	info := func(id, instance string, until time.Time) task.WorkerInfo {
		return task.WorkerInfo{ID: id, Instance: instance, Host: "h1", PID: 42, StartedAt: now, Kinds: []string{"noop"},
			Concurrency: 8, Running: 1, Heartbeat: now, Until: until}
	}
	register := func(w task.WorkerInfo, at time.Time, replace string) error {
		return st.RegisterWorker(ctx, task.RegisterParams{Worker: w, Now: at, Replace: replace})
	}
	a := info("dup", "i1", now.Add(4*time.Second))
	if err := register(a, now, ""); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	var taken *task.WorkerIDTakenError
	err := register(info("dup", "i2", now.Add(4*time.Second)), now.Add(time.Second), "")
	if !errors.As(err, &taken) || !errors.Is(err, task.ErrWorkerIDTaken) {
		t.Fatalf("second live process under the same id: %v; want a *task.WorkerIDTakenError", err)
	}
	if h := taken.Holder; h.Instance != "i1" || h.Host != "h1" || h.PID != 42 || !h.Until.Equal(a.Until) {
		t.Fatalf("taken error names %+v; want the first process", h)
	}
	for _, want := range []string{`"dup"`, "h1", "42"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	// The holder renews; others register under other ids.
	a.Running, a.Until = 3, now.Add(6*time.Second)
	if err := register(a, now.Add(2*time.Second), ""); err != nil {
		t.Fatalf("holder renews: %v", err)
	}
	if err := register(info("other", "i9", now.Add(time.Second)), now, ""); err != nil {
		t.Fatalf("another id: %v", err)
	}
	ws, err := st.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "dup" || ws[0].Running != 3 || ws[0].Instance != "i1" || !ws[0].Until.Equal(a.Until) ||
		ws[0].Host != "h1" || ws[0].PID != 42 || ws[0].Concurrency != 8 || len(ws[0].Kinds) != 1 || ws[1].ID != "other" {
		t.Fatalf("Workers = %+v", ws)
	}
	// Once the holder's registration lapses, another process takes the id.
	if err := register(info("dup", "i2", now.Add(10*time.Second)), a.Until, ""); err != nil {
		t.Fatalf("register after the holder lapsed: %v", err)
	}
	// Replace takes over a live registration held by a known-dead instance.
	if err := register(info("dup", "i3", now.Add(10*time.Second)), now, "i2"); err != nil {
		t.Fatalf("replace a dead instance: %v", err)
	}
	// Unregister by a stale instance does nothing; by the holder, frees.
	if err := st.UnregisterWorker(ctx, "dup", "i1"); err != nil {
		t.Fatal(err)
	}
	if err := register(info("dup", "i4", now.Add(10*time.Second)), now, ""); !errors.Is(err, task.ErrWorkerIDTaken) {
		t.Fatalf("stale unregister freed the id: %v", err)
	}
	if err := st.UnregisterWorker(ctx, "dup", "i3"); err != nil {
		t.Fatal(err)
	}
	if err := register(info("dup", "i4", now.Add(10*time.Second)), now, ""); err != nil {
		t.Fatalf("register after the holder unregistered: %v", err)
	}
	if err := register(info("", "i5", now.Add(time.Second)), now, ""); !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("empty id: %v; want task.ErrInvalid", err)
	}
}

// records checks the shared records every backend offers (device states).
func (s suite) records(t *testing.T) {
	st := s.store(t)
	rs, ok := st.(task.RecordStore)
	if !ok {
		t.Fatalf("%T does not implement task.RecordStore", st)
	}
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	put := func(id, value string, at time.Time) {
		t.Helper()
		if err := rs.PutRecord(ctx, task.Record{Kind: "device", ID: id, Value: json.RawMessage(value), At: at}); err != nil {
			t.Fatalf("PutRecord %s: %v", id, err)
		}
	}
	put("b", `{"online":true}`, t0)
	put("a", `{"online":false}`, t0)
	put("a", `{"online":true}`, t0.Add(time.Second))   // later: replaces
	put("b", `{"online":false}`, t0.Add(-time.Second)) // older: ignored
	if err := rs.PutRecord(ctx, task.Record{Kind: "other", ID: "a", Value: json.RawMessage(`1`), At: t0}); err != nil {
		t.Fatal(err)
	}
	got, err := rs.Records(ctx, "device")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("Records(device) = %d records, want 2: %+v", len(got), got)
	}
	want := map[string]string{"a": `{"online":true}`, "b": `{"online":true}`}
	for _, r := range got {
		var v, w any
		json.Unmarshal(r.Value, &v)
		json.Unmarshal([]byte(want[r.ID]), &w)
		if fmt.Sprint(v) != fmt.Sprint(w) {
			t.Errorf("record %s = %s, want %s", r.ID, r.Value, want[r.ID])
		}
		if r.Kind != "device" {
			t.Errorf("record %s kind %q", r.ID, r.Kind)
		}
	}
	if err := rs.PutRecord(ctx, task.Record{Kind: "device", ID: "", Value: json.RawMessage(`1`), At: t0}); !errors.Is(err, task.ErrInvalid) {
		t.Errorf("PutRecord with empty id: %v, want ErrInvalid", err)
	}
}
