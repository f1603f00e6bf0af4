package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/leasepool/leasepool/task"
)

// doorbell wakes waiting claims on every task write: one change stream,
// open while claims wait and for doorbellLinger after the last, so that a
// worker's next claim finds it open and misses no write.
type doorbell struct {
	store  task.Store
	logger *slog.Logger

	mu        sync.Mutex
	ring      chan struct{} // closed at the next write
	listeners int
	stop      context.CancelFunc // ends the follower; nil when none runs
	done      chan struct{}      // closed when the follower has returned
	linger    *time.Timer
	closed    bool
}

const doorbellLinger = 30 * time.Second

// listen returns a channel closed at the next task write; call leave
// when done waiting.
func (b *doorbell) listen() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ring == nil {
		b.ring = make(chan struct{})
	}
	b.listeners++
	if b.linger != nil {
		b.linger.Stop()
		b.linger = nil
	}
	if b.stop == nil && !b.closed {
		ctx, cancel := context.WithCancel(context.Background())
		b.stop, b.done = cancel, make(chan struct{})
		go b.follow(ctx, b.done)
	}
	return b.ring
}

func (b *doorbell) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listeners--; b.listeners == 0 && b.stop != nil {
		stop := b.stop
		b.linger = time.AfterFunc(doorbellLinger, func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.listeners == 0 && b.stop != nil {
				stop()
				b.stop = nil
			}
		})
	}
}

// close ends the follower and waits for it.
func (b *doorbell) close() {
	b.mu.Lock()
	b.closed = true
	if b.linger != nil {
		b.linger.Stop()
	}
	stop, done := b.stop, b.done
	b.stop = nil
	b.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (b *doorbell) wake() {
	b.mu.Lock()
	close(b.ring)
	b.ring = make(chan struct{})
	b.mu.Unlock()
}

// follow rings at each write until ctx ends. A store that cannot stream
// leaves the claims to their safety poll.
func (b *doorbell) follow(ctx context.Context, done chan struct{}) {
	defer close(done)
	for ctx.Err() == nil {
		cs, err := b.store.Watch(ctx, task.WatchParams{SkipQuiet: true})
		if errors.Is(err, task.ErrWatchUnsupported) {
			return
		}
		if err == nil {
			for {
				if _, err = cs.Next(ctx); err != nil {
					break
				}
				b.wake()
			}
			_ = cs.Close()
		}
		if ctx.Err() != nil {
			return
		}
		b.logger.Debug("remote claims: change stream ended; reopening", slog.Any("err", err))
		// Claims poll meanwhile.
		if !sleep(ctx, time.Second) {
			return
		}
	}
}
