package consumer

// The worker's record in the store's registry: registered by Start (which
// fails while another live process holds the worker id), renewed every
// HeartbeatInterval with the running count, deleted by Stop.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/leasepool/leasepool/consumer/internal/preempt"
	"github.com/leasepool/leasepool/task"
)

// newInstance returns a random process instance id.
func newInstance() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Instance is this worker process's random instance id; its claims and
// locks carry it (task.Holder.Instance).
func (c *Consumer) Instance() string { return c.self.Instance }

func (c *Consumer) info() task.WorkerInfo {
	now := c.store.Now()
	running := c.running.Len()
	host, _ := os.Hostname()
	return task.WorkerInfo{
		ID: c.cfg.WorkerID, Instance: c.self.Instance, Host: host, PID: os.Getpid(),
		StartedAt: c.startedAt, Kinds: c.cfg.Kinds, Concurrency: c.cfg.Concurrency, Running: running,
		Heartbeat: now.UTC(), Until: now.Add(c.cfg.HeartbeatTimeout).UTC(),
	}
}

// Register takes the worker id in the store's registry, failing with an
// error wrapping task.ErrWorkerIDTaken while another live process holds
// it. Start registers when Register was not called; call it first to claim
// the id before wiring anything else that uses it (an MQTT client id). A
// record held by a process of this host that no longer exists (a crash,
// then a restart under the same id) is taken over at once instead of
// waiting for it to lapse.
func (c *Consumer) Register(ctx context.Context) error {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	if c.registered {
		return nil
	}
	c.startedAt = c.store.Now().UTC()
	p := task.RegisterParams{Worker: c.info(), Now: c.store.Now()}
	err := c.store.RegisterWorker(ctx, p)
	var taken *task.WorkerIDTakenError
	if errors.As(err, &taken) && deadHere(taken.Holder) {
		c.logger.Info("worker id was held by a process of this host that is gone; taking it over",
			slog.Int("pid", taken.Holder.PID), slog.String("instance", taken.Holder.Instance))
		p.Replace = taken.Holder.Instance
		err = c.store.RegisterWorker(ctx, p)
	}
	c.registered = err == nil
	if err == nil {
		c.refreshPeers(ctx)
	}
	return err
}

// Registration is what the worker's last heartbeat learned of its own
// registration: the registry is read after every heartbeat that renewed
// it, so a program that watches the worker's hold on the store needs no
// reads of its own.
type Registration struct {
	// At is when, in store time, the heartbeat renewed the registration
	// and read the registry, or failed to.
	At time.Time
	// Err is why the last heartbeat did not renew the registration or read
	// the registry; nil when both succeeded.
	Err error
	// Self is this process's record (its worker id and Instance) as the
	// last successful read listed it, or nil when it was not listed. Its
	// Until says how long the registration holds unrenewed.
	Self *task.WorkerInfo
}

// Registration returns what the last heartbeat learned of this worker's
// registration, and false before Register or when the consumer does not
// read the registry (ClaimSpread negative).
func (c *Consumer) Registration() (Registration, bool) {
	r := c.seen.Load()
	if r == nil || c.cfg.ClaimSpread < 0 {
		return Registration{}, false
	}
	return *r, true
}

// failedHeartbeat records err as the last heartbeat's outcome, keeping
// the record the last read listed: its Until says when it lapses.
func (c *Consumer) failedHeartbeat(err error) {
	r := Registration{At: c.store.Now(), Err: err}
	if last := c.seen.Load(); last != nil {
		r.Self = last.Self
	}
	c.seen.Store(&r)
}

// peersPerRead is how many live workers add a heartbeat between two
// reads of the registry. A read returns every worker's record, so W
// workers each reading it after every heartbeat would read W² records a
// heartbeat; reading it every ⌈W/peersPerRead⌉ heartbeats keeps that
// near peersPerRead·W. A list that many heartbeats old costs at most
// claim conflicts and the stand-by's bounded wait for a preferred worker
// that died meanwhile (see standby.Ranker.Delay), never a claim.
const peersPerRead = 100

