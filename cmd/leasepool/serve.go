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
	"net/url"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/metrics"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/web"
)

func serveCommand() *cli.Command {
	return &cli.Command{
		Name:  "serve",
		Usage: "serve the dashboard (/), the HTTP API (/api/v1) and Prometheus metrics (/metrics) on the --store",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:8080", Usage: "HOST:PORT to listen on; a non-loopback host needs a credential (--token, --basic-auth, --read-token or --read-basic-auth)"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"LEASEPOOL_TOKEN"}, Usage: "require Authorization: Bearer TOKEN on every request (or --basic-auth); prefer the environment variable: flags show in ps"},
			&cli.StringFlag{Name: "basic-auth", EnvVars: []string{"LEASEPOOL_BASIC_AUTH"}, Usage: "USER:PASSWORD a browser logs in with (HTTP basic auth; use HTTPS in front off loopback)"},
			&cli.StringFlag{Name: "read-token", EnvVars: []string{"LEASEPOOL_READ_TOKEN"}, Usage: "a second bearer token that may only read: every GET (API, dashboard, events, /metrics); writes get 403"},
			&cli.StringFlag{Name: "read-basic-auth", EnvVars: []string{"LEASEPOOL_READ_BASIC_AUTH"}, Usage: "USER:PASSWORD of a basic-auth login that may only read"},
			&cli.StringFlag{Name: "worker-token", EnvVars: []string{"LEASEPOOL_WORKER_TOKEN"}, Usage: "a bearer token for remote workers: it may only register, claim, renew and finish (docs/http-api.md#remote-workers)"},
			&cli.StringFlag{Name: "worker-kinds", EnvVars: []string{"LEASEPOOL_WORKER_KINDS"}, Usage: "KIND,KIND: the only kinds --worker-token may claim, renew and finish (default: every kind)"},
			&cli.StringFlag{Name: "public-url", EnvVars: []string{"LEASEPOOL_PUBLIC_URL"}, Usage: "URL clients reach this server by (behind a proxy or a DNS name); its host is served besides localhost, and any other Host header gets 421"},
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

// basicAuth splits the USER:PASSWORD of flag (--basic-auth,
// --read-basic-auth).
func basicAuth(c *cli.Context, flag string) (user, password string, err error) {
	v := c.String(flag)
	if v == "" {
		return "", "", nil
	}
	user, password, ok := strings.Cut(v, ":")
	if !ok || user == "" || password == "" {
		return "", "", badFlag(c, flag, "want USER:PASSWORD, both non-empty")
	}
	return user, password, nil
}

// allowedHosts is what the Host check serves besides loopback names: the
// host of --public-url, and then the --listen host when it names one
// address (not every interface). Nil without --public-url: with
// credentials any Host is served, and without them --listen is loopback.
func allowedHosts(c *cli.Context, listen string) ([]string, error) {
	raw := c.String("public-url")
	if raw == "" {
		return nil, nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return nil, badFlag(c, "public-url", "%q: want http://HOST[:PORT] or https://HOST[:PORT]", raw)
	}
	hosts := []string{strings.ToLower(u.Hostname())}
	return append(hosts, listenHosts(listen)...), nil
}

// listenHosts is the host of a HOST:PORT listen address when it names one
// address: none for every interface ("", 0.0.0.0, ::).
func listenHosts(addr string) []string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return nil
	}
	return []string{strings.ToLower(host)}
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
	addr, token, readToken := c.String("listen"), c.String("token"), c.String("read-token")
	user, password, err := basicAuth(c, "basic-auth")
	if err != nil {
		return err
	}
	readUser, readPassword, err := basicAuth(c, "read-basic-auth")
	if err != nil {
		return err
	}
	workerToken := c.String("worker-token")
	var workerKinds []string
	if k := c.String("worker-kinds"); k != "" {
		if workerToken == "" {
			return badFlag(c, "worker-kinds", "needs --worker-token")
		}
		for i, kind := range strings.Split(k, ",") {
			kind = strings.TrimSpace(kind)
			if err := task.ValidateName(fmt.Sprintf("kind %d", i+1), kind); err != nil {
				return badFlag(c, "worker-kinds", "%v", err)
			}
			workerKinds = append(workerKinds, kind)
		}
	}
	if err := checkListen(c, addr, token != "" || user != "" || readToken != "" || readUser != ""); err != nil {
		return err
	}
	hosts, err := allowedHosts(c, addr)
	if err != nil {
		return err
	}
	switch {
	case readToken != "" && readToken == token:
		return badFlag(c, "read-token", "must differ from --token")
	case workerToken != "" && (workerToken == token || workerToken == readToken):
		return badFlag(c, "worker-token", "must differ from --token and --read-token")
	case readUser != "" && readUser == user && readPassword == password:
		return badFlag(c, "read-basic-auth", "must differ from --basic-auth")
	}
	warnSecretFlag(c, "token", "LEASEPOOL_TOKEN", false)
	warnSecretFlag(c, "basic-auth", "LEASEPOOL_BASIC_AUTH", false)
	warnSecretFlag(c, "read-token", "LEASEPOOL_READ_TOKEN", false)
	warnSecretFlag(c, "read-basic-auth", "LEASEPOOL_READ_BASIC_AUTH", false)
	warnSecretFlag(c, "worker-token", "LEASEPOOL_WORKER_TOKEN", false)
	open := func() (task.Store, error) { return openStore(c, false) }
	if c.Bool("read-only") {
		open = func() (task.Store, error) { return openStoreReadOnly(c) }
	}
	s, err := open()
	if err != nil {
		return err
	}
	defer s.Close()
	// The store's gauges on /metrics, behind the same guard.
	reg, err := metricsRegistry(s, nil)
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	cfg := web.Config{Store: s, Token: token, BasicUser: user, BasicPassword: password,
		ReadToken: readToken, ReadBasicUser: readUser, ReadBasicPassword: readPassword, AllowedHosts: hosts,
		WorkerToken: workerToken, WorkerKinds: workerKinds,
		ReadOnly: c.Bool("read-only"), Metrics: metrics.Handler(reg, ""), Logger: slog.Default(), Stop: stop}
	h, err := web.NewHandler(cfg)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	return serveUntilDone(c.Context, l, h, stop)
}

// serveUntilDone serves h on l with web.NewServer's connection limits
// until ctx ends, then closes stop (ending the event streams, which never
// go idle) and lets requests in flight finish for a few seconds.
func serveUntilDone(ctx context.Context, l net.Listener, h http.Handler, stop chan struct{}) error {
	srv := web.NewServer(h, web.ServerLimits{})
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
