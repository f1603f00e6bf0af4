package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// River on PostgreSQL through riverpgxv5, default settings: the client's
// Config sets only what a River program must (Queues with MaxWorkers, the
// concurrency under test, and Workers); the pgx pool is pgxpool.New's.

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type sleepArgs struct{}

func (sleepArgs) Kind() string { return "sleep" }

type riverPeer struct {
	pool   *pgxpool.Pool
	client *river.Client[pgx.Tx]
}

func openRiver(ctx context.Context, url string) (*riverPeer, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, err
	}
	client, err := river.NewClient(driver, &river.Config{}) // insert-only
	if err != nil {
		return nil, err
	}
	return &riverPeer{pool: pool, client: client}, nil
}

func (r *riverPeer) Publish(ctx context.Context, kind string) (string, error) {
	var args river.JobArgs = noopArgs{}
	if kind == "sleep" {
		args = sleepArgs{}
	}
	res, err := r.client.Insert(ctx, args, nil)
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(res.Job.ID, 10), nil
}

func (r *riverPeer) PublishMany(ctx context.Context, n int, runAt time.Time) error {
	const batch = 2000
	for done := 0; done < n; {
		params := make([]river.InsertManyParams, min(batch, n-done))
		for i := range params {
			params[i] = river.InsertManyParams{Args: noopArgs{}, InsertOpts: &river.InsertOpts{ScheduledAt: runAt}}
		}
		if _, err := r.client.InsertManyFast(ctx, params); err != nil {
			return err
		}
		done += len(params)
	}
	return nil
}

func (r *riverPeer) Busy(ctx context.Context) (bool, error) {
	var busy bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE state IN ('available', 'running', 'pending'))`).Scan(&busy)
	return busy, err
}

func (r *riverPeer) Reset(ctx context.Context) error {
	_, err := r.pool.Exec(ctx, `DELETE FROM river_job WHERE state <> 'completed'`)
	return err
}

func (r *riverPeer) Versions(ctx context.Context) map[string]string {
	v := depVersions("github.com/riverqueue/river", "github.com/riverqueue/river/riverdriver/riverpgxv5", "github.com/jackc/pgx/v5")
	var server string
	if err := r.pool.QueryRow(ctx, `SHOW server_version`).Scan(&server); err == nil {
		v["PostgreSQL"] = server
	}
	return v
}

func (r *riverPeer) Close() { r.pool.Close() }

type riverNoop struct {
	river.WorkerDefaults[noopArgs]
	rec *recorder
}

func (w *riverNoop) Work(ctx context.Context, job *river.Job[noopArgs]) error {
	w.rec.mark(strconv.FormatInt(job.ID, 10))
	return nil
}

type riverSleep struct {
	river.WorkerDefaults[sleepArgs]
	rec *recorder
}

// Work holds the job for an hour or until River cancels it (its default job
// timeout is a minute; the holder is killed long before).
func (w *riverSleep) Work(ctx context.Context, job *river.Job[sleepArgs]) error {
	w.rec.mark(strconv.FormatInt(job.ID, 10))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Hour):
		return nil
	}
}

func riverWorker(ctx context.Context, url string, concurrency int, tuned bool, rec *recorder) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverNoop{rec: rec})
	river.AddWorker(workers, &riverSleep{rec: rec})
	cfg := &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: concurrency}},
		Workers: workers,
	}
	if tuned {
		cfg.FetchCooldown = time.Millisecond
	}
	client, err := river.NewClient(riverpgxv5.New(pool), cfg)
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return err
	}
	rec.mark("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