// readEvery is after how many heartbeats the registry is read again:
// after each while the workers come and go (the last read listed others
// than the one before: a cluster starting, say, whose ranks must agree
// soon), else by the number of live workers.
func (c *Consumer) readEvery() int {
	if !c.peersSteady.Load() {
		return 1
	}
	return 1 + max(c.peers.Load().Len()-1, 0)/peersPerRead
}

// renewed records a heartbeat that renewed the registration as self
// without reading the registry: the record the last read listed is live
// until self's Until, since a renewal by another process would have
// failed this one (task.ErrWorkerIDTaken).
func (c *Consumer) renewed(self task.WorkerInfo) {
	last := c.seen.Load()
	r := Registration{At: self.Heartbeat}
	if last != nil && last.Self != nil {
		rec := *last.Self
		rec.Heartbeat, rec.Until = self.Heartbeat, self.Until
		r.Self = &rec
	}
	c.seen.Store(&r)
}

// refreshPeers reads the registry for claim spreading. On failure the
// last list stands: a stale list costs claim conflicts, never a claim.
func (c *Consumer) refreshPeers(ctx context.Context) {
	if c.cfg.ClaimSpread < 0 {
		return
	}
	ws, err := c.store.Workers(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.logger.Debug("read the worker registry", slog.Any("err", err))
			c.failedHeartbeat(fmt.Errorf("read the worker registry: %w", err))
		}
		return
	}
	r := Registration{At: c.store.Now()}
	for i := range ws {
		if ws[i].ID == c.cfg.WorkerID && ws[i].Instance == c.self.Instance {
			r.Self = &ws[i]
			break
		}
	}
	c.seen.Store(&r)
	peers := preempt.NewPeers(ws, c.info(), c.store.Now())
	c.peersSteady.Store(peers.SameMembers(c.peers.Load()))
	c.peers.Store(peers)
}

// deadHere reports whether w was registered by a process of this host
// that no longer exists.
func deadHere(w task.WorkerInfo) bool {
	host, _ := os.Hostname()
	if w.Host != host || w.PID <= 0 || w.PID == os.Getpid() {
		return false
	}
	return errors.Is(syscall.Kill(w.PID, 0), syscall.ESRCH)
}

// heartbeat renews the registration until ctx is done.
func (c *Consumer) heartbeat(ctx context.Context) {
	t := time.NewTicker(c.cfg.HeartbeatInterval)
	defer t.Stop()
	unread := 0 // heartbeats since the registry was last read
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		self := c.info()
		rctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatTimeout)
		err := c.store.RegisterWorker(rctx, task.RegisterParams{Worker: self, Now: c.store.Now()})
		cancel()
		if err != nil && ctx.Err() == nil {
			c.failedHeartbeat(fmt.Errorf("renew the registration: %w", err))
		}
		switch {
		case err == nil:
			if unread++; unread < c.readEvery() {
				c.renewed(self)
				break
			}
			unread = 0
			rctx, cancel := context.WithTimeout(ctx, c.cfg.HeartbeatTimeout)
			c.refreshPeers(rctx)
			cancel()
		case ctx.Err() != nil:
		case errors.Is(err, task.ErrWorkerIDTaken):
			// This process was frozen past its registration and another
			// took the id. Its leases carry its own instance, so neither
			// can renew or finish the other's attempts.
			c.logger.Error("worker id taken by another process while this one was unresponsive", slog.Any("err", err))
		default:
			c.logger.Warn("worker heartbeat", slog.Any("err", err))
		}
	}
}

func (c *Consumer) unregister() {
	c.regMu.Lock()
	registered := c.registered
	c.registered = false
	c.regMu.Unlock()
	if !registered {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.store.UnregisterWorker(ctx, c.cfg.WorkerID, c.self.Instance); err != nil {
		c.logger.Warn("unregister worker; the record lapses on its own", slog.Any("err", err))
	}
}
