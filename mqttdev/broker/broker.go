// Package broker runs the embedded MQTT broker of leasepool's device side:
// Broker, one mochi-mqtt server on a loopback address for tests, demos and
// the single edge box, and Host, which keeps one such broker running for a
// group of processes sharing a task store, moving it to another process
// when its host dies.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	mqtt "github.com/leasepool/leasepool/internal/mochi"
	"github.com/leasepool/leasepool/internal/mochi/hooks/auth"
	"github.com/leasepool/leasepool/internal/mochi/listeners"

	"github.com/leasepool/leasepool/internal/lifecycle"
)

// Config configures a Broker.
type Config struct {
	// Addr is the loopback address to listen on ("127.0.0.1:0" picks a
	// free port). Required.
	Addr string
	// Logger gets the broker's logs; nil discards them.
	Logger *slog.Logger
	// AuthLogger gets the refused logins and topics, the connections
	// closed for a revoked credential, and the warning of an anonymous
	// broker; nil means Logger.
	AuthLogger *slog.Logger
	// Credentials decide who may connect (see Broker). Required unless
	// Anonymous.
	Credentials Credentials
	// Anonymous lets every client in, with every right: anyone who can
	// reach Addr may pose as any device or worker. For a lab only; the
	// broker logs a warning when it starts.
	Anonymous bool
	// Refresh is how often the credentials are read again: a connection
	// whose credential was revoked or rotated is closed within it. Zero
	// means DefaultRefresh.
	Refresh time.Duration
	// TLS, when set, makes the listener speak TLS with its certificate.
	// With ClientAuth tls.RequireAndVerifyClientCert (and ClientCAs), a
	// client logs in by its certificate instead of a password: the
	// certificate's common name is the device id (a device must still
	// have a credential in the store, which revoking removes) or
	// WorkerUserPrefix and a worker id.
	TLS *tls.Config
}

// DefaultRefresh is Config.Refresh's default.
const DefaultRefresh = 2 * time.Second

func (c *Config) validate() error {
	if err := checkLoopback(c.Addr); err != nil {
		return fmt.Errorf("addr: %w", err)
	}
	if c.Credentials == nil && !c.Anonymous {
		return errors.New("credentials: required unless anonymous clients are allowed")
	}
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil {
		return errors.New("tls: no certificate")
	}
	if c.Refresh < 0 {
		return fmt.Errorf("refresh: %s is negative", c.Refresh)
	}
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.AuthLogger == nil {
		c.AuthLogger = c.Logger
	}
	return nil
}

// Broker is an embedded MQTT broker (mochi-mqtt) on loopback TCP, with
// sessions and retained messages in memory only (a restart loses them;
// clients of leasepool subscribe again and republish on reconnect).
//
// Unless Config.Anonymous, a client logs in with a user name and password
// checked against Config.Credentials, and may use only the topics of its
// role (the first topic level, the prefix, is free):
//
//   - a device (user name = device id, password = its secret) publishes
//     <prefix>/devices/<its id>/status, ack and result (its will too),
//     and subscribes to <prefix>/devices/<its id>/cmd;
//   - a worker (user name WorkerUserPrefix + worker id, password = the
//     cluster's worker secret) publishes <prefix>/devices/<id>/cmd and
//     subscribes to <prefix>/devices/<id or +>/status, ack and result.
//
// Anything else is refused: a connection without a known credential, a
// will on another topic, a client id that another user's session holds,
// a publish or subscribe outside the rights.
type Broker struct {
	cfg  Config
	life lifecycle.Runner

	mu    sync.Mutex
	srv   *mqtt.Server
	auth  *authHook
	bound string
}

// New checks cfg and returns a broker; Start serves.
func New(cfg Config) (*Broker, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	return &Broker{cfg: cfg}, nil
}

// Listen is New and Start in one call; ctx bounds the start only.
func Listen(ctx context.Context, cfg Config) (*Broker, error) {
	b, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := b.Start(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%q is not a loopback address", addr)
	}
	return nil
}

// Start binds the address and serves. ctx bounds the start only. A second
// call returns lifecycle.ErrStarted.
func (b *Broker) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	run, err := b.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	srv := mqtt.New(&mqtt.Options{InlineClient: true, Logger: b.cfg.Logger})
	var hook *authHook
	if b.cfg.Anonymous {
		if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	} else {
		hook = newAuthHook(srv, b.cfg.Credentials, b.cfg.AuthLogger)
		if err := srv.AddHook(hook, nil); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: b.cfg.Addr, TLSConfig: b.cfg.TLS})
	if err := srv.AddListener(tcp); err != nil {
		return fmt.Errorf("broker listen %s: %w", b.cfg.Addr, err)
	}
	if err := srv.Serve(); err != nil {
		_ = srv.Close()
		return fmt.Errorf("broker: %w", err)
	}
	if b.cfg.Anonymous {
		b.cfg.AuthLogger.Warn("MQTT broker allows anonymous clients: anyone who reaches it can pose as any device or worker",
			slog.String("addr", tcp.Address()))
	}
	b.mu.Lock()
	b.srv, b.auth, b.bound = srv, hook, tcp.Address()
	b.mu.Unlock()
	if hook != nil {
		b.life.Go(func() { hook.refreshLoop(run, b.cfg.Refresh) })
	}
	return nil
}

// Stop disconnects every client and stops listening; clients see the
// connection drop (their wills are not sent). It may be called again; ctx
// bounds the wait.
func (b *Broker) Stop(ctx context.Context) error {
	return b.life.Stop(ctx, func() {
		if srv := b.Server(); srv != nil {
			_ = srv.Close()
		}
	})
}

// Close is Stop without a bound on the wait, for defer and io.Closer.
func (b *Broker) Close() error { return b.Stop(context.Background()) }

// Addr is the address listened on, e.g. 127.0.0.1:41234; empty before a
// successful Start.
func (b *Broker) Addr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bound
}

// URL is the broker URL for clients, e.g. tcp://127.0.0.1:41234, or
// ssl://... with TLS.
func (b *Broker) URL() string {
	if b.cfg.TLS != nil {
		return "ssl://" + b.Addr()
	}
	return "tcp://" + b.Addr()
}

// Server is the mochi server, for inline clients (tests that play a
// device without a network client); nil before a successful Start.
func (b *Broker) Server() *mqtt.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv
}
