package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

// commitMark is where the store's change stream stands: writes after it
// are read back by commitsSince.
func commitMark(t *testing.T, ctx context.Context, store task.Store) task.Token {
	t.Helper()
	cs, err := store.Watch(ctx, task.WatchParams{})
	if err != nil {
		t.Fatalf("change stream: %v", err)
	}
	defer cs.Close()
	return cs.ResumeToken()
}

// commitOrder is the order in which the store committed the claims of
// step tasks and the flows' records of their outcomes: the embedded
// store's change stream carries every write, task and flow document
// alike, in the order of its commits.
type commitOrder struct {
	claim  map[claimAt]int // first write holding the attempt
	record map[runAt]int   // first write of the flow no longer waiting on the run
}

type claimAt struct {
	task    string
	attempt int
}

type runAt struct {
	flow, step, dir string
}

// commitsSince reads every write after mark back from the change stream
// up to a marker task it publishes, so that none of the writes before the
// call is missed.
func commitsSince(t *testing.T, ctx context.Context, store task.Store, mark task.Token) commitOrder {
	t.Helper()
	cs, err := store.Watch(ctx, task.WatchParams{ResumeAfter: mark, Documents: []string{flow.Namespace}})
	if err != nil {
		t.Fatalf("change stream after %s: %v", mark, err)
	}
	defer cs.Close()
	end := fmt.Sprintf("commits-read-%s", mark)
	if _, _, err := task.Publish(ctx, store, task.PublishParams{Key: end, Kind: "marker"}); err != nil {
		t.Fatal(err)
	}
	o := commitOrder{claim: map[claimAt]int{}, record: map[runAt]int{}}
	for n := 0; ; n++ {
		ev, err := cs.Next(ctx)
		if err != nil {
			t.Fatalf("change stream, after %d writes: %v", n, err)
		}
		switch {
		case ev.Key == end:
			return o
		case ev.Task != nil:
			for _, a := range ev.Task.AttemptHistory() {
				if k := (claimAt{ev.Key, a.Attempt}); o.claim[k] == 0 {
					o.claim[k] = n + 1
				}
			}
		case ev.Document != nil && ev.Document.Namespace == flow.Namespace && !ev.DocumentDeleted:
			var f flow.Flow
			if err := json.Unmarshal(ev.Document.Value, &f); err != nil {
				t.Fatalf("flow document %s in the change stream: %v", ev.Document.ID, err)
			}
			for i, st := range f.Steps {
				for dir, r := range map[string]flow.Run{"do": f.Progress[i].Do, "undo": f.Progress[i].Undo} {
					if k := (runAt{f.Key, st.Name, dir}); o.record[k] == 0 && r.State != flow.RunNone && r.State != flow.RunActive {
						o.record[k] = n + 1
					}
				}
			}
		}
	}
}
