// The device task handler: its config, its MQTT client and lifecycle, and
// the routing of replies to the attempt waiting for them.

package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer"
	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/redact"
	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// Errors of a device command attempt; callers branch with errors.Is.
var (
	// ErrNoAck: the device acked none of the publishes.
	ErrNoAck = errors.New("device did not ack")
	// ErrResultTimeout: the device acked but sent no result in time.
	ErrResultTimeout = errors.New("device result timed out")
	// ErrRefused: the device refused the command in its ack (a stale
	// attempt, an unknown command).
	ErrRefused = errors.New("device refused command")
	// ErrDeviceFailed: the device ran the command and reported failure.
	ErrDeviceFailed = errors.New("device command failed")
	// ErrOffline: the device stayed offline past the command's
	// offline_timeout.
	ErrOffline = errors.New("device offline")
	// ErrNotStarted: Handle was called before Start or after Stop.
	ErrNotStarted = errors.New("mqttdev handler not started")
)

// minLinkWait is the least time an attempt holds its device while the
// handler's own MQTT connection is down (a broker moving to another host
// takes about one broker lease).
const minLinkWait = 10 * time.Second

// offlineSnooze is how long a command given back for its offline device
// waits before any worker looks at it again: a claim that raced the
// offline status, or one Ready let through (a dead holder's lease taken
// over). Ready holds it from then on; the snooze only bounds how often a
// command the gate does not hold can be claimed, so a handler answering
// "offline" never loops on claims.
const offlineSnooze = time.Second

// DefaultOfflineRecheck is HandlerConfig.OfflineRecheck's default.
const DefaultOfflineRecheck = 30 * time.Second

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	// ClientConfig says how to reach the broker. ClientID should be stable
	// and unique per worker process (the worker id is a good choice);
	// empty means "leasepool-worker-<host>-<pid>". The embedded broker
	// lets a user only use client ids of its own (broker.ClientIDOwner):
	// broker.ClientID(credential.WorkerUser(workerID), "") for a worker.
	ClientConfig
	// Prefix is the first topic level. Empty means DefaultPrefix.
	Prefix string
	// Logger gets the handler's logs; nil discards them.
	Logger *slog.Logger
	// DeviceState mirrors device states observed here; nil keeps them in
	// memory only (they are also retained in the broker).
	DeviceState DeviceStateStore
	// Inventory keeps the attributes devices announce (StoreInventory);
	// nil keeps none. It is written only with DeviceState set.
	Inventory AttributeStore
	// OfflineRecheck bounds how long a worker holds a command for a device
	// known offline before it looks at the device's state again (Ready).
	// The hold writes nothing to the store, and the device's online
	// status ends it at once: this is the fallback for a status missed.
	// Zero means DefaultOfflineRecheck.
	OfflineRecheck time.Duration
	// WrapTransport, when set, wraps the MQTT transport (fault injection in
	// tests). Nil uses it as is.
	WrapTransport func(Transport) Transport
	// Observer is told how each command exchange ended (metrics). Nil: none.
	Observer CommandObserver
}

