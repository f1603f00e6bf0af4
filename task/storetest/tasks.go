// tasks.go checks the task document calls: Insert, Get, the
// compare-and-set Update, and publishing through the store.

package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

func (s suite) insert(t *testing.T) {
	t.Run("New", s.insertNew)
	t.Run("Existing", s.insertExisting)
	t.Run("PayloadTooBig", s.insertPayloadTooBig)
	t.Run("Concurrent", s.insertConcurrent)
	t.Run("SeqGrows", s.insertSeqGrows)
	t.Run("EmptyPayload", s.insertEmptyPayload)
}

// insertEmptyPayload: a task built without Publish may carry no payload,
// or JSON null; both store and read back as no payload (nil or null).
func (s suite) insertEmptyPayload(t *testing.T) {
	st := s.store(t)
	for key, p := range map[string]json.RawMessage{"none": nil, "null": json.RawMessage("null")} {
		tk := newTask(t, key, "k", st.Now(), task.Options{})
		tk.Payload = p
		mustInsert(t, st, tk)
		if got := mustGet(t, st, key).Payload; len(got) != 0 && string(got) != "null" {
			t.Errorf("%s: payload read back as %s, want none", key, got)
		}
	}
}

func (s suite) insertNew(t *testing.T) {
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
}

func (s suite) insertExisting(t *testing.T) {
	st := s.store(t)
	first := mustInsert(t, st, newTask(t, "a", "k1", st.Now(), task.Options{Priority: 1}))
	again := newTask(t, "a", "k2", st.Now(), task.Options{Priority: 9})
	got, inserted, err := st.Insert(ctxFor(t), again)
	if err != nil || inserted {
		t.Fatalf("second Insert: inserted=%v err=%v; want false, nil", inserted, err)
	}
	requireSame(t, "second Insert result", got, first)
	requireSame(t, "Get after second Insert", mustGet(t, st, "a"), first)
}

func (s suite) insertPayloadTooBig(t *testing.T) {
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
}

func (s suite) insertConcurrent(t *testing.T) {
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
}

func (s suite) insertSeqGrows(t *testing.T) {
	st := s.store(t)
	var last int64
	for i := range 5 {
		got := mustInsert(t, st, newTask(t, fmt.Sprint("k", i), "k", st.Now(), task.Options{}))
		if got.Seq <= last {
			t.Fatalf("insert %d got Seq %d, not after %d", i, got.Seq, last)
		}
		last = got.Seq
	}
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
	t.Run("DeepResult", s.deepResult)
	t.Run("RoundTrip", s.roundTrip)
}

