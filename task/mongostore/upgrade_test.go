package mongostore_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/task"
)

// TestLegacyDoorbellTaskIsLeftAlone: a database where the control
// doorbell was a task (cancelled, pinned to a worker id nothing registers)
// opens as it is; control writes ring the doorbell document, leave that
// task untouched, and workers' streams hear the ring.
func TestLegacyDoorbellTaskIsLeftAlone(t *testing.T) {
	uri := testservers.MongoURI(t)
	st, cfg := openFresh(t, uri)
	ctx := t.Context()
	const legacyKey = task.ReservedPrefix + "control"
	if _, _, err := task.Publish(task.WithInternalWrite(ctx), st, task.PublishParams{Key: legacyKey, Kind: "leasepool.control",
		Options: task.Options{SpecificWorkerIDs: []string{legacyKey}}}); err != nil {
		t.Fatal(err)
	}
	legacy, err := task.Cancel(ctx, st, legacyKey)
	if err != nil {
		t.Fatal(err)
	}
	reopened := open(t, uri, cfg)
	cs, err := reopened.Watch(ctx, task.WatchParams{Documents: []string{control.DoorbellNamespace}})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := control.Pause(ctx, reopened, control.Kind("slow")); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev, err := cs.Next(wctx)
	if err != nil || ev.Document == nil || ev.Document.ID != control.DoorbellID {
		t.Fatalf("first event after a pause: %+v, %v; want the doorbell document", ev, err)
	}
	got, err := reopened.Get(ctx, legacyKey)
	if err != nil || got.Version != legacy.Version || got.State != task.StateCancelled {
		t.Fatalf("legacy doorbell task after a control write: %+v, %v; want version %d, cancelled", got, err, legacy.Version)
	}
	if ps, err := control.Pauses(ctx, reopened); err != nil || len(ps) != 1 {
		t.Fatalf("Pauses = %+v, %v", ps, err)
	}
}
