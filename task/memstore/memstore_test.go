package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/memstore"
	"github.com/leasepool/leasepool/task/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Opened {
		db := memstore.New(memstore.Config{})
		st := db.Open()
		t.Cleanup(func() { st.Close() })
		return storetest.Opened{Store: st, Reopen: func(t *testing.T) task.Store {
			o := db.Open()
			t.Cleanup(func() { o.Close() })
			return o
		}}
	})
}

// TestLatencyIsVirtual checks that injected latency runs on a bubble's
// virtual clock: a minute of round trips costs no real time.
func TestLatencyIsVirtual(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		db := memstore.New(memstore.Config{Latency: func(memstore.Op, string) time.Duration { return time.Minute }})
		st := db.Open()
		defer st.Close()
		start := time.Now()
		tk, err := task.NewTask(task.PublishParams{Key: "a", Kind: "k"}, st.Now())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.Insert(t.Context(), tk); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Get(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got != 2*time.Minute {
			t.Fatalf("two calls took %s of virtual time; want 2m", got)
		}
	})
}

// TestFaultApplied checks that a fault with Applied writes and still
// fails, so a caller cannot tell: the case a compare-and-set loop must
// survive.
func TestFaultApplied(t *testing.T) {
	fail := true
	db := memstore.New(memstore.Config{Fault: func(op memstore.Op, _ string) memstore.Fault {
		if op == memstore.OpUpdate && fail {
			return memstore.Fault{Err: memstore.ErrInjected, Applied: true}
		}
		return memstore.Fault{}
	}})
	st := db.Open()
	ctx := context.Background()
	tk, _ := task.NewTask(task.PublishParams{Key: "a", Kind: "k"}, st.Now())
	if _, _, err := st.Insert(ctx, tk); err != nil {
		t.Fatal(err)
	}
	c := tk.Clone()
	c.Priority = 3
	if err := st.Update(ctx, c); !errors.Is(err, memstore.ErrInjected) {
		t.Fatalf("Update: %v; want the injected fault", err)
	}
	got, err := st.Get(ctx, "a")
	if err != nil || got.Version != 2 || got.Priority != 3 {
		t.Fatalf("after an applied fault: %+v %v; want version 2, priority 3", got, err)
	}
	if n := st.Counts(); n.Writes != 2 {
		t.Fatalf("handle counts %+v; want 2 writes", n)
	}
	fail = false
	if err := st.Update(ctx, c); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("retry on the version the fault hid: %v; want a conflict", err)
	}
	if n := st.Counts(); n.Conflicts != 1 {
		t.Fatalf("handle counts %+v; want 1 conflict", n)
	}
}

// TestLanes checks the delivery schedules: with one lane every handle
// hears a change at one moment, with none each at a moment of its own,
// and in both a change is never heard before one written ahead of it.
func TestLanes(t *testing.T) {
	for _, lanes := range []int{0, 1} {
		t.Run(fmt.Sprintf("lanes=%d", lanes), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var draws atomic.Int64
				db := memstore.New(memstore.Config{Lanes: lanes, Latency: func(op memstore.Op, key string) time.Duration {
					if op != memstore.OpNext {
						return 0
					}
					n := draws.Add(1)
					if key == "b" {
						return time.Millisecond // written after a, due before it
					}
					return time.Duration(n) * 10 * time.Millisecond
				}})
				const handles = 3
				streams := make([]task.ChangeStream, handles)
				for i := range streams {
					h := db.Open()
					defer h.Close()
					s, err := h.Watch(t.Context(), task.WatchParams{})
					if err != nil {
						t.Fatal(err)
					}
					streams[i] = s
				}
				producer := db.Open()
				defer producer.Close()
				start := time.Now()
				for _, k := range []string{"a", "b"} {
					tk, _ := task.NewTask(task.PublishParams{Key: k, Kind: "k"}, producer.Now())
					if _, _, err := producer.Insert(t.Context(), tk); err != nil {
						t.Fatal(err)
					}
				}
				heard := make([][2]time.Duration, handles)
				var wg sync.WaitGroup
				for i, s := range streams {
					wg.Go(func() {
						for j, want := range []string{"a", "b"} {
							e, err := s.Next(t.Context())
							if err != nil || e.Key != want {
								t.Errorf("stream %d, event %d: %q %v; want %q", i, j, e.Key, err, want)
								return
							}
							heard[i][j] = time.Since(start)
						}
					})
				}
				wg.Wait()
				for i, h := range heard {
					if h[1] != h[0] {
						t.Errorf("stream %d heard b at %s, a at %s; b is due first but must wait for a", i, h[1], h[0])
					}
					switch {
					case lanes == 1 && h[0] != 10*time.Millisecond:
						t.Errorf("one lane: stream %d heard a at %s; want every stream at the lane's one draw, 10ms", i, h[0])
					case lanes == 0 && h[0] != time.Duration(i+1)*10*time.Millisecond:
						t.Errorf("a lane each: stream %d heard a at %s; want its own draw, %s", i, h[0], time.Duration(i+1)*10*time.Millisecond)
					}
				}
			})
		})
	}
}

// TestUnfinished checks the count a run polls and that a candidate page
// leaves finished tasks out.
func TestUnfinished(t *testing.T) {
	db := memstore.New(memstore.Config{})
	st := db.Open()
	ctx := context.Background()
	for _, k := range []string{"a", "b"} {
		tk, _ := task.NewTask(task.PublishParams{Key: k, Kind: "k"}, st.Now())
		if _, _, err := st.Insert(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	if n := db.Unfinished(); n != 2 {
		t.Fatalf("Unfinished after two publishes: %d; want 2", n)
	}
	a, _ := st.Get(ctx, "a")
	a.State = task.StateSucceeded
	if err := st.Update(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n := db.Unfinished(); n != 1 {
		t.Fatalf("Unfinished after a finished: %d; want 1", n)
	}
	page, err := st.Candidates(ctx, task.CandidateQuery{Now: st.Now(), Ready: true, Limit: 10})
	if err != nil || len(page) != 1 || page[0].Key != "b" {
		t.Fatalf("candidates: %v %v; want b alone", page, err)
	}
}
