package consumer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// TestPausedBacklogLeavesRoomForOtherKinds: a paused kind's backlog, three
// times the heap bound, keeps no task of another kind waiting, costs no
// store reads while it stays paused, and runs whole once the pause lifts.
func TestPausedBacklogLeavesRoomForOtherKinds(t *testing.T) {
	e := setup(t)
	const n = 60
	ran := make(chan string, n+1)
	st := &countedCandidates{Store: e.open()}
	e.worker("w1", func(ctx context.Context, job *consumer.Job) error {
		ran <- job.Task.Key
		return nil
	}, onStore(st), func(c *consumer.Config) { c.HeapSize, c.PageSize = 20, 10 })
	if _, err := control.Pause(t.Context(), e.store, control.Kind("other")); err != nil {
		t.Fatal(err)
	}
	e.awaitControls("w1", 1, 0)
	for i := range n {
		p := params(fmt.Sprintf("paused-%02d", i))
		p.Kind = "other"
		if _, _, err := task.Publish(context.Background(), e.store, p); err != nil {
			t.Fatal(err)
		}
	}
	// The backlog's events reach w1 and fill its bound. Paused keys show in
	// neither Stats nor a store write: give them the time they take.
	time.Sleep(300 * time.Millisecond)
	e.publish("free")
	if k := recv(t, ran, "a task to run"); k != "free" {
		t.Fatalf("%s ran: its kind is paused", k)
	}
	rows := st.rows.Load()
	testutil.Consistently(t, time.Second, "no candidate rows read with only paused tasks left",
		func() bool { return st.rows.Load() == rows })
	if _, err := control.Resume(t.Context(), e.store, control.Kind("other")); err != nil {
		t.Fatal(err)
	}
	for range n {
		if k := recv(t, ran, "the paused tasks to run"); k == "free" {
			t.Fatal("free ran twice")
		}
	}
}
