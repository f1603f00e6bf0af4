package consumer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/lifecycle"
)

// TestStartStopContract: the consumer keeps the start/stop contract every
// long-lived component shares (internal/lifecycle).
func TestStartStopContract(t *testing.T) {
	e := setup(t)
	noop := func(context.Context, *consumer.Job) error { return nil }
	c := e.worker("w", noop)
	if err := c.Start(context.Background()); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	for range 2 {
		if err := c.Stop(context.Background()); err != nil {
			t.Fatalf("Stop = %v", err)
		}
	}
	if err := c.Start(context.Background()); !errors.Is(err, lifecycle.ErrStopped) {
		t.Fatalf("Start after Stop = %v, want ErrStopped", err)
	}
	workers, err := e.store.Workers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(workers) != 0 {
		t.Fatalf("registry after Stop: %+v, want empty", workers)
	}
}
