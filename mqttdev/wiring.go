// Wiring a worker process for device tasks: which broker, who hosts it,
// and the order things start and stop in.

package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	neturl "net/url"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/internal/credential"
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
	//
	// With no Username nor client certificate, a worker logs in to the
	// embedded broker, or any broker on a loopback tcp:// address, as
	// credential.WorkerUser(WorkerID) with the cluster's worker secret
	// from Store (made on first use): no setup between processes
	// sharing the store. A broker elsewhere gets what Client says.
	Client ClientConfig
	// EmbeddedBroker is the loopback address of the embedded broker; empty
	// means DefaultEmbeddedBroker.
	EmbeddedBroker string
	// EmbeddedBrokerLease is the hosting lease; zero means
	// broker.DefaultLease.
	EmbeddedBrokerLease time.Duration
	// EmbeddedBrokerAnonymous makes the embedded broker, when hosted
	// here, let in every client with every right (broker.Config.Anonymous):
	// for a lab only. Otherwise it checks the device credentials and the
	// worker secret in Store.
	EmbeddedBrokerAnonymous bool
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

	// stopIndex stops IndexInventory, started by Wire; indexed is closed
	// when it returned.
	stopIndex context.CancelFunc
	indexed   chan struct{}
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
		client.ClientID = broker.ClientID(credential.WorkerUser(cfg.WorkerID), "")
	}
	if client.Username == "" && client.CertFile == "" && (w.Host != nil || LoopbackBroker(client.BrokerURL)) {
		secret, err := credential.WorkerSecret(ctx, cfg.Store)
		if err != nil {
			_ = w.Stop(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("mqtt worker credential: %w", err)
		}
		client.Username, client.Password = credential.WorkerUser(cfg.WorkerID), secret
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
	w.indexInventory(ctx, cfg)
	return w, nil
}

// indexInventory runs IndexInventory once, in the background: a store
// written by an older leasepool has inventory entries without terms,
// which every selection decodes until they have some. Every process
// wired does it; their writes are compare-and-sets, the losers' skipped.
func (w *Wiring) indexInventory(ctx context.Context, cfg WireConfig) {
	ctx, w.stopIndex = context.WithCancel(ctx)
	w.indexed = make(chan struct{})
	go func() {
		defer close(w.indexed)
		n, err := IndexInventory(ctx, cfg.Store)
		switch {
		case err != nil && ctx.Err() == nil:
			cfg.Logger.Warn("device inventory: giving entries their index terms", "indexed", n, "err", err)
		case n > 0:
			cfg.Logger.Info("device inventory: gave entries stored before index terms their terms", "indexed", n)
		}
	}()
}

func startHost(ctx context.Context, cfg WireConfig) (*broker.Host, error) {
	addr := cfg.EmbeddedBroker
	if addr == "" {
		addr = DefaultEmbeddedBroker
	}
	host, err := broker.NewHost(broker.HostConfig{
		Store: cfg.Store, Addr: addr, WorkerID: cfg.WorkerID,
		Lease: cfg.EmbeddedBrokerLease, Logger: cfg.Logger, BrokerLogger: cfg.BrokerLogger,
		Credentials: credential.Source(cfg.Store), Anonymous: cfg.EmbeddedBrokerAnonymous,
	})
	if err == nil {
		err = host.Start(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("embedded broker %s: %w", addr, err)
	}
	return host, nil
}

// LoopbackBroker reports whether url is a plain tcp:// (or mqtt://)
// broker on a loopback address with no user in the URL: the embedded
// broker, or one on this machine, where a worker logs in with the
// cluster's worker secret unless told otherwise.
func LoopbackBroker(url string) bool {
	u, err := neturl.Parse(url)
	if err != nil || (u.Scheme != "tcp" && u.Scheme != "mqtt") || u.User != nil {
		return false
	}
	host := u.Hostname()
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// Stop stops the handler, then the broker host: that closes the broker if
// hosted here and releases the lease, so another process takes over within
// a third of it. It may be called again; ctx bounds the wait.
func (w *Wiring) Stop(ctx context.Context) error {
	var errs []error
	if w.stopIndex != nil {
		w.stopIndex()
		select {
		case <-w.indexed:
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("device inventory index: %w", ctx.Err()))
		}
	}
	if w.Handler != nil {
		errs = append(errs, w.Handler.Stop(ctx))
	}
	if w.Host != nil {
		errs = append(errs, w.Host.Stop(ctx))
	}
	return errors.Join(errs...)
}
