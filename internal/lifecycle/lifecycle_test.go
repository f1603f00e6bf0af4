package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartTwiceAndAfterStop(t *testing.T) {
	t.Parallel()
	var r Runner
	if _, err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	if err := r.Stop(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	var never Runner
	if err := never.Stop(context.Background(), func() { t.Error("teardown of a runner never started") }); err != nil {
		t.Fatal(err)
	}
	if _, err := never.Start(context.Background()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Start after Stop = %v, want ErrStopped", err)
	}
}

func TestStopWaitsThenTearsDownOnce(t *testing.T) {
	t.Parallel()
	var r Runner
	startCtx, cancelStart := context.WithCancel(context.Background())
	run, err := r.Start(startCtx)
	if err != nil {
		t.Fatal(err)
	}
	cancelStart() // bounds the startup only
	var exited, teardowns atomic.Int32
	r.Go(func() { <-run.Done(); time.Sleep(50 * time.Millisecond); exited.Add(1) }) // slow to end: Stop must wait for it
	if !r.Running() || run.Err() != nil {
		t.Fatal("the run context ended with the start context")
	}
	teardown := func() {
		if exited.Load() != 1 {
			t.Error("teardown ran before the goroutine ended")
		}
		teardowns.Add(1)
	}
	if err := r.Stop(context.Background(), teardown); err != nil {
		t.Fatal(err)
	}
	if err := r.Stop(context.Background(), teardown); err != nil {
		t.Fatal(err)
	}
	if teardowns.Load() != 1 || r.Running() {
		t.Fatalf("teardowns %d, running %v; want 1, false", teardowns.Load(), r.Running())
	}
}

func TestStopBoundedByCtx(t *testing.T) {
	t.Parallel()
	var r Runner
	if _, err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	r.Go(func() { <-release })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline", err)
	}
	close(release)
	if err := r.Stop(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
}