// roundTrip: every field survives an insert, an update, and an update
// that clears what an earlier one set.
func (s suite) roundTrip(t *testing.T) {
	st := s.store(t)
	now := st.Now()
	tk := &task.Task{
		Key:                  "round/trip:é",
		Kind:                 "kind.x",
		Payload:              json.RawMessage(`{"a": [1, 2, {"b": "c"}], "n": 1.5, "s": "é\u0000", "nil": null}`),
		Trace:                task.Trace{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "vendor=a,other=b"},
		Priority:             -7,
		RunAt:                now.Add(time.Minute + 123456789),
		SpecificWorkerIDs:    []string{"w1", "w2"},
		ConcurrentWorkerCnt:  3,
		SuccessWorkerCnt:     2,
		MaxUnexpectedRetries: 4,
		PingInterval:         task.Duration(1500 * time.Millisecond),
		WorkerTimeout:        task.Duration(7 * time.Second),
		LockKeys:             []string{"device:1", "device:2"},
		Attempts: []task.Attempt{
			{WorkerID: "w1", State: task.AttemptRunning, Attempt: 3, LeaseUntil: now.Add(5 * time.Second), StartedAt: now.Add(-time.Second)},
			{WorkerID: "w2", State: task.AttemptFail, Attempt: 2, LeaseUntil: now.Add(-time.Hour), StartedAt: now.Add(-2 * time.Hour), EndedAt: now.Add(-90 * time.Minute), Error: "boom: \"quoted\""},
			{WorkerID: "w1", State: task.AttemptExpired, Attempt: 1, LeaseUntil: now.Add(-3 * time.Hour), StartedAt: now.Add(-4 * time.Hour), EndedAt: now.Add(-3 * time.Hour), Error: "lease expired"},
		},
		AttemptsStarted: 3,
		State:           task.StateRunning,
		NextClaimAt:     now.Add(time.Minute + 123456789),
		Version:         1,
		CreatedAt:       now.Add(-4 * time.Hour),
		UpdatedAt:       now,
	}
	want := tk.Clone()
	got := mustInsert(t, st, tk)
	want.ID, want.Seq = got.ID, got.Seq
	requireSame(t, "Get after Insert", mustGet(t, st, tk.Key), want)

	// Every field changed by an update survives too.
	next := mustGet(t, st, tk.Key)
	next.Payload = json.RawMessage(`[true,false]`)
	next.Trace = task.Trace{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-00"} // a rerun's
	next.Kind = "kind.y"
	next.Priority = 42
	next.SpecificWorkerIDs = nil
	next.LockKeys = []string{"device:3"}
	next.Attempts = append(next.Attempts, task.Attempt{WorkerID: "w3", State: task.AttemptSuccess, Attempt: 4, LeaseUntil: now, StartedAt: now, EndedAt: now.Add(time.Millisecond),
		Result: json.RawMessage(`{"rows":[1,2.5,"é"],"ok":true,"none":null}`), LogDropped: 3,
		Log: []task.LogLine{{At: now.Add(-time.Second), Msg: "fetched 2 rows"}, {At: now, Msg: "wrote \"é\""}}})
	next.AttemptsStarted = 4
	next.History = []task.Attempt{
		{WorkerID: "w0", Instance: "i0", State: task.WorkerSnoozed, Attempt: 1, LeaseUntil: now.Add(-5 * time.Hour), StartedAt: now.Add(-6 * time.Hour), EndedAt: now.Add(-5 * time.Hour),
			Result: json.RawMessage(`[1,"two"]`), Log: []task.LogLine{{At: now.Add(-5 * time.Hour), Msg: "device offline"}}},
		{WorkerID: "w1", State: task.WorkerReleased, Attempt: 2, LeaseUntil: now.Add(-4 * time.Hour), StartedAt: now.Add(-5 * time.Hour), EndedAt: now.Add(-4 * time.Hour), LogDropped: 4, OutputDropped: true},
	}
	next.HistoryDropped = 7
	next.Cancelled = true
	next.State = task.StateCancelled
	next.NextClaimAt = time.Time{}
	next.PingInterval = task.Duration(time.Second)
	next.WorkerTimeout = task.Duration(time.Hour)
	next.UpdatedAt = now.Add(time.Second)
	next.ChangesVersion = 2
	next.Changes = []task.Change{
		{Op: task.ChangeExpired, WorkerID: "w1", Instance: "i1", Attempt: 3, Error: "lease expired"},
		{Op: task.ChangeSnoozed, WorkerID: "w3", Attempt: 4, Until: now.Add(time.Minute)},
		{Op: task.ChangeCancelled},
	}
	want = next.Clone()
	if err := st.Update(ctxFor(t), next); err != nil {
		t.Fatalf("Update: %v", err)
	}
	want.Version = 2
	requireSame(t, "Get after Update", mustGet(t, st, tk.Key), want)

	updateClears(t, st, tk.Key)
}

// updateClears: an update that clears history and an entry's output
// clears them (MongoDB $sets every field: none may be left out).
func updateClears(t *testing.T, st task.Store, key string) {
	t.Helper()
	next := mustGet(t, st, key)
	next.History, next.HistoryDropped = nil, 0
	next.Attempts[len(next.Attempts)-1].Result, next.Attempts[len(next.Attempts)-1].Log = nil, nil
	want := next.Clone()
	if err := st.Update(ctxFor(t), next); err != nil {
		t.Fatalf("Update: %v", err)
	}
	want.Version = 3
	requireSame(t, "Get after an Update that clears history", mustGet(t, st, key), want)
}

// deepResult: a result nested as deep as task.ValidateResult allows, in
// history, stores on every backend (MongoDB refuses documents nested over
// 100 levels), so an attempt's outcome is never refused for its result.
func (s suite) deepResult(t *testing.T) {
	st := s.store(t)
	tk := mustInsert(t, st, newTask(t, "deep", "k", st.Now(), task.Options{}))
	deep := json.RawMessage(strings.Repeat("[", task.MaxJSONDepth) + strings.Repeat("]", task.MaxJSONDepth))
	if err := task.ValidateResult(deep); err != nil {
		t.Fatal(err)
	}
	tk.History = []task.Attempt{{WorkerID: "w", State: task.WorkerSnoozed, Attempt: 1, StartedAt: st.Now(), Result: deep}}
	want := tk.Clone()
	if err := st.Update(ctxFor(t), tk); err != nil {
		t.Fatalf("Update with a result %d levels deep: %v", task.MaxJSONDepth, err)
	}
	want.Version++
	requireSame(t, "Get after Update", mustGet(t, st, "deep"), want)
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
	t.Run("ConcurrentMixed", s.concurrentMixed)
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
		tk.AttemptsStarted++
		tk.Attempts = append(tk.Attempts, task.Attempt{WorkerID: id, State: task.AttemptRunning, Attempt: tk.AttemptsStarted, LeaseUntil: lease, StartedAt: now})
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
		if stored.State != task.StatePending || len(stored.Attempts) != 0 || stored.Version != done.Version+1 || got.Version != stored.Version {
			t.Fatalf("after rerun: state %s, %d workers, version %d (returned %d); want pending, 0, %d",
				stored.State, len(stored.Attempts), stored.Version, got.Version, done.Version+1)
		}
		if stored.AttemptsStarted != 1 {
			t.Errorf("rerun lost the attempt counter: Attempts=%d", stored.AttemptsStarted)
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
	t.Run("Trace", s.publishTrace)
	t.Run("Invalid", func(t *testing.T) {
		st := s.store(t)
		for name, p := range map[string]task.PublishParams{
			"payload":        {Key: "bad1", Kind: "k", Payload: json.RawMessage(`{`)},
			"kind":           {Key: "bad2"},
			"worker_timeout": {Key: "bad3", Kind: "k", Options: task.Options{PingInterval: time.Second, WorkerTimeout: time.Second}},
			"payload size":   {Key: "bad4", Kind: "k", Payload: bigPayload()},
			"key UTF-8":      {Key: "bad5\xff", Kind: "k"},
			"short lease":    {Key: "bad6", Kind: "k", Options: task.Options{PingInterval: time.Nanosecond, WorkerTimeout: 2 * time.Nanosecond}},
			"traceparent":    {Key: "bad7", Kind: "k", Trace: task.Trace{Traceparent: "00-not-a-trace-01"}},
			"tracestate":     {Key: "bad8", Kind: "k", Trace: task.Trace{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "=="}},
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

// publishTrace: a publish keeps the trace context of its context's span,
// or the one given, and a rerun the rerun's; the backend stores it.
// (Tracing is off in this process: what is stored is what was given.)
func (s suite) publishTrace(t *testing.T) {
	st := s.store(t)
	const (
		fromCtx   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
		given     = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		rerunCtx  = "00-11111111111111111111111111111111-2222222222222222-01"
		stateOfIt = "vendor=x"
	)
	ctx := tracing.Extract(ctxFor(t), fromCtx, stateOfIt)
	check := func(key string, want task.Trace) {
		t.Helper()
		if got := mustGet(t, st, key).Trace; got != want {
			t.Errorf("%s: stored trace %+v; want %+v", key, got, want)
		}
	}
	for _, p := range []task.PublishParams{
		{Key: "from-ctx", Kind: "k"},
		{Key: "given", Kind: "k", Trace: task.Trace{Traceparent: given}},
	} {
		if _, _, err := task.Publish(ctx, st, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: "none", Kind: "k"}); err != nil {
		t.Fatal(err)
	}
	check("from-ctx", task.Trace{Traceparent: fromCtx, Tracestate: stateOfIt})
	check("given", task.Trace{Traceparent: given})
	check("none", task.Trace{})

	mustModify(t, st, "from-ctx", func(tk *task.Task) error { return tk.Cancel(st.Now()) })
	if _, res, err := task.Publish(tracing.Extract(ctxFor(t), rerunCtx, ""), st, task.PublishParams{Key: "from-ctx", Kind: "k", Rerun: true}); err != nil || res != task.Rerun {
		t.Fatalf("rerun: %s, %v", res, err)
	}
	check("from-ctx", task.Trace{Traceparent: rerunCtx})

	out, err := task.PublishMany(ctx, st, []task.PublishParams{{Key: "many", Kind: "k"}})
	if err != nil || out[0].Err != nil {
		t.Fatalf("PublishMany: %v %v", err, out[0].Err)
	}
	check("many", task.Trace{Traceparent: fromCtx, Tracestate: stateOfIt})
}
