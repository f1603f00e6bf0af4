package main

// `leasepool serve`: the HTTP API (package web) on the --store, until
// interrupted.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "serve the dashboard (/), the HTTP API (/api/v1) and Prometheus metrics (/metrics) on the --store",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "HOST:PORT to listen on; a non-loopback host needs --token or --basic-auth"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"LEASEPOOL_TOKEN"}, Usage: "require Authorization: Bearer TOKEN on every request (or --basic-auth)"},
			&cli.StringFlag{Name: "basic-auth", EnvVars: []string{"LEASEPOOL_BASIC_AUTH"}, Usage: "USER:PASSWORD a browser logs in with (HTTP basic auth; use HTTPS in front off loopback)"},
			&cli.BoolFlag{Name: "read-only", Usage: "refuse every write (403); the store is opened read-only"},
		},
		Action: runServe,
	}
}

// checkListen refuses an address that does not parse, and a non-loopback
// one without a token or basic auth: anyone who can reach it could pause
// the cluster.
func checkListen(c *cli.Context, addr string, authed bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return badFlag(c, "listen", "%q: want HOST:PORT: %v", addr, err)
	}
	if authed || isLoopback(host) {
		return nil
	}
	return badUsage(c, "--listen %s is not a loopback address: give --token (or LEASEPOOL_TOKEN) or --basic-auth to serve on it", addr)
}

// basicAuth splits --basic-auth USER:PASSWORD.
func basicAuth(c *cli.Context) (user, password string, err error) {
	v := c.String("basic-auth")
	if v == "" {
		return "", "", nil
	}
	user, password, ok := strings.Cut(v, ":")
	if !ok || user == "" || password == "" {
		return "", "", badFlag(c, "basic-auth", "want USER:PASSWORD, both non-empty")
	}
	return user, password, nil
}

// isLoopback reports whether host only ever names this machine. An empty
// host listens on every interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func runServe(c *cli.Context) error {
	if c.NArg() > 0 {
		return badUsage(c, "serve takes no arguments, got %q", c.Args().First())
	}
	addr, token := c.String("listen"), c.String("token")
	user, password, err := basicAuth(c)
	if err != nil {
		return err
	}
	if err := checkListen(c, addr, token != "" || user != ""); err != nil {
		return err
	}
	open := func() (task.Store, error) { return openStore(c, false) }
	if c.Bool("read-only") {
		open = func() (task.Store, error) { return openStoreReadOnly(c) }
	}
	s, err := open()
	if err != nil {
		return err
	}
	defer s.Close()
	stop := make(chan struct{})
	cfg := web.Config{Store: s, Token: token, BasicUser: user, BasicPassword: password,
		ReadOnly: c.Bool("read-only"), Logger: slog.Default(), Stop: stop}
	h, err := web.NewHandler(cfg)
	if err != nil {
		return err
	}
	// The store's gauges on /metrics, behind the same login.
	reg, err := metricsRegistry(s)
	if err != nil {
		return err
	}
	h = withMetrics(h, reg, cfg)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	return serveUntilDone(c.Context, l, h, stop)
}

// serveUntilDone serves h on l until ctx ends, then closes stop (ending
// the event streams, which never go idle) and lets requests in flight
// finish for a few seconds.
func serveUntilDone(ctx context.Context, l net.Listener, h http.Handler, stop chan struct{}) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(func() { close(stop) })
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	slog.Info("serving the HTTP API and the dashboard", "url", "http://"+l.Addr().String()+"/")
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("serve: shut down: %w", err)
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}
