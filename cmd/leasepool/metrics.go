package main

// Prometheus metrics on `leasepool worker --metrics-addr` and on
// `leasepool serve`'s listener (package metrics).

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
	"github.com/leasepool/leasepool/web"
)

func metricsFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "metrics-addr",
			Usage: "HOST:PORT to serve Prometheus metrics on (/metrics); empty: none. Any address may be listened on: metrics carry " +
				"kinds and counts, no keys or payloads; give --metrics-token to require a bearer token. Without it, only " +
				"requests whose Host header is localhost, a loopback address or HOST (any IP address when HOST is empty or 0.0.0.0) are served"},
		&cli.StringFlag{Name: "metrics-token", EnvVars: []string{"LEASEPOOL_METRICS_TOKEN"},
			Usage: "require Authorization: Bearer TOKEN on /metrics"},
		&cli.StringFlag{Name: "metrics-store-gauges", Value: storeGaugesElected,
			Usage: "which workers export the store's gauges, the cluster's (leasepool_tasks, leasepool_workers_live, leasepool_flows, " +
				"leasepool_rollout_*, leasepool_store_up): " + storeGaugesElected + ", one worker at a time (the elected one, which runs " +
				"the cluster's duties; the others leave them out, so scrapes read the store once per cluster, not once per worker); or " +
				storeGaugesEvery + ", each worker, reading the store at most every 5 s whoever scrapes it (" +
				storeGaugesBookkeeper + ": the former name of " + storeGaugesElected + ")"},
	}
}

// The values of --metrics-store-gauges. storeGaugesBookkeeper is the
// former name of storeGaugesElected, still accepted so that scripts
// written with it keep working.
const (
	storeGaugesElected    = "elected"
	storeGaugesEvery      = "every"
	storeGaugesBookkeeper = "bookkeeper"
)

// storeGaugesWhen checks --metrics-store-gauges: with elected, the
// store's gauges are read while elected says so; with every, always
// (nil).
func storeGaugesWhen(c *cli.Context, elected func() bool) (func() bool, error) {
	switch v := c.String("metrics-store-gauges"); v {
	case storeGaugesElected, storeGaugesBookkeeper:
		return elected, nil
	case storeGaugesEvery:
		return nil, nil
	default:
		return nil, badFlag(c, "metrics-store-gauges", "%q: want %s or %s", v, storeGaugesElected, storeGaugesEvery)
	}
}

// metricsRegistry is a registry with the Go runtime's and the process's
// collectors and the store's gauges, read from s at most every 5 s, and
// only while elected says so (always when nil).
func metricsRegistry(s task.Store, elected func() bool) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	col, err := metrics.NewStoreCollector(metrics.StoreConfig{
		Stats: s, Registry: s, Now: s.Now, Logger: slog.Default(), Elected: elected,
		Flows: metrics.FlowCounterFunc(func(ctx context.Context) (map[string]int64, error) {
			fs, err := flow.List(ctx, s, flow.ListQuery{})
			n := map[string]int64{}
			for _, f := range fs {
				n[string(f.State)]++
			}
			return n, err
		}),
	})
	if err != nil {
		return nil, err
	}
	if err := reg.Register(col); err != nil {
		return nil, err
	}
	if err := registerRolloutMetrics(reg, s, elected); err != nil {
		return nil, err
	}
	if w, ok := s.(interface{ WriteStats() sqlitestore.WriteStats }); ok {
		counts := func() metrics.WriteCounts { return metrics.WriteCounts(w.WriteStats()) }
		if err := reg.Register(metrics.NewStoreWrites(counts)); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// listenMetrics checks --metrics-addr and listens on it, so a bad or busy
// address fails the worker before it claims anything; nil when not given.
func listenMetrics(c *cli.Context) (net.Listener, error) {
	addr := c.String("metrics-addr")
	if addr == "" {
		// A token in the environment may be shared by serve and workers
		// that expose no metrics: only a typed flag is a mistake.
		if c.IsSet("metrics-token") && os.Getenv("LEASEPOOL_METRICS_TOKEN") != c.String("metrics-token") {
			return nil, badFlag(c, "metrics-token", "needs --metrics-addr")
		}
		if c.IsSet("metrics-store-gauges") {
			return nil, badFlag(c, "metrics-store-gauges", "needs --metrics-addr")
		}
		return nil, nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, badFlag(c, "metrics-addr", "%q: want HOST:PORT: %v", addr, err)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr: %w", err)
	}
	return l, nil
}

// metricsHandler is a worker's /metrics behind web.Guard: the Host check
// (without --metrics-token: loopback names, and the --metrics-addr host,
// or any IP address when it listens on every interface) and
// --metrics-token; anything but GET /metrics is 404.
func metricsHandler(c *cli.Context, reg prometheus.Gatherer) (http.Handler, error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics.Handler(reg, ""))
	cfg := web.Config{Token: c.String("metrics-token")}
	if cfg.Token == "" {
		// A scraper on another machine names the worker by the address
		// it listens on, or by any address when it listens on every
		// interface; a name needs the token.
		cfg.AllowedHosts = listenHosts(c.String("metrics-addr"))
		cfg.AllowAddressHosts = cfg.AllowedHosts == nil
	}
	return web.Guard(cfg, mux)
}

// startWorkerMetrics serves the worker's metrics, its store traffic among
// them, on --metrics-addr until stop is called; with no address it returns
// a nil observer. elected says whether the worker is the one its cluster
// elected (worker.Worker.Elected), for --metrics-store-gauges.
func startWorkerMetrics(c *cli.Context, s task.Store, traffic *metrics.StoreTraffic, isElected func() bool) (obs *metrics.Metrics, stop func(), err error) {
	elected, err := storeGaugesWhen(c, isElected)
	if err != nil {
		return nil, nil, err
	}
	l, err := listenMetrics(c)
	if err != nil || l == nil {
		return nil, func() {}, err
	}
	warnSecretFlag(c, "metrics-token", "LEASEPOOL_METRICS_TOKEN", false)
	reg, err := metricsRegistry(s, elected)
	if err == nil {
		err = reg.Register(traffic)
	}
	if err == nil {
		obs, err = metrics.New(reg)
	}
	var h http.Handler
	if err == nil {
		h, err = metricsHandler(c, reg)
	}
	if err != nil {
		l.Close()
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.Context))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := serveUntilDone(ctx, l, h, make(chan struct{})); err != nil {
			slog.Error("metrics server", slog.Any("err", err))
		}
	}()
	return obs, func() { cancel(); <-done }, nil
}
