// Package broker runs the embedded MQTT broker of leasepool's device side:
// Broker, one mochi-mqtt server on a loopback address for tests, demos and
// the single edge box, and Host, which keeps one such broker running for a
// group of processes sharing a task store, moving it to another process
// when its host dies.
package broker

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"

	"github.com/leasepool/leasepool/internal/lifecycle"
)

// Broker is an embedded MQTT broker (mochi-mqtt): anonymous, loopback TCP,
// sessions and retained messages in memory only (a restart loses them;
// clients of leasepool subscribe again and republish on reconnect).
type Broker struct {
	addr   string
	logger *slog.Logger
	life   lifecycle.Runner

	mu    sync.Mutex
	srv   *mqtt.Server
	bound string
}

// New checks addr, which must be a loopback address ("127.0.0.1:0" picks a
// free port), and returns a broker; Start serves. logger may be nil.
func New(addr string, logger *slog.Logger) (*Broker, error) {
	if err := checkLoopback(addr); err != nil {
		return nil, fmt.Errorf("broker addr: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Broker{addr: addr, logger: logger}, nil
}

// Listen is New and Start in one call; ctx bounds the start only.
func Listen(ctx context.Context, addr string, logger *slog.Logger) (*Broker, error) {
	b, err := New(addr, logger)
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
	if _, err := b.life.Start(ctx); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	srv := mqtt.New(&mqtt.Options{InlineClient: true, Logger: b.logger})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: b.addr})
	if err := srv.AddListener(tcp); err != nil {
		return fmt.Errorf("broker listen %s: %w", b.addr, err)
	}
	if err := srv.Serve(); err != nil {
		_ = srv.Close()
		return fmt.Errorf("broker: %w", err)
	}
	b.mu.Lock()
	b.srv, b.bound = srv, tcp.Address()
	b.mu.Unlock()
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

// URL is the broker URL for clients, e.g. tcp://127.0.0.1:41234.
func (b *Broker) URL() string { return "tcp://" + b.Addr() }

// Server is the mochi server, for inline clients (tests that play a
// device without a network client); nil before a successful Start.
func (b *Broker) Server() *mqtt.Server {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.srv
}
