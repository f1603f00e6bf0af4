package consumer

// Discovery: the change stream feeding the scheduler, opened before the
// first query so nothing written between the two is missed, and reopened
// from its resume token after errors. The control doorbell's events reload
// the pauses and limits instead.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/control"
	"github.com/leasepool/leasepool/task"
)

// watch feeds change events to the scheduler. It opens the stream before
// asking for a query, so nothing written between the two is missed, and
// reopens from the resume token after errors.
func (c *Consumer) watch(ctx context.Context) {
	var token task.Token
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		// Renewals and other quiet writes are left out: see
		// task.Task.Quiet, and attempt's read before a takeover.
		stream, err := c.store.Watch(ctx, task.WatchParams{ResumeAfter: token, SkipQuiet: true,
			Documents: []string{control.DoorbellNamespace}})
		switch {
		case errors.Is(err, task.ErrWatchUnsupported):
			c.logger.Info("store has no change stream; polling", slog.Duration("interval", c.cfg.PollInterval))
			signal(c.pollNow)
			return
		case errors.Is(err, task.ErrHistoryLost):
			c.logger.Warn("change history lost; re-querying everything")
			token = nil
			continue
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			c.logger.Warn("open change stream", slog.Any("err", err))
			sleep(ctx, backoff)
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		if token == nil {
			c.loadControl(ctx)
			signal(c.requery)
		}
		backoff = 10 * time.Millisecond
		err = c.pump(ctx, stream)
		token = stream.ResumeToken()
		stream.Close()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, task.ErrHistoryLost) {
			c.logger.Warn("change history lost; re-querying everything")
			token = nil
		} else {
			c.logger.Warn("change stream failed; resuming", slog.Any("err", err))
			sleep(ctx, backoff)
		}
	}
}

func (c *Consumer) pump(ctx context.Context, stream task.ChangeStream) error {
	for {
		ev, err := stream.Next(ctx)
		if err != nil {
			return err
		}
		if ev.Document != nil {
			c.loadControl(ctx) // the doorbell: the only namespace asked for
			continue
		}
		if ev.Task == nil {
			t, err := c.store.Get(ctx, ev.Key)
			if errors.Is(err, task.ErrNotFound) {
				continue
			}
			if err != nil {
				// The stream resumes past this event: a query (retried
				// while it fails) finds what it carried.
				signal(c.requery)
				return fmt.Errorf("re-read %s: %w", ev.Key, err)
			}
			ev.Task = t
		}
		select {
		case c.events <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
