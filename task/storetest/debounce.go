package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// debounce: a debounced publish of a pending, never claimed task replaces
// its payload and moves its run_at; any other task is left as it is; and a
// debounce racing a claim never changes the claimed task's payload.
func (s suite) debounce(t *testing.T) {
	const wait = 500 * time.Millisecond
	pub := func(t *testing.T, st task.Store, key string, n int, rerun bool) (*task.Task, task.PublishResult) {
		t.Helper()
		got, res, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: key, Kind: "k",
			Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)), Debounce: wait, Rerun: rerun})
		if err != nil {
			t.Fatalf("Publish %s n=%d: %v", key, n, err)
		}
		return got, res
	}
	payloadN := func(t *testing.T, tk *task.Task) int {
		t.Helper()
		var v struct{ N int }
		if err := json.Unmarshal(tk.Payload, &v); err != nil {
			t.Fatalf("payload %s: %v", tk.Payload, err)
		}
		return v.N
	}
	t.Run("Burst", func(t *testing.T) {
		st := s.store(t)
		first, res := pub(t, st, "a", 0, false)
		if res != task.Inserted {
			t.Fatalf("first publish: %s; want inserted", res)
		}
		if d := first.RunAt.Sub(first.CreatedAt); d < wait-time.Millisecond {
			t.Errorf("first publish: run_at %s after creation; want the debounce, %s", d, wait)
		}
		var before time.Time
		for i := 1; i <= 30; i++ {
			before = st.Now()
			if got, res := pub(t, st, "a", i, false); res != task.Debounced || payloadN(t, got) != i {
				t.Fatalf("publish %d: %s, payload %s; want debounced, n=%d", i, res, got.Payload, i)
			}
		}
		stored := mustGet(t, st, "a")
		if payloadN(t, stored) != 30 || stored.Version != 31 || stored.State != task.StatePending {
			t.Fatalf("after the burst: payload %s, version %d, %s; want n=30, version 31, pending", stored.Payload, stored.Version, stored.State)
		}
		if min := before.Add(wait).Truncate(time.Millisecond); stored.RunAt.Before(min) || !stored.NextClaimAt.Equal(stored.RunAt) {
			t.Errorf("after the burst: run_at %s, next_claim_at %s; want both at least %s", stored.RunAt, stored.NextClaimAt, min)
		}
		if !stored.CreatedAt.Equal(first.CreatedAt.Truncate(time.Millisecond)) && !stored.CreatedAt.Equal(first.CreatedAt) || stored.Seq != first.Seq {
			t.Errorf("a debounce changed created_at or seq: %s/%d, was %s/%d", stored.CreatedAt, stored.Seq, first.CreatedAt, first.Seq)
		}
		// Without a debounce, a publish still leaves the task alone.
		if _, res, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: "a", Kind: "k", Payload: json.RawMessage(`{"n":99}`)}); err != nil || res != task.Existing {
			t.Fatalf("plain publish: %s, %v; want existing", res, err)
		}
		if got := mustGet(t, st, "a"); payloadN(t, got) != 30 {
			t.Errorf("a plain publish changed the payload to %s", got.Payload)
		}
	})
	t.Run("ClaimedRunningFinished", func(t *testing.T) {
		st := s.store(t)
		pub(t, st, "a", 1, false)
		now := st.Now()
		running := mustModify(t, st, "a", addWorker("w1", now.Add(time.Minute), now))
		got, res := pub(t, st, "a", 2, false)
		if res != task.Existing {
			t.Fatalf("debounce of a running task: %s; want existing", res)
		}
		requireSame(t, "returned running task", got, running)
		requireSame(t, "stored running task", mustGet(t, st, "a"), running)

		// Pending again after a failure: claimed once, so left alone.
		retrying := mustModify(t, st, "a", func(tk *task.Task) error {
			return tk.Fail(task.Holder{WorkerID: "w1", Attempt: 1}, "boom", now, now)
		})
		if retrying.State != task.StatePending {
			t.Fatalf("after a failure: %s; want pending", retrying.State)
		}
		if _, res := pub(t, st, "a", 3, false); res != task.Existing {
			t.Fatalf("debounce of a task claimed before: %s; want existing", res)
		}
		requireSame(t, "stored retrying task", mustGet(t, st, "a"), retrying)

		done := mustModify(t, st, "a", func(tk *task.Task) error { return tk.Cancel(st.Now()) })
		if _, res := pub(t, st, "a", 4, false); res != task.Existing {
			t.Fatalf("debounce of a finished task: %s; want existing", res)
		}
		requireSame(t, "stored finished task", mustGet(t, st, "a"), done)
		// With rerun, the finished task runs again with the new payload,
		// after the debounce.
		before := st.Now()
		got, res = pub(t, st, "a", 5, true)
		if res != task.Rerun || payloadN(t, got) != 5 || got.RunAt.Before(before.Add(wait).Truncate(time.Millisecond)) {
			t.Fatalf("debounced rerun: %s, payload %s, run_at %s; want rerun, n=5, after %s", res, got.Payload, got.RunAt, before.Add(wait))
		}
	})
	t.Run("RaceWithClaim", func(t *testing.T) {
		// Publishers debounce keys while a claimer claims each once: the
		// payload the claim stored is the one left at the end, and no
		// write follows the claim's.
		st := s.store(t)
		const keys, publishers, each = 8, 4, 15
		for k := range keys {
			pub(t, st, fmt.Sprintf("r%d", k), 0, false)
		}
		claimed := make([]*task.Task, keys)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for p := range publishers {
			wg.Go(func() {
				<-start
				for i := range each {
					for k := range keys {
						n := 1 + p*each + i
						_, res, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: fmt.Sprintf("r%d", k), Kind: "k",
							Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, n)), Debounce: wait})
						if err != nil || (res != task.Debounced && res != task.Existing) {
							t.Errorf("publish r%d n=%d: %s, %v", k, n, res, err)
						}
					}
				}
			})
		}
		wg.Go(func() {
			<-start
			for k := range keys {
				now := st.Now()
				got, err := task.Modify(ctxFor(t), st, fmt.Sprintf("r%d", k), addWorker("w", now.Add(time.Minute), now))
				if err != nil {
					t.Errorf("claim r%d: %v", k, err)
					return
				}
				claimed[k] = got
			}
		})
		close(start)
		wg.Wait()
		if t.Failed() {
			return
		}
		for k, c := range claimed {
			stored := mustGet(t, st, fmt.Sprintf("r%d", k))
			if string(stored.Payload) != string(c.Payload) || stored.Version != c.Version {
				t.Errorf("r%d: claimed with payload %s at version %d; stored now %s at version %d", k, c.Payload, c.Version, stored.Payload, stored.Version)
			}
		}
	})
	t.Run("Invalid", func(t *testing.T) {
		st := s.store(t)
		for name, d := range map[string]time.Duration{"negative": -time.Second, "huge": task.MaxDebounce + time.Second} {
			key := "bad-" + name
			_, _, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: key, Kind: "k", Debounce: d})
			if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "debounce") {
				t.Errorf("%s debounce: %v; want ErrInvalid naming debounce", name, err)
			}
			if _, err := st.Get(ctxFor(t), key); !errors.Is(err, task.ErrNotFound) {
				t.Errorf("%s debounce: Get: %v; want ErrNotFound", name, err)
			}
		}
		// An existing task is not touched by an invalid debounce either.
		kept, _ := pub(t, st, "a", 1, false)
		if _, _, err := task.Publish(ctxFor(t), st, task.PublishParams{Key: "a", Kind: "k", Payload: json.RawMessage(`{"n":2}`), Debounce: -1}); !errors.Is(err, task.ErrInvalid) {
			t.Errorf("negative debounce of an existing key: %v; want ErrInvalid", err)
		}
		requireSame(t, "task after an invalid debounce", mustGet(t, st, "a"), kept)
	})
	t.Run("PublishMany", func(t *testing.T) {
		// Items of one key in one batch debounce one after another.
		st := s.store(t)
		ps := make([]task.PublishParams, 20)
		for i := range ps {
			ps[i] = task.PublishParams{Key: "m", Kind: "k", Payload: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), Debounce: wait}
		}
		out, err := task.PublishMany(ctxFor(t), st, ps)
		if err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			want := task.Debounced
			if i == 0 {
				want = task.Inserted
			}
			if o.Err != nil || o.Result != want {
				t.Fatalf("item %d: %s, %v; want %s", i, o.Result, o.Err, want)
			}
		}
		if got := mustGet(t, st, "m"); payloadN(t, got) != 19 || got.Version != 20 {
			t.Fatalf("after the batch: payload %s, version %d; want n=19, version 20", got.Payload, got.Version)
		}
	})
}
