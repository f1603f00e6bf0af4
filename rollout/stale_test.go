package rollout

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// A writer that stopped between its shard write and its rollout write
// (a driver killed there) leaves a shard ahead of the counts: the next
// driver leaves it to its writer for OrphanAfter, then takes it as stored
// and counts again, so the counts are exact.
func TestShardAheadOfTheCountsIsCountedAgain(t *testing.T) {
	ctx := context.Background()
	st := openStore(t)
	if _, err := Create(ctx, st, "ahead", Spec{Command: "update", Devices: devices(ShardSize + 5), Rate: Rate{N: 1, Per: task.Duration(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	r, err := Get(ctx, st, "ahead")
	if err != nil {
		t.Fatal(err)
	}
	// The dead writer's shard write: two executions ended.
	r.Devices[3].Outcome, r.Devices[ShardSize+1].Outcome = OutcomeSucceeded, OutcomeFailed
	if err := putShards(ctx, st, r); err != nil {
		t.Fatal(err)
	}
	head, _ := GetHead(ctx, st, "ahead")
	if p := head.Progress(); p.Total.Succeeded != 0 || p.Total.Failed != 0 {
		t.Fatalf("the document counted the unconfirmed write: %+v", p.Total)
	}
	heir := NewStepper(st)
	heir.orphanAfter = 300 * time.Millisecond
	if err := heir.Step(ctx, "ahead"); !errors.Is(err, task.ErrConflict) {
		t.Fatalf("a step at once: %v, want a conflict (the shard's writer may still write the document)", err)
	}
	testutil.Eventually(t, 10*time.Second, "the heir to count the shards again", func() bool {
		if err := heir.Step(ctx, "ahead"); err != nil && !errors.Is(err, task.ErrConflict) {
			t.Fatal(err)
		}
		head, err := GetHead(ctx, st, "ahead")
		if err != nil {
			t.Fatal(err)
		}
		p := head.Progress()
		return p.Total.Succeeded == 1 && p.Total.Failed == 1
	})
	got, err := Get(ctx, st, "ahead")
	if err != nil {
		t.Fatal(err)
	}
	if got.stale || got.Progress().Total != mustHead(t, st, "ahead").Progress().Total {
		t.Fatalf("counts %+v, executions %+v", mustHead(t, st, "ahead").Progress().Total, got.Progress().Total)
	}
}

func mustHead(t *testing.T, st task.Store, name string) *Rollout {
	t.Helper()
	r, err := GetHead(context.Background(), st, name)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
