// Host: the singleton that keeps one embedded broker up for a group of
// processes.

package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/leasepool/leasepool/internal/singleton"
	"github.com/leasepool/leasepool/task"
)

// DefaultLease is how long a Host's hosting lease lasts
// without renewal, unless configured.
const DefaultLease = 3 * time.Second

// LockKey is the lock key, in the store's lock table's namespace
// task.LockSingleton, of the lease to host the embedded broker on addr.
func LockKey(addr string) string { return "mqtt-broker:" + addr }

// HostConfig configures a Host.
type HostConfig struct {
	// Store holds the hosting lease in its lock table (namespace
	// task.LockSingleton, key LockKey(Addr)). Required.
	Store task.Store
	// Addr is the loopback address every host listens on, e.g.
	// 127.0.0.1:1883. Required; port 0 is refused (all hosts must agree).
	Addr string
	// WorkerID names this process in the lease holder, next to a random
	// instance id made per Host. Empty means host-pid.
	WorkerID string
	// Lease is how long the hosting lease lasts without renewal: after the
	// host dies, another takes over within about one lease. It is renewed
	// every Lease/3. Zero means DefaultLease; at least 300ms.
	Lease time.Duration
	// Logger gets hosting changes; nil discards.
	Logger *slog.Logger
	// BrokerLogger is given to the broker itself; nil discards.
	BrokerLogger *slog.Logger
	// Credentials, Anonymous and Refresh are the broker's (see Config):
	// Credentials are required unless Anonymous.
	Credentials Credentials
	Anonymous   bool
	Refresh     time.Duration
}

func (c *HostConfig) validate() error {
	if c.Store == nil {
		return errors.New("store: required")
	}
	if c.Credentials == nil && !c.Anonymous {
		return errors.New("credentials: required unless anonymous clients are allowed")
	}
	host, port, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("addr: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("addr: %q is not a loopback address", c.Addr)
	}
	if port == "0" || port == "" {
		return fmt.Errorf("addr: %q needs a fixed port: every host listens on the same address", c.Addr)
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.Lease < 300*time.Millisecond {
		return fmt.Errorf("lease: %s is below 300ms", c.Lease)
	}
	if c.WorkerID == "" {
		h, _ := os.Hostname()
		c.WorkerID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Host keeps an embedded Broker running on one address
// for a group of processes sharing a store, surviving the death of the
// process that runs it. Hosting is a singleton (internal/singleton) on the
// lock key LockKey(Addr), apart from the election of the worker that runs
// the cluster's duties: only processes that run device tasks with the
// embedded broker stand for it, and a takeover restarts the device plane,
// so it moves only when its own host fails
// (docs/decisions/0015-one-elector-and-a-broker-lease.md). Every such
// process runs a Host; the one holding the
// lease runs the broker and renews the lease every Lease/3; the others try
// to take the lease when it runs out (they sleep until the holder's lease
// ends, at most Lease/3 at a time) and, once they hold it, start the
// broker on the same address, retrying the bind every 100ms until the old
// socket is gone.
//
// At most one broker serves: a holder that cannot renew (the store says
// another holder took the lease, or the store does not answer before its
// lease, less a tenth, runs out in store time) closes its broker, and a
// new holder is granted the lease only after the old lease has ended. A
// host that was frozen past its lease (SIGSTOP, a long pause) still holds
// the listening socket when it wakes: the new holder's binds fail until
// the old one notices its lost lease and closes.
//
// The broker keeps sessions and retained messages in memory only, so a
// takeover loses them: this package's clients resubscribe on every
// connection, devices republish their status, and the handler republishes
// commands still waiting for an ack or result.
type Host struct {
	cfg    HostConfig
	runner *singleton.Runner

	mu     sync.Mutex
	broker *Broker
}

// NewHost checks cfg and returns a host; Start runs it.
func NewHost(cfg HostConfig) (*Host, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("broker host: %w", err)
	}
	h := &Host{cfg: cfg}
	r, err := singleton.New(singleton.Config{
		Store: cfg.Store, Key: LockKey(cfg.Addr), HolderID: cfg.WorkerID, Lease: cfg.Lease,
		Run: h.host, Logger: cfg.Logger.With(slog.String("addr", cfg.Addr)),
	})
	if err != nil {
		return nil, fmt.Errorf("broker host: %w", err)
	}
	h.runner = r
	return h, nil
}

// URL is the broker URL for clients: tcp://Addr, whichever process hosts.
func (h *Host) URL() string { return "tcp://" + h.cfg.Addr }

// Holder is the lock holder this host writes when it hosts.
func (h *Host) Holder() task.Holder { return h.runner.Holder() }

// Hosting reports whether this process runs the broker now.
func (h *Host) Hosting() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.broker != nil
}

// Start starts the supervisor goroutine; it returns at once. ctx's values
// are kept, its cancellation is not: Stop ends the supervisor. A second
// call returns lifecycle.ErrStarted.
func (h *Host) Start(ctx context.Context) error {
	if err := h.runner.Start(ctx); err != nil {
		return fmt.Errorf("broker host: %w", err)
	}
	return nil
}

// Stop closes the broker if this process hosts it, releases the lease (so
// another process takes over within Lease/3), and ends the supervisor. It
// returns when that is done or ctx ends. It may be called again.
func (h *Host) Stop(ctx context.Context) error { return h.stop(ctx, true) }

// stop with release false leaves the lease to run out, as a crash would.
func (h *Host) stop(ctx context.Context, release bool) error {
	if !release {
		return h.runner.Abandon(ctx)
	}
	return h.runner.Stop(ctx)
}

const brokerBindRetry = 100 * time.Millisecond

// host runs while this process holds the lease: it binds the broker,
// retrying while the address is still taken (the old host's socket, most
// likely, or another program), and closes it when the lease ends.
func (h *Host) host(ctx context.Context) error {
	log := h.cfg.Logger.With(slog.String("addr", h.cfg.Addr))
	defer h.closeBroker(log)
	var bindFailedSince time.Time // spaces the warnings out
	for {
		b, err := Listen(ctx, Config{Addr: h.cfg.Addr, Logger: h.cfg.BrokerLogger, AuthLogger: h.cfg.Logger,
			Credentials: h.cfg.Credentials, Anonymous: h.cfg.Anonymous, Refresh: h.cfg.Refresh})
		if err == nil {
			h.mu.Lock()
			h.broker = b
			h.mu.Unlock()
			log.Info("embedded MQTT broker hosted here", slog.String("worker", h.cfg.WorkerID), slog.String("url", b.URL()))
			break
		}
		if bindFailedSince.IsZero() {
			bindFailedSince = time.Now()
		} else if time.Since(bindFailedSince) > h.cfg.Lease {
			log.Warn("embedded MQTT broker: address still taken, retrying", slog.Any("error", err),
				slog.Bool("in_use", errors.Is(err, syscall.EADDRINUSE)))
			bindFailedSince = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(brokerBindRetry):
		}
	}
	<-ctx.Done()
	return nil
}

func (h *Host) closeBroker(log *slog.Logger) {
	h.mu.Lock()
	b := h.broker
	h.broker = nil
	h.mu.Unlock()
	if b != nil {
		_ = b.Close()
		log.Info("embedded MQTT broker closed")
	}
}
