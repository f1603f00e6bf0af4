package mqttdev

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// Broker is an embedded MQTT broker (mochi-mqtt) for tests, demos and the
// single edge box: anonymous, loopback TCP, sessions and retained messages
// in memory only (a restart loses them; clients of this package subscribe
// again and republish on reconnect).
type Broker struct {
	srv  *mqtt.Server
	addr string
	once sync.Once
}

// StartBroker starts a broker listening on addr, which must be a loopback
// address ("127.0.0.1:0" picks a free port). ctx bounds the start only.
// logger may be nil.
func StartBroker(ctx context.Context, addr string, logger *slog.Logger) (*Broker, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("broker addr: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("broker addr: %q is not a loopback address", addr)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv := mqtt.New(&mqtt.Options{InlineClient: true, Logger: logger})
	if err := srv.AddHook(new(auth.AllowHook), nil); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	tcp := listeners.NewTCP(listeners.Config{ID: "tcp", Address: addr})
	if err := srv.AddListener(tcp); err != nil {
		return nil, fmt.Errorf("broker listen %s: %w", addr, err)
	}
	if err := srv.Serve(); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("broker: %w", err)
	}
	return &Broker{srv: srv, addr: tcp.Address()}, nil
}

// Addr is the address listened on, e.g. 127.0.0.1:41234.
func (b *Broker) Addr() string { return b.addr }

// URL is the broker URL for clients, e.g. tcp://127.0.0.1:41234.
func (b *Broker) URL() string { return "tcp://" + b.addr }

// Close disconnects every client and stops listening. Clients see the
// connection drop (their wills are not sent). It may be called twice.
func (b *Broker) Close() error {
	b.once.Do(func() { _ = b.srv.Close() })
	return nil
}
