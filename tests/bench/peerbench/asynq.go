package main

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
)

// Asynq on Redis, default settings: asynq.Config sets only Concurrency, the
// figure under test; tasks carry no options but ProcessIn for the delayed
// ones of the memory figure.

type asynqPeer struct {
	client *asynq.Client
	rdb    *redis.Client
}

func asynqOpt(url string) (asynq.RedisConnOpt, error) {
	return asynq.ParseRedisURI(url)
}

func openAsynq(ctx context.Context, url string) (*asynqPeer, error) {
	opt, err := asynqOpt(url)
	if err != nil {
		return nil, err
	}
	rdb, ok := opt.MakeRedisClient().(*redis.Client)
	if !ok {
		return nil, err
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		return nil, err
	}
	return &asynqPeer{client: asynq.NewClient(opt), rdb: rdb}, nil
}

func (a *asynqPeer) Publish(ctx context.Context, kind string) (string, error) {
	info, err := a.client.EnqueueContext(ctx, asynq.NewTask(kind, nil))
	if err != nil {
		return "", err
	}
	return info.ID, nil
}

// PublishMany enqueues from 16 goroutines: Asynq has no batch enqueue.
func (a *asynqPeer) PublishMany(ctx context.Context, n int, runAt time.Time) error {
	var opts []asynq.Option
	if !runAt.IsZero() {
		opts = append(opts, asynq.ProcessAt(runAt))
	}
	g, ctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	left := n
	for range 16 {
		g.Go(func() error {
			for {
				mu.Lock()
				if left == 0 {
					mu.Unlock()
					return nil
				}
				left--
				mu.Unlock()
				if _, err := a.client.EnqueueContext(ctx, asynq.NewTask("noop", nil), opts...); err != nil {
					return err
				}
			}
		})
	}
	return g.Wait()
}

// Busy reads the default queue's lists: pending and active.
func (a *asynqPeer) Busy(ctx context.Context) (bool, error) {
	pipe := a.rdb.Pipeline()
	pending := pipe.LLen(ctx, "asynq:{default}:pending")
	active := pipe.LLen(ctx, "asynq:{default}:active")
	if _, err := pipe.Exec(ctx); err != nil {
		return false, err
	}
	return pending.Val()+active.Val() > 0, nil
}

func (a *asynqPeer) Reset(ctx context.Context) error {
	return a.rdb.FlushDB(ctx).Err()
}

func (a *asynqPeer) Versions(ctx context.Context) map[string]string {
	v := depVersions("github.com/hibiken/asynq", "github.com/redis/go-redis/v9")
	if info, err := a.rdb.Info(ctx, "server").Result(); err == nil {
		for line := range strings.Lines(info) {
			if s, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				v["Redis"] = s
			}
		}
	}
	return v
}

func (a *asynqPeer) Close() {
	a.client.Close()
	a.rdb.Close()
}

func asynqWorker(_ context.Context, url string, concurrency int, tuned bool, rec *recorder) error {
	opt, err := asynqOpt(url)
	if err != nil {
		return err
	}
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		rec.mark(id)
		return nil
	})
	mux.HandleFunc("sleep", func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		rec.mark(id)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Hour):
			return nil
		}
	})
	cfg := asynq.Config{Concurrency: concurrency}
	if tuned {
		cfg.TaskCheckInterval = time.Millisecond
	}
	srv := asynq.NewServer(opt, cfg)
	if err := srv.Start(mux); err != nil {
		return err
	}
	rec.mark("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	srv.Shutdown()
	return nil
}
