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

// publishMany: task.PublishMany answers every item in order, refuses the
// invalid ones without writing them or stopping the rest, and inserts each
// key once however many items (or concurrent batches) name it.
func (s suite) publishMany(t *testing.T) {
	t.Run("Mixed", s.publishManyMixed)
	t.Run("OneKeyRepeated", s.publishManyOneKey)
	t.Run("ConcurrentBatches", s.publishManyConcurrent)
}

func pm(key string, payload string) task.PublishParams {
	return task.PublishParams{Key: key, Kind: "k", Payload: json.RawMessage(payload)}
}

func (s suite) publishManyMixed(t *testing.T) {
	st := s.store(t)
	ctx := ctxFor(t)
	if _, _, err := task.Publish(ctx, st, pm("old", `{"v":"old"}`)); err != nil {
		t.Fatal(err)
	}
	now := st.Now()
	mustModify(t, st, "old", addWorker("w1", now.Add(time.Minute), now))
	mustModify(t, st, "old", func(tk *task.Task) error { return tk.Succeed(task.Holder{WorkerID: "w1", Attempt: 1}, now) })

	rerun := pm("old", `{}`)
	rerun.Rerun = true
	badKind := pm("bad-kind", `{}`)
	badKind.Kind = ""
	badRetries := pm("bad-retries", `{}`)
	badRetries.MaxUnexpectedRetries = -5
	ps := []task.PublishParams{
		pm("a", `{"v":1}`),       // 0 inserted
		pm("b", `{"v":2}`),       // 1 inserted
		pm("a", `{"v":"again"}`), // 2 existing: a was stored by 0
		pm("old", `{}`),          // 3 existing: stored before
		badKind,                  // 4 refused: kind
		{Key: "deep", Kind: "k", Payload: nested(task.MaxJSONDepth + 1)}, // 5 refused: payload
		pm("", `{}`), // 6 refused: key
		rerun,        // 7 rerun: old is finished
		badRetries,   // 8 refused: max_unexpected_retries
		pm("b", `[`), // 9 refused: payload, though b is stored
	}
	for i := range 300 {
		ps = append(ps, pm(fmt.Sprintf("many-%03d", i), fmt.Sprintf(`{"i":%d}`, i)))
	}
	out, err := task.PublishMany(ctx, st, ps)
	if err != nil {
		t.Fatalf("PublishMany: %v", err)
	}
	if len(out) != len(ps) {
		t.Fatalf("%d outcomes for %d items", len(out), len(ps))
	}
	want := map[int]task.PublishResult{0: task.Inserted, 1: task.Inserted, 2: task.Existing, 3: task.Existing, 7: task.Rerun}
	refused := map[int]string{4: "kind", 5: "payload", 6: "key", 8: "max_unexpected_retries", 9: "payload"}
	for i, o := range out {
		if field, ok := refused[i]; ok {
			if !errors.Is(o.Err, task.ErrInvalid) || !strings.Contains(o.Err.Error(), field+":") || o.Task != nil {
				t.Errorf("item %d: %+v; want refused naming %s", i, o, field)
			}
			continue
		}
		res, ok := want[i]
		if !ok {
			res = task.Inserted
		}
		if o.Err != nil || o.Result != res || o.Task == nil || o.Task.Key != ps[i].Key {
			t.Errorf("item %d (%s): %s %v; want %s", i, ps[i].Key, o.Result, o.Err, res)
		}
	}
	if got := mustGet(t, st, "a"); string(got.Payload) != `{"v":1}` {
		t.Errorf("a's payload %s; want the first item's", got.Payload)
	}
	if got := mustGet(t, st, "old"); got.State != task.StatePending {
		t.Errorf("old after rerun: %s; want pending", got.State)
	}
	requireAbsent(t, st, "bad-kind")
	requireAbsent(t, st, "deep")
	requireAbsent(t, st, "bad-retries")
	for i := range 300 {
		k := fmt.Sprintf("many-%03d", i)
		if got := mustGet(t, st, k); string(got.Payload) != fmt.Sprintf(`{"i":%d}`, i) {
			t.Fatalf("%s payload %s", k, got.Payload)
		}
	}
	stats, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range stats.Counts {
		n += c.N
	}
	if n != 303 { // a, b, old and the 300
		t.Errorf("Stats counts %d tasks; want 303", n)
	}
}

// publishManyOneKey: thousands of items of one key make one write; each
// later item is answered existing with the first item's task.
func (s suite) publishManyOneKey(t *testing.T) {
	st := s.store(t)
	ps := make([]task.PublishParams, 2000)
	for i := range ps {
		ps[i] = pm("same", fmt.Sprintf(`{"i":%d}`, i))
	}
	out, err := task.PublishMany(ctxFor(t), st, ps)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		want := task.Existing
		if i == 0 {
			want = task.Inserted
		}
		if o.Err != nil || o.Result != want || o.Task == nil || o.Task.Version != 1 {
			t.Fatalf("item %d: %+v; want %s at version 1", i, o, want)
		}
	}
	if got := mustGet(t, st, "same"); string(got.Payload) != `{"i":0}` || got.Version != 1 {
		t.Errorf("stored payload %s version %d; want the first item's at version 1", got.Payload, got.Version)
	}
}

// publishManyConcurrent: two batches naming the same keys at once insert
// each key exactly once between them.
func (s suite) publishManyConcurrent(t *testing.T) {
	st := s.store(t)
	ps := make([]task.PublishParams, 200)
	for i := range ps {
		ps[i] = pm(fmt.Sprintf("k%03d", i), `{}`)
	}
	var wg sync.WaitGroup
	outs := make([][]task.PublishOutcome, 2)
	for b := range outs {
		wg.Go(func() {
			out, err := task.PublishMany(ctxFor(t), st, ps)
			if err != nil {
				t.Error(err)
			}
			outs[b] = out
		})
	}
	wg.Wait()
	for i := range ps {
		inserted := 0
		for _, out := range outs {
			if out[i].Err != nil {
				t.Fatalf("item %d: %v", i, out[i].Err)
			}
			if out[i].Result == task.Inserted {
				inserted++
			}
		}
		if inserted != 1 {
			t.Fatalf("key %s inserted %d times; want once", ps[i].Key, inserted)
		}
	}
}
