package mqttdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/leasepool/leasepool/consumer"
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
	// ErrNotStarted: Handle was called before Start or after Stop.
	ErrNotStarted = errors.New("mqttdev handler not started")
)

// minLinkWait is the least time an attempt holds its device while the
// handler's own MQTT connection is down (a broker moving to another host
// takes about one broker lease).
const minLinkWait = 10 * time.Second

// DefaultOfflineRetry is HandlerConfig.OfflineRetry's default.
const DefaultOfflineRetry = 2 * time.Second

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	// ClientConfig says how to reach the broker. ClientID should be stable
	// and unique per worker process (the worker id is a good choice);
	// empty means "leasepool-worker-<host>-<pid>".
	ClientConfig
	// Prefix is the first topic level. Empty means DefaultPrefix.
	Prefix string
	// Logger gets the handler's logs; nil discards them.
	Logger *slog.Logger
	// DeviceState mirrors device states observed here; nil keeps them in
	// memory only (they are also retained in the broker).
	DeviceState DeviceStateStore
	// OfflineRetry is the snooze of a command whose device is offline.
	// Zero means DefaultOfflineRetry.
	OfflineRetry time.Duration
	// WrapTransport, when set, wraps the MQTT transport (fault injection in
	// tests). Nil uses it as is.
	WrapTransport func(Transport) Transport
}