func (c *HandlerConfig) validate() error {
	if err := c.ClientConfig.Validate(); err != nil {
		return err
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := ValidateID("prefix", c.Prefix); err != nil {
		return err
	}
	if c.OfflineRecheck < 0 {
		return errors.New("offline_recheck: must not be negative")
	}
	if c.OfflineRecheck == 0 {
		c.OfflineRecheck = DefaultOfflineRecheck
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Handler runs device tasks (kind Kind): it publishes the command to the
// device, waits for its ack (publishing again while none comes) and its
// result. It implements consumer.Handler. It owns one MQTT client, made in
// Start and closed in Stop.
type Handler struct {
	cfg     HandlerConfig
	topics  Topics
	tracker *StateTracker
	logger  *slog.Logger
	life    lifecycle.Runner

	mu        sync.Mutex
	tr        Transport
	waiters   map[string]*waiter // by correlation id
	reconnect chan struct{}      // closed and replaced at every reconnect
	connects  int
	losses    int  // connections lost so far
	down      bool // the connection is lost and not back yet
	// live: devices whose status arrived live (not as the retained copy
	// a subscription starts with) on the current connection.
	live map[string]bool
}

var _ consumer.Handler = (*Handler)(nil)

type waiter struct {
	device, taskKey string
	attempt         int
	replies         chan reply
}

type reply struct {
	kind string
	r    Reply
}

// NewHandler checks cfg and returns a handler; call Start before use.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("mqttdev handler: %w", err)
	}
	tracker := NewStateTracker(cfg.DeviceState, cfg.Logger)
	tracker.inv = cfg.Inventory
	return &Handler{
		cfg:       cfg,
		topics:    Topics{Prefix: cfg.Prefix},
		tracker:   tracker,
		logger:    cfg.Logger,
		waiters:   map[string]*waiter{},
		reconnect: make(chan struct{}),
	}, nil
}

// Tracker returns the device state tracker fed by this handler's client.
func (h *Handler) Tracker() *StateTracker { return h.tracker }

// Start connects to the broker (retrying until ctx ends), subscribes to
// the replies and status of every device, and starts the state tracker.
// ctx bounds the start only. A second call returns lifecycle.ErrStarted;
// a failed start leaves the handler stopped.
func (h *Handler) Start(ctx context.Context) error {
	if _, err := h.life.Start(ctx); err != nil {
		return fmt.Errorf("mqttdev handler: %w", err)
	}
	if err := h.start(ctx); err != nil {
		_ = h.Stop(context.WithoutCancel(ctx))
		return fmt.Errorf("mqttdev handler: %w", err)
	}
	h.logger.Info("mqttdev handler connected", slog.String("broker", redact.URL(h.cfg.BrokerURL)))
	return nil
}

func (h *Handler) start(ctx context.Context) error {
	if err := h.tracker.Load(ctx); err != nil {
		h.logger.Warn("device states not loaded", slog.Any("error", err))
	}
	if err := h.tracker.Start(ctx); err != nil {
		return err
	}
	c, err := protocol.NewClient(h.cfg.ClientConfig, protocol.ClientOptions{
		Role:         "worker",
		OnMessage:    h.onMessage,
		OnConnecting: h.onConnecting,
		OnConnect:    h.onConnect,
		OnLost:       h.onLost,
		Logger:       h.logger,
	})
	if err != nil {
		return err
	}
	var tr Transport = c
	if h.cfg.WrapTransport != nil {
		tr = h.cfg.WrapTransport(tr)
	}
	for _, kind := range []string{TopicAck, TopicResult, TopicStatus} {
		_ = tr.Subscribe(ctx, h.topics.All(kind)) // made on connect
	}
	h.mu.Lock()
	h.tr = tr
	h.mu.Unlock()
	return tr.Connect(ctx)
}

// Stop disconnects from the broker, then stops the tracker. Running Handle
// calls should have returned first (stop the consumer, then the handler).
// It may be called again; ctx bounds the wait.
func (h *Handler) Stop(ctx context.Context) error {
	return h.life.Stop(ctx, func() {
		if tr := h.transport(); tr != nil {
			tr.Disconnect()
		}
		_ = h.tracker.Stop(context.Background()) // its last flush is bounded
	})
}

// transport returns the transport while the handler runs, nil otherwise.
func (h *Handler) transport() Transport {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tr
}

func (h *Handler) onConnect() {
	h.mu.Lock()
	h.connects++
	h.down = false
	if h.connects > 1 {
		close(h.reconnect)
		h.reconnect = make(chan struct{})
	}
	h.mu.Unlock()
}

// onConnecting runs before a connection's first message: the retained
// copies the new subscriptions start with are current until a live status
// of their device arrives. (onConnect is too late: it runs after the
// subscribe, when those copies may have been handled already.)
func (h *Handler) onConnecting() {
	h.mu.Lock()
	h.live = nil
	h.mu.Unlock()
}

func (h *Handler) onLost(error) {
	h.mu.Lock()
	h.losses++
	h.down = true
	h.mu.Unlock()
}

// staleStatus reports whether a status of device id is older than one
// already seen: a retained copy (sent as the subscription starts) that
// arrives after a live status, as when a device's will is published while
// this worker subscribes and the broker sends the old retained "online"
// after the live "offline".
func (h *Handler) staleStatus(id string, retained bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !retained {
		if h.live == nil {
			h.live = map[string]bool{}
		}
		h.live[id] = true
		return false
	}
	return h.live[id]
}

// link reports how many connections were lost so far, whether the
// connection is down now, and a channel closed at the next reconnect.
func (h *Handler) link() (losses int, down bool, reconnected <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.losses, h.down, h.reconnect
}

// onMessage runs on paho's goroutine: decode, route, never block.
func (h *Handler) onMessage(m Message) {
	id, kind, ok := h.topics.Parse(m.Topic)
	if !ok {
		return
	}
	switch kind {
	case TopicStatus:
		if len(m.Payload) == 0 {
			return // retained status cleared
		}
		st, err := DecodeStatus(m.Payload)
		if err != nil {
			h.logger.Warn("bad status message", slog.String("device", id), slog.Any("error", err))
			return
		}
		if h.staleStatus(id, m.Retained) {
			return
		}
		h.tracker.Observe(id, st, time.Now())
	case TopicAck, TopicResult:
		r, err := DecodeReply(m.Payload)
		if err != nil {
			h.logger.Warn("bad device reply", slog.String("device", id), slog.Any("error", err))
			return
		}
		h.mu.Lock()
		w := h.waiters[r.CorrelationID]
		h.mu.Unlock()
		if w == nil || w.device != id || w.taskKey != r.TaskKey || w.attempt != r.Attempt {
			h.logger.Debug("reply for no waiting attempt", slog.String("device", id),
				slog.String("task", r.TaskKey), slog.Int("attempt", r.Attempt))
			return
		}
		select {
		case w.replies <- reply{kind, r}:
		default: // a flood of duplicates: the waiter has enough
		}
	}
}

// Handle runs one attempt of a device task. It returns nil when the device
// reports success; consumer.Snooze(offlineSnooze) when the device is
// known to be offline before anything was sent (a claim that raced the
// device's status: Ready holds it from then on), or stayed offline for
// result_timeout after a copy went out unacked; an error wrapping
// ErrRefused, ErrDeviceFailed, ErrNoAck or ErrResultTimeout otherwise; and
// ctx's cause promptly when ctx is cancelled (lease lost). The exchange
// itself is an attempt (attempt.go).
func (h *Handler) Handle(ctx context.Context, job *consumer.Job) error {
	if h.cfg.Observer == nil {
		return h.handle(ctx, job)
	}
	began := time.Now()
	err := h.handle(ctx, job)
	h.cfg.Observer.CommandDone(CommandEvent{Outcome: commandOutcome(ctx, err), Duration: time.Since(began)})
	return err
}

func (h *Handler) handle(ctx context.Context, job *consumer.Job) error {
	c, err := DecodePayload(job.Task.Payload)
	if err != nil {
		return fmt.Errorf("task %s: %w", job.Task.Key, err)
	}
	tr := h.transport()
	if !h.life.Running() || tr == nil {
		return ErrNotStarted
	}
	log := h.logger.With(slog.String("task", job.Task.Key), slog.Int("attempt", job.Attempt), slog.String("device", c.Device))
	if h.tracker.Offline(c.Device) {
		if err := offlineTooLong(c, job.Task.CreatedAt); err != nil {
			return fmt.Errorf("task %s attempt %d on %s: %w", job.Task.Key, job.Attempt, c.Device, err)
		}
		log.Info("device offline: given back until it is online")
		job.Logf("device %s offline: waiting for it", c.Device)
		return consumer.Snooze(offlineSnooze)
	}
	a := h.newAttempt(ctx, tr, log, job, c)
	defer h.forget(a.msg.CorrelationID)
	if err := a.awaitAck(); err != nil {
		return err
	}
	log.Debug("command acked")
	job.Logf("device %s: command %s acked", c.Device, c.Command)
	tracing.Event(ctx, "device.ack", tracing.String("leasepool.device.id", c.Device), tracing.String("leasepool.device.command", c.Command))
	if err := a.awaitResult(); err != nil {
		return err
	}
	tracing.Event(ctx, "device.result", tracing.String("leasepool.device.id", c.Device),
		tracing.Bool("leasepool.device.ok", a.result.OK), tracing.String("leasepool.device.error", a.result.Error))
	if !a.result.OK {
		job.Logf("device %s: command %s result: failed: %s", c.Device, c.Command, a.result.Error)
		return a.errorf(" on %s: %w: %s", c.Device, ErrDeviceFailed, a.result.Error)
	}
	job.Logf("device %s: command %s result: ok", c.Device, c.Command)
	log.Debug("command done")
	return nil
}

// listen registers w for the replies to correlation id corr.
func (h *Handler) listen(corr string, w *waiter) {
	h.mu.Lock()
	h.waiters[corr] = w
	h.mu.Unlock()
}

// forget drops the waiter of correlation id corr.
func (h *Handler) forget(corr string) {
	h.mu.Lock()
	delete(h.waiters, corr)
	h.mu.Unlock()
}

// Ready implements consumer.Gate: a command whose device is known offline
// is held in the worker, with no claim written, until the device's status
// changes, the fallback recheck, or its offline_timeout (when Handle fails
// it). A flow step's command is read out of its envelope, as the handler
// will see it. Let through: a payload Ready cannot read (Handle fails
// it), and a task with a running attempt, whose lease a claim takes over
// or whose failure it records (a gate must not keep a dead holder's task
// from that).
func (h *Handler) Ready(t *task.Task) (consumer.Hold, bool) {
	for _, a := range t.Attempts {
		if a.State == task.AttemptRunning {
			return consumer.Hold{}, true
		}
	}
	payload := t.Payload
	if p, ok := flow.StepPayload(t); ok {
		payload = p
	}
	c, err := DecodePayload(payload)
	if err != nil || !h.tracker.Offline(c.Device) {
		return consumer.Hold{}, true
	}
	// The wake, then the state again: a status that came between the two
	// reads has closed it. A wake is only made for a device seen offline,
	// so commands naming devices never heard of make none.
	wake := h.tracker.Changed(c.Device)
	if !h.tracker.Offline(c.Device) {
		return consumer.Hold{}, true
	}
	recheck := h.cfg.OfflineRecheck
	if limit := time.Duration(c.OfflineTimeout); limit > 0 {
		left := limit - time.Since(t.CreatedAt)
		if left <= 0 {
			return consumer.Hold{}, true
		}
		recheck = min(recheck, left)
	}
	return consumer.Hold{Wake: wake, Recheck: recheck}, false
}

// offlineTooLong is the failure of a command whose device is offline past
// its offline_timeout, counted from published; nil while it may wait.
func offlineTooLong(c Command, published time.Time) error {
	if limit := time.Duration(c.OfflineTimeout); limit > 0 && time.Since(published) >= limit {
		return fmt.Errorf("%w for longer than offline_timeout (%s)", ErrOffline, limit)
	}
	return nil
}
