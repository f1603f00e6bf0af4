// Host: the hosting lease that keeps one embedded broker up for a group of
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

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// DefaultLease is how long a Host's hosting lease lasts
// without renewal, unless configured.
const DefaultLease = 3 * time.Second

// LockKey is the lock key, in the store's lock table, of the lease to
// host the embedded broker on addr.
func LockKey(addr string) string { return "mqtt-broker:" + addr }

// HostConfig configures a Host.
type HostConfig struct {
	// Store holds the hosting lease in its lock table (key
	// LockKey(Addr)). Required.
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
}

func (c *HostConfig) validate() error {
	if c.Store == nil {
		return errors.New("store: required")
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
// process that runs it. Hosting is a lease in the store's lock table: every
// process runs a Host; the one holding the lease runs the broker and
// renews the lease every Lease/3; the others try to take the lease when it
// runs out (they sleep until the holder's lease ends, at most Lease/3 at a
// time) and, once they hold it, start the broker on the same address,
// retrying the bind every 100ms until the old socket is gone.
//
// At most one broker serves: a holder that cannot renew (the store says
// another holder took the lease, or the store does not answer before its
// lease, less a tenth, runs out in store time) closes its broker, and a
// new holder is granted the lease only after the old lease has ended. A
// host that was frozen past its lease (SIGSTOP, a long pause) still holds
// the listening socket when it wakes: the new holder's binds fail until
// the old one notices its lost lease at its next renewal and closes.
//
// The broker keeps sessions and retained messages in memory only, so a
// takeover loses them: this package's clients resubscribe on every
// connection, devices republish their status, and the handler republishes
// commands still waiting for an ack or result.
type Host struct {
	cfg    HostConfig
	holder task.Holder
	key    string

	life lifecycle.Runner

	mu     sync.Mutex
	broker *Broker
	crash  bool // on stop, leave the lease to run out (tests)
}

// NewHost checks cfg and returns a host; Start runs it.
func NewHost(cfg HostConfig) (*Host, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("broker host: %w", err)
	}
	instance := protocol.NewCorrelationID()[:12]
	return &Host{
		cfg: cfg,
		key: LockKey(cfg.Addr),
		// The instance tells apart two processes under one worker id.
		holder: task.Holder{TaskKey: "embedded-broker", WorkerID: cfg.WorkerID, Instance: instance},
	}, nil
}

// URL is the broker URL for clients: tcp://Addr, whichever process hosts.
func (h *Host) URL() string { return "tcp://" + h.cfg.Addr }

// Holder is the lock holder this host writes when it hosts.
func (h *Host) Holder() task.Holder { return h.holder }

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
	run, err := h.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("broker host: %w", err)
	}
	h.life.Go(func() { h.run(run) })
	return nil
}

// Stop closes the broker if this process hosts it, releases the lease (so
// another process takes over within Lease/3), and ends the supervisor. It
// returns when that is done or ctx ends. It may be called again.
func (h *Host) Stop(ctx context.Context) error { return h.stop(ctx, true) }

// stop with release false leaves the lease to run out, as a crash would.
func (h *Host) stop(ctx context.Context, release bool) error {
	if !release {
		h.mu.Lock()
		h.crash = true
		h.mu.Unlock()
	}
	return h.life.Stop(ctx, nil)
}

const brokerBindRetry = 100 * time.Millisecond

// run is the supervisor: renew or take the lease, host while held.
func (h *Host) run(ctx context.Context) {
	log := h.cfg.Logger.With(slog.String("addr", h.cfg.Addr))
	renewEvery := h.cfg.Lease / 3
	margin := h.cfg.Lease / 10
	var heldUntil time.Time // store time; zero: not held
	var bindFailedSince time.Time
	wait := time.Duration(0)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			h.shutdown(log, heldUntil)
			return
		case <-timer.C:
		}
		now := h.cfg.Store.Now()
		held := !heldUntil.IsZero()
		if !held || heldUntil.Sub(now) <= h.cfg.Lease-renewEvery {
			// A renewal that has not landed before the lease (less a
			// margin) runs out is given up; so is a first try after a
			// lease.
			limit := h.cfg.Lease
			if held {
				limit = heldUntil.Add(-margin).Sub(now)
			}
			until := now.Add(h.cfg.Lease)
			actx, cancel := context.WithTimeout(ctx, max(limit, time.Millisecond))
			err := h.cfg.Store.AcquireLocks(actx, task.LockParams{Keys: []string{h.key}, Holder: h.holder, Now: now, Until: until})
			cancel()
			var locked *task.LockedError
			switch {
			case err == nil:
				if !held {
					log.Info("embedded MQTT broker lease taken", slog.String("worker", h.holder.WorkerID))
				}
				heldUntil = until
			case ctx.Err() != nil:
				continue // stopping
			case errors.As(err, &locked):
				if held {
					log.Warn("embedded MQTT broker lease lost to another host: closing the broker",
						slog.String("holder", locked.Holder.WorkerID))
				}
				h.closeBroker(log)
				heldUntil = time.Time{}
				// Look again when the holder's lease ends (or before, in
				// case it releases it).
				wait = min(max(locked.Until.Sub(now)+10*time.Millisecond, 10*time.Millisecond), renewEvery)
				timer.Reset(wait)
				continue
			default:
				log.Warn("embedded MQTT broker lease not renewed", slog.Any("error", err))
				if held && !h.cfg.Store.Now().Before(heldUntil.Add(-margin)) {
					log.Warn("embedded MQTT broker lease ran out: closing the broker")
					h.closeBroker(log)
					heldUntil = time.Time{}
				}
				timer.Reset(min(renewEvery, 250*time.Millisecond))
				continue
			}
		}
		// Held: host.
		wait = heldUntil.Add(-h.cfg.Lease + renewEvery).Sub(h.cfg.Store.Now())
		if !h.Hosting() && !h.serve(ctx, log, &bindFailedSince) {
			wait = min(wait, brokerBindRetry)
		}
		timer.Reset(max(wait, 0))
	}
}

// serve starts the broker while the lease is held; it reports false when
// the address is still taken (the old host's socket, most likely, or
// another program), to be retried soon. bindFailedSince spaces the
// warnings out.
func (h *Host) serve(ctx context.Context, log *slog.Logger, bindFailedSince *time.Time) bool {
	b, err := Listen(ctx, h.cfg.Addr, h.cfg.BrokerLogger)
	if err != nil {
		if bindFailedSince.IsZero() {
			*bindFailedSince = time.Now()
		} else if time.Since(*bindFailedSince) > h.cfg.Lease {
			log.Warn("embedded MQTT broker: address still taken, retrying", slog.Any("error", err),
				slog.Bool("in_use", errors.Is(err, syscall.EADDRINUSE)))
			*bindFailedSince = time.Now()
		}
		return false
	}
	h.mu.Lock()
	h.broker = b
	h.mu.Unlock()
	*bindFailedSince = time.Time{}
	log.Info("embedded MQTT broker hosted here", slog.String("worker", h.holder.WorkerID), slog.String("url", b.URL()))
	return true
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

// shutdown runs when the supervisor stops: close, then release the lease
// so the next host need not wait for it to run out.
func (h *Host) shutdown(log *slog.Logger, heldUntil time.Time) {
	h.closeBroker(log)
	h.mu.Lock()
	crash := h.crash
	h.mu.Unlock()
	if heldUntil.IsZero() || crash {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := h.cfg.Store.ReleaseLocks(ctx, task.LockParams{Keys: []string{h.key}, Holder: h.holder}); err != nil {
		log.Warn("embedded MQTT broker lease not released", slog.Any("error", err))
	}
}