func (c *HandlerConfig) validate() error {
	if err := c.ClientConfig.validate(); err != nil {
		return err
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := ValidateID("prefix", c.Prefix); err != nil {
		return err
	}
	if c.OfflineRetry < 0 {
		return errors.New("offline_retry: must not be negative")
	}
	if c.OfflineRetry == 0 {
		c.OfflineRetry = DefaultOfflineRetry
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

	mu        sync.Mutex
	tr        Transport
	paho      *pahoTransport
	waiters   map[string]*waiter // by correlation id
	reconnect chan struct{}      // closed and replaced at every reconnect
	connects  int
	losses    int  // connections lost so far
	down      bool // the connection is lost and not back yet
	started   bool
	stopped   bool
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
	return &Handler{
		cfg:       cfg,
		topics:    Topics{Prefix: cfg.Prefix},
		tracker:   NewStateTracker(cfg.DeviceState, cfg.Logger),
		logger:    cfg.Logger,
		waiters:   map[string]*waiter{},
		reconnect: make(chan struct{}),
	}, nil
}

// Tracker returns the device state tracker fed by this handler's client.
func (h *Handler) Tracker() *StateTracker { return h.tracker }

// Start connects to the broker (retrying until ctx ends), subscribes to
// the replies and status of every device, and starts the state tracker.
// A second call does nothing.
func (h *Handler) Start(ctx context.Context) error {
	h.mu.Lock()
	if h.started {
		h.mu.Unlock()
		return nil
	}
	h.started = true
	h.mu.Unlock()

	if err := h.tracker.Load(ctx); err != nil {
		h.logger.Warn("device states not loaded", slog.Any("error", err))
	}
	if err := h.tracker.Start(ctx); err != nil {
		return err
	}
	p, err := newPahoTransport(h.cfg.ClientConfig, pahoOptions{
		role:      "worker",
		onMessage: h.onMessage,
		onConnect: h.onConnect,
		onLost:    h.onLost,
		logger:    h.logger,
	})
	if err != nil {
		return fmt.Errorf("mqttdev handler: %w", err)
	}
	var tr Transport = p
	if h.cfg.WrapTransport != nil {
		tr = h.cfg.WrapTransport(tr)
	}
	for _, kind := range []string{TopicAck, TopicResult, TopicStatus} {
		_ = tr.Subscribe(ctx, h.topics.All(kind)) // made on connect
	}
	h.mu.Lock()
	h.tr, h.paho = tr, p
	h.mu.Unlock()
	if err := p.connect(ctx); err != nil {
		_ = h.tracker.Stop(context.WithoutCancel(ctx))
		return fmt.Errorf("mqttdev handler: %w", err)
	}
	h.logger.Info("mqttdev handler connected", slog.String("broker", h.cfg.BrokerURL))
	return nil
}

// Stop disconnects from the broker and stops the tracker. Running Handle
// calls should have returned first (stop the consumer, then the handler).
// A second call does nothing.
func (h *Handler) Stop(ctx context.Context) error {
	h.mu.Lock()
	if h.stopped || !h.started {
		h.stopped = true
		h.mu.Unlock()
		return nil
	}
	h.stopped = true
	p := h.paho
	h.mu.Unlock()
	if p != nil {
		p.disconnect()
	}
	return h.tracker.Stop(ctx)
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

func (h *Handler) onLost(error) {
	h.mu.Lock()
	h.losses++
	h.down = true
	h.mu.Unlock()
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
// reports success; consumer.Snooze(OfflineRetry) when the device is known
// to be offline before anything was sent, or stayed offline for
// result_timeout after a copy went out unacked; an error wrapping
// ErrRefused, ErrDeviceFailed, ErrNoAck or ErrResultTimeout otherwise; and
// ctx's cause promptly when ctx is cancelled (lease lost).
func (h *Handler) Handle(ctx context.Context, job *consumer.Job) error {
	c, err := DecodePayload(job.Task.Payload)
	if err != nil {
		return fmt.Errorf("task %s: %w", job.Task.Key, err)
	}
	h.mu.Lock()
	tr, live := h.tr, h.started && !h.stopped && h.tr != nil
	h.mu.Unlock()
	if !live {
		return ErrNotStarted
	}
	log := h.logger.With(slog.String("task", job.Task.Key), slog.Int("attempt", job.Attempt), slog.String("device", c.Device))
	if h.tracker.Offline(c.Device) {
		log.Info("device offline: snooze", slog.Duration("delay", h.cfg.OfflineRetry))
		return consumer.Snooze(h.cfg.OfflineRetry)
	}
	msg := CommandMessage{
		TaskKey:       job.Task.Key,
		Attempt:       job.Attempt,
		CorrelationID: NewCorrelationID(),
		Command:       c.Command,
		Args:          c.Args,
	}
	w := &waiter{device: c.Device, taskKey: msg.TaskKey, attempt: msg.Attempt, replies: make(chan reply, 16)}
	h.mu.Lock()
	h.waiters[msg.CorrelationID] = w
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.waiters, msg.CorrelationID)
		h.mu.Unlock()
	}()
	topic := h.topics.Device(c.Device, TopicCmd)
	ackTimeout, resultTimeout := time.Duration(c.AckTimeout), time.Duration(c.ResultTimeout)
	// pubLosses and pubDown describe the link when the last copy went out:
	// a copy that our own connection loss kept from the device spends no
	// publish.
	var pubLosses int
	var pubDown bool
	publish := func(deadline time.Duration) error {
		pubLosses, pubDown, _ = h.link()
		msg.SentAt = time.Now().UTC()
		msg.ExpiresAt = msg.SentAt.Add(ackTimeout)
		b, err := Encode(msg)
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		err = tr.Publish(pctx, topic, false, b)
		if err != nil && ctx.Err() == nil {
			// Not connected: paho keeps it queued; the ack wait decides.
			log.Warn("command publish not confirmed", slog.Any("error", err))
			return nil
		}
		return err
	}

	// Ack phase: publish, wait, publish again while no ack comes.
	//
	// When the device drops offline meanwhile, stop publishing and wait
	// out the current copy's expiry: a device refuses an expired command.
	// That is not enough to give the attempt back, though: a copy may have
	// been accepted in time with its ack lost or still on its way (the ack
	// is queued in our session while we reconnect after a broker restart,
	// and the broker sends the devices' wills when it stops). A snooze then
	// would free the device lock while the device runs the command, and
	// the next holder's command would arrive behind it. So once a copy has
	// been published and the device was seen offline, hold the attempt
	// until the device is back and ask it again (a republish: a duplicate
	// for the device if it had accepted, answered with its ack and, when
	// done, its result), and snooze only when the device stays away for
	// result_timeout.
	var result *Reply
	acked, offlineSeen := false, false
	var awayUntil time.Time // set at the first outage after a publish
	// onReply handles an ack or result of this attempt; it reports whether
	// the ack phase is over, and the refusal if any.
	onReply := func(rp reply) (bool, error) {
		if !rp.r.OK && rp.kind == TopicAck {
			if rp.r.Code == CodeExpired {
				return false, nil // an earlier copy; a later one may be live
			}
			return true, fmt.Errorf("task %s attempt %d on %s: %w: %s", msg.TaskKey, msg.Attempt, c.Device, ErrRefused, rp.r.Error)
		}
		acked = true
		if rp.kind == TopicResult { // its ack was lost
			r := rp.r
			result = &r
		}
		return true, nil
	}
	// awaitBack runs after a copy expired with the device seen offline: it
	// returns nil once the device is online (publish again), or the
	// attempt's end: a reply, the snooze after result_timeout away, ctx.
	awaitBack := func() (bool, error) {
		if awayUntil.IsZero() {
			awayUntil = time.Now().Add(resultTimeout)
		}
		timer := time.NewTimer(time.Until(awayUntil))
		defer timer.Stop()
		for {
			changed := h.tracker.Changed(c.Device)
			if !h.tracker.Offline(c.Device) {
				return false, nil
			}
			select {
			case <-ctx.Done():
				return true, fmt.Errorf("task %s attempt %d: %w", msg.TaskKey, msg.Attempt, context.Cause(ctx))
			case <-changed:
			case rp := <-w.replies:
				if end, err := onReply(rp); end {
					return true, err
				}
			case <-timer.C:
				log.Info("device away since a command went out: snooze", slog.Duration("waited", resultTimeout))
				return true, consumer.Snooze(h.cfg.OfflineRetry)
			}
		}
	}
	// awaitLink runs when our own connection dropped while a copy waited
	// for its ack (the broker died or moved: its wills were never sent, so
	// the device may look online): hold the attempt until we are
	// connected again, then publish again. Only a link down for
	// linkWait gives the attempt back.
	linkWait := max(resultTimeout, minLinkWait)
	awaitLink := func() (bool, error) {
		timer := time.NewTimer(linkWait)
		defer timer.Stop()
		for {
			_, down, reconnected := h.link()
			if !down {
				return false, nil
			}
			select {
			case <-ctx.Done():
				return true, fmt.Errorf("task %s attempt %d: %w", msg.TaskKey, msg.Attempt, context.Cause(ctx))
			case <-reconnected:
			case rp := <-w.replies:
				if end, err := onReply(rp); end {
					return true, err
				}
			case <-timer.C:
				log.Info("own MQTT connection down since a command went out: snooze", slog.Duration("waited", linkWait))
				return true, consumer.Snooze(h.cfg.OfflineRetry)
			}
		}
	}
	for n := 1; !acked; n++ {
		offline := h.tracker.Changed(c.Device)
		if h.tracker.Offline(c.Device) {
			if n == 1 { // nothing sent yet
				log.Info("device offline: snooze")
				return consumer.Snooze(h.cfg.OfflineRetry)
			}
			end, err := awaitBack()
			if err != nil {
				return err
			}
			if end { // acked meanwhile
				break
			}
			offline = h.tracker.Changed(c.Device)
		}
		log.Debug("publish command", slog.Int("publish", n))
		if err := publish(ackTimeout); err != nil {
			return fmt.Errorf("task %s attempt %d: publish: %w", msg.TaskKey, msg.Attempt, err)
		}
		timer := time.NewTimer(ackTimeout)
	wait:
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return fmt.Errorf("task %s attempt %d: %w", msg.TaskKey, msg.Attempt, context.Cause(ctx))
			case <-offline:
				offline = h.tracker.Changed(c.Device)
				offlineSeen = offlineSeen || h.tracker.Offline(c.Device)
			case rp := <-w.replies:
				end, err := onReply(rp)
				if !end {
					continue
				}
				timer.Stop()
				if err != nil {
					return err
				}
				break wait
			case <-timer.C:
				if losses, down, _ := h.link(); losses != pubLosses || pubDown || down {
					// Our connection dropped while this copy waited: it
					// may never have reached the device, or its ack never
					// reached us. Asking again spends no publish.
					log.Info("own MQTT connection dropped before ack: asking again once connected")
					n--
					if down {
						end, err := awaitLink()
						if err != nil {
							return err
						}
						if end { // acked meanwhile
							break wait
						}
					}
					break wait
				}
				if offlineSeen || h.tracker.Offline(c.Device) {
					// The copy has expired; the device may still have
					// accepted it: hold on until it is back and ask again.
					log.Info("device went offline before ack: waiting for it to ask again")
					offlineSeen = false
					end, err := awaitBack()
					if err != nil {
						return err
					}
					if !end {
						n-- // asking again after an outage spends no publish
					}
					break wait
				}
				if n >= c.MaxPublishes {
					return fmt.Errorf("task %s attempt %d on %s: %w after %d publishes of %s", msg.TaskKey, msg.Attempt, c.Device, ErrNoAck, n, ackTimeout)
				}
				break wait
			}
		}
	}
	log.Debug("command acked")

	// Result phase. After a reconnect of ours the result may have been
	// published while we were away (and lost if the broker restarted):
	// publish the command again; the device answers a duplicate with its
	// cached ack and result instead of running it twice.
	//
	// The device may reconnect after us (a broker that moved to another
	// host): a copy published at once can miss it, so after a reconnect
	// the command is asked again every ack_timeout until the result comes,
	// and the result timeout starts again (time without a connection does
	// not count against the device).
	if result == nil {
		timer := time.NewTimer(resultTimeout)
		defer timer.Stop()
		var reask <-chan time.Time
		extended := false
		for result == nil {
			_, _, reconnected := h.link()
			select {
			case <-ctx.Done():
				return fmt.Errorf("task %s attempt %d: %w", msg.TaskKey, msg.Attempt, context.Cause(ctx))
			case <-reconnected:
				log.Info("reconnected: publish command again for its result")
				if err := publish(ackTimeout); err != nil {
					return fmt.Errorf("task %s attempt %d: publish: %w", msg.TaskKey, msg.Attempt, err)
				}
				timer.Reset(resultTimeout)
				if reask == nil {
					tick := time.NewTicker(ackTimeout)
					defer tick.Stop()
					reask = tick.C
				}
			case <-reask:
				log.Debug("no result since reconnect: publish command again")
				if err := publish(ackTimeout); err != nil {
					return fmt.Errorf("task %s attempt %d: publish: %w", msg.TaskKey, msg.Attempt, err)
				}
			case rp := <-w.replies:
				if rp.kind == TopicResult {
					r := rp.r
					result = &r
				}
			case <-timer.C:
				if _, down, _ := h.link(); down && !extended {
					// Disconnected: wait for the link (the reconnect
					// restarts the result timeout), within bounds.
					extended = true
					timer.Reset(linkWait)
					continue
				}
				return fmt.Errorf("task %s attempt %d on %s: %w after %s", msg.TaskKey, msg.Attempt, c.Device, ErrResultTimeout, resultTimeout)
			}
		}
	}
	if !result.OK {
		return fmt.Errorf("task %s attempt %d on %s: %w: %s", msg.TaskKey, msg.Attempt, c.Device, ErrDeviceFailed, result.Error)
	}
	log.Debug("command done")
	return nil
}
