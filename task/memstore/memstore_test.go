package memstore_test

import (
	"context"
	"errors"
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
