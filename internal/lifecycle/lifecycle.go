// Package lifecycle is the one start/stop contract of leasepool's
// long-lived components, so each need not get it right again: Start once
// (a second call is an error), Stop any number of times, Stop waits for
// the component's goroutines within the caller's deadline.
package lifecycle

import (
	"context"
	"errors"
	"sync"
)

var (
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("already started")
	// ErrStopped is returned by a Start after Stop.
	ErrStopped = errors.New("already stopped")
)

// Runner tracks one component's start, stop and goroutines. The zero value
// is ready to use; it must not be copied after first use.
type Runner struct {
	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	done    chan struct{} // closed when Stop's teardown has returned
}

// Start marks the component started and returns the context its
// goroutines run under: it keeps ctx's values but not its cancellation
// (ctx bounds the caller's startup only) and ends at Stop. It returns
// ErrStarted on a second call and ErrStopped after Stop.
func (r *Runner) Start(ctx context.Context) (context.Context, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.stopped:
		return nil, ErrStopped
	case r.started:
		return nil, ErrStarted
	}
	r.started = true
	run, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	return run, nil
}

// Go runs f on a goroutine that Stop waits for. Call it only between
// Start and Stop.
func (r *Runner) Go(f func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
}

// Running reports whether Start was called and Stop was not.
func (r *Runner) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started && !r.stopped
}

// Stop ends the run context, waits for the goroutines started by Go, then
// runs teardown (nil: none) once. It returns when teardown has returned, or
// with ctx's cause when ctx ends first (the stop goes on in the
// background). Later calls wait for the same end. A Stop before Start has
// nothing to wait for; a later Start returns ErrStopped.
func (r *Runner) Stop(ctx context.Context, teardown func()) error {
	r.mu.Lock()
	if !r.stopped {
		r.stopped = true
		r.done = make(chan struct{})
		if !r.started {
			close(r.done)
		} else {
			r.cancel()
			go func() {
				defer close(r.done)
				r.wg.Wait()
				if teardown != nil {
					teardown()
				}
			}()
		}
	}
	done := r.done
	r.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
