// Wiring a worker process for device tasks: which broker, who hosts it,
// and the order things start and stop in.

package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/redact"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/task"
)

// DefaultEmbeddedBroker is WireConfig.EmbeddedBroker's default.
const DefaultEmbeddedBroker = "127.0.0.1:1883"

// WireConfig configures Wire.
type WireConfig struct {
	// Mux gets the Handler registered for Kind. Required.
	Mux *consumer.Mux
	// Store holds the embedded broker's hosting lease and the device
	// states every worker and admin tool reads. Required.
	Store task.Store
	// WorkerID is the worker's id: the MQTT client id is
	// "leasepool-worker-<WorkerID>" unless Client.ClientID is set, and the
	// broker hosting lease is held under it. Required.
	WorkerID string
	// Client says how to reach the broker. An empty BrokerURL means the
	// embedded broker at EmbeddedBroker, hosted by one of the processes
	// sharing Store at a time (broker.Host): every process runs the
	// hosting supervisor, and another takes over when the host dies.
	Client ClientConfig
	// EmbeddedBroker is the loopback address of the embedded broker; empty
	// means DefaultEmbeddedBroker.
	EmbeddedBroker string
	// EmbeddedBrokerLease is the hosting lease; zero means
	// broker.DefaultLease.
	EmbeddedBrokerLease time.Duration
	// Prefix is the first topic level; empty means DefaultPrefix.
	Prefix string
	// Logger gets the handler's and the host's logs; nil discards them.
	Logger *slog.Logger
	// Observer is told how each device command ended (metrics); nil: none.
	Observer CommandObserver
	// BrokerLogger gets the embedded broker's own logs; nil discards them.
	// The broker logs every client that drops as a warning: an error level
	// filter keeps what matters.
	BrokerLogger *slog.Logger
}

// Wiring is what Wire started. Stop it after the consumer has stopped: its
// handlers may be talking to devices.
type Wiring struct {
	// Handler runs the device tasks; it is registered on the mux.
	Handler *Handler
	// Host hosts the embedded broker by turns; nil with an external one.
	Host *broker.Host
}

// Wire makes a worker process run device tasks: it starts the embedded
// broker's hosting supervisor when no broker URL is given, starts a
// Handler connected to the broker (retrying until ctx ends) with device
// states kept in the store, and registers it on the mux. On error nothing
// is left running.
func Wire(ctx context.Context, cfg WireConfig) (*Wiring, error) {
	if cfg.Mux == nil || cfg.Store == nil || cfg.WorkerID == "" {
		return nil, errors.New("mqttdev wire: mux, store and worker id are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	w := &Wiring{}
	client := cfg.Client
	if client.BrokerURL == "" {
		host, err := startHost(ctx, cfg)
		if err != nil {
			return nil, err
		}
		w.Host, client.BrokerURL = host, host.URL()
	}
	if client.ClientID == "" {
		client.ClientID = "leasepool-worker-" + cfg.WorkerID
	}
	h, err := NewHandler(HandlerConfig{
		ClientConfig: client,
		Prefix:       cfg.Prefix,
		Logger:       cfg.Logger,
		DeviceState:  StoreStates(cfg.Store),
		Inventory:    StoreInventory(cfg.Store),
		Observer:     cfg.Observer,
	})
	if err == nil {
		err = h.Start(ctx)
	}
	if err != nil {
		_ = w.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("mqtt %s: %w", redact.URL(client.BrokerURL), redact.Error(err, []string{client.BrokerURL}))
	}
	w.Handler = h
	cfg.Mux.Register(Kind, h)
	return w, nil
}

func startHost(ctx context.Context, cfg WireConfig) (*broker.Host, error) {
	addr := cfg.EmbeddedBroker
	if addr == "" {
		addr = DefaultEmbeddedBroker
	}
	host, err := broker.NewHost(broker.HostConfig{
		Store: cfg.Store, Addr: addr, WorkerID: cfg.WorkerID,
		Lease: cfg.EmbeddedBrokerLease, Logger: cfg.Logger, BrokerLogger: cfg.BrokerLogger,
	})
	if err == nil {
		err = host.Start(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("embedded broker %s: %w", addr, err)
	}
	return host, nil
}

// Stop stops the handler, then the broker host: that closes the broker if
// hosted here and releases the lease, so another process takes over within
// a third of it. It may be called again; ctx bounds the wait.
func (w *Wiring) Stop(ctx context.Context) error {
	var errs []error
	if w.Handler != nil {
		errs = append(errs, w.Handler.Stop(ctx))
	}
	if w.Host != nil {
		errs = append(errs, w.Host.Stop(ctx))
	}
	return errors.Join(errs...)
}
