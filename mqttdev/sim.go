package mqttdev

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// SimConfig configures a fleet of simulated devices.
type SimConfig struct {
	// BrokerURL as in ClientConfig. Required.
	BrokerURL string
	// Username and Password authenticate every device; empty means none.
	Username, Password string
	// Prefix is the first topic level; empty means DefaultPrefix.
	Prefix string
	// Count is how many devices to run; at least 1.
	Count int
	// IDPrefix starts every device id; the index follows (dev-0, dev-1...).
	// Empty means "dev-".
	IDPrefix string
	// Latency is how long each command runs; zero means at once.
	Latency time.Duration
	// FailRate is the probability that a command reports failure.
	FailRate float64
	// OfflineRate is the probability that a device drops its connection
	// (abruptly, so the broker sends its will) after finishing a command,
	// staying away for OfflineFor.
	OfflineRate float64
	// OfflineFor is how long an outage lasts; zero means 3s.
	OfflineFor time.Duration
	// DropAckRate is the probability that a device sends no ack for a
	// command it accepts (it still runs it).
	DropAckRate float64
	// Heartbeat is the period of the online status republish; zero means 5s.
	Heartbeat time.Duration
	// Seed makes the random choices repeatable.
	Seed int64
	// Logger gets the devices' logs; nil discards them.
	Logger *slog.Logger
}

func (c *SimConfig) validate() error {
	cc := ClientConfig{BrokerURL: c.BrokerURL}
	if err := cc.validate(); err != nil {
		return err
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if err := ValidateID("prefix", c.Prefix); err != nil {
		return err
	}
	if c.IDPrefix == "" {
		c.IDPrefix = "dev-"
	}
	if c.Count < 1 {
		return fmt.Errorf("count: %d must be at least 1", c.Count)
	}
	if err := ValidateID("id_prefix", c.IDPrefix+strconv.Itoa(c.Count-1)); err != nil {
		return err
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"fail_rate", c.FailRate}, {"offline_rate", c.OfflineRate}, {"drop_ack_rate", c.DropAckRate}} {
		if !(r.v >= 0 && r.v <= 1) {
			return fmt.Errorf("%s: %v is not in [0,1]", r.name, r.v)
		}
	}
	if c.Latency < 0 || c.OfflineFor < 0 || c.Heartbeat < 0 {
		return errors.New("latency, offline_for, heartbeat: must not be negative")
	}
	if c.OfflineFor == 0 {
		c.OfflineFor = 3 * time.Second
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Run is one command a simulated device ran.
type Run struct {
	Device        string    `json:"device"`
	TaskKey       string    `json:"task_key"`
	Attempt       int       `json:"attempt"`
	CorrelationID string    `json:"correlation_id"`
	Command       string    `json:"command"`
	Start         time.Time `json:"start"`
	End           time.Time `json:"end"`
	OK            bool      `json:"ok"`
}

// Overlap is a command that arrived while another ran (or waited) on the
// same device: the one-command-per-device rule was broken.
type Overlap struct {
	Device         string    `json:"device"`
	RunningTask    string    `json:"running_task"`
	RunningAttempt int       `json:"running_attempt"`
	TaskKey        string    `json:"task_key"`
	Attempt        int       `json:"attempt"`
	At             time.Time `json:"at"`
}

// StaleAttempt is a command refused because a later attempt of its task
// had been seen.
type StaleAttempt struct {
	Device  string    `json:"device"`
	TaskKey string    `json:"task_key"`
	Attempt int       `json:"attempt"`
	Highest int       `json:"highest"`
	At      time.Time `json:"at"`
}

// DeviceCounts are one simulated device's counters.
type DeviceCounts struct {
	ID          string `json:"id"`
	Received    int    `json:"received"`
	Duplicates  int    `json:"duplicates"`
	Ran         int    `json:"ran"`
	Failed      int    `json:"failed"`
	DroppedAcks int    `json:"dropped_acks"`
	Outages     int    `json:"outages"`
	Expired     int    `json:"expired"`
	BadMessages int    `json:"bad_messages"`
}

// SimReport is what a simulation saw.
type SimReport struct {
	Devices       []DeviceCounts `json:"devices"`
	Runs          []Run          `json:"runs"`
	Overlaps      []Overlap      `json:"overlaps"`
	StaleAttempts []StaleAttempt `json:"stale_attempts"`
}

// Totals sums the device counters.
func (r *SimReport) Totals() DeviceCounts {
	var t DeviceCounts
	t.ID = "total"
	for _, d := range r.Devices {
		t.Received += d.Received
		t.Duplicates += d.Duplicates
		t.Ran += d.Ran
		t.Failed += d.Failed
		t.DroppedAcks += d.DroppedAcks
		t.Outages += d.Outages
		t.Expired += d.Expired
		t.BadMessages += d.BadMessages
	}
	return t
}

// WriteSummary prints one line per device, the totals, and every overlap
// and stale attempt.
func (r *SimReport) WriteSummary(w io.Writer) error {
	line := func(d DeviceCounts) string {
		return fmt.Sprintf("%-16s %8d %6d %6d %6d %8d %7d %7d %4d\n", d.ID, d.Received, d.Duplicates, d.Ran, d.Failed, d.DroppedAcks, d.Outages, d.Expired, d.BadMessages)
	}
	out := fmt.Sprintf("%-16s %8s %6s %6s %6s %8s %7s %7s %4s\n", "DEVICE", "RECEIVED", "DUPS", "RAN", "FAILED", "NOACKS", "OUTAGES", "EXPIRED", "BAD")
	for _, d := range r.Devices {
		out += line(d)
	}
	out += line(r.Totals())
	out += fmt.Sprintf("overlaps: %d, stale attempts: %d\n", len(r.Overlaps), len(r.StaleAttempts))
	for _, o := range r.Overlaps {
		out += fmt.Sprintf("OVERLAP %s: %s#%d arrived while %s#%d ran (%s)\n", o.Device, o.TaskKey, o.Attempt, o.RunningTask, o.RunningAttempt, o.At.Format(time.RFC3339Nano))
	}
	for _, s := range r.StaleAttempts {
		out += fmt.Sprintf("STALE %s: %s attempt %d < %d (%s)\n", s.Device, s.TaskKey, s.Attempt, s.Highest, s.At.Format(time.RFC3339Nano))
	}
	_, err := io.WriteString(w, out)
	return err
}

// Simulator runs simulated devices, each with its own MQTT client, last
// will and heartbeat. Use Start and Stop in process, or RunSimulator.
type Simulator struct {
	cfg     SimConfig
	devices []*SimDevice

	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// NewSimulator checks cfg and prepares the devices.
func NewSimulator(cfg SimConfig) (*Simulator, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	s := &Simulator{cfg: cfg}
	topics := Topics{Prefix: cfg.Prefix}
	for i := range cfg.Count {
		id := cfg.IDPrefix + strconv.Itoa(i)
		d := &SimDevice{
			id:      id,
			cfg:     &s.cfg,
			topics:  topics,
			rng:     rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))),
			highest: map[string]int{},
			done:    map[attemptKey]Reply{},
			inbox:   make(chan CommandMessage, 1024),
			work:    make(chan struct{}, 1),
			counts:  DeviceCounts{ID: id},
			logger:  cfg.Logger.With(slog.String("device", id)),
		}
		tr, err := newPahoTransport(ClientConfig{
			BrokerURL: cfg.BrokerURL,
			ClientID:  "leasepool-sim-" + id,
			Username:  cfg.Username,
			Password:  cfg.Password,
		}, pahoOptions{
			role:        "sim",
			onMessage:   d.onMessage,
			onConnect:   d.onConnect,
			willTopic:   topics.Device(id, TopicStatus),
			willPayload: func() []byte { b, _ := Encode(Status{Online: false, At: time.Now().UTC()}); return b },
			dial:        d.dial,
			logger:      d.logger,
		})
		if err != nil {
			return nil, fmt.Errorf("simulator: %w", err)
		}
		d.tr = tr
		s.devices = append(s.devices, d)
	}
	return s, nil
}

// Devices returns the simulated devices.
func (s *Simulator) Devices() []*SimDevice { return s.devices }

// Device returns the i-th device.
func (s *Simulator) Device(i int) *SimDevice { return s.devices[i] }

// Start connects every device (retrying until ctx ends), subscribes them to
// their command topics, publishes their online status, and starts their
// heartbeats and executors. A second call does nothing.
func (s *Simulator) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return nil
	}
	s.started = true
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel
	s.mu.Unlock()
	for _, d := range s.devices {
		_ = d.tr.Subscribe(ctx, d.topics.Device(d.id, TopicCmd))
		if err := d.tr.connect(ctx); err != nil {
			_ = s.Stop(context.WithoutCancel(ctx))
			return fmt.Errorf("simulator: device %s: %w", d.id, err)
		}
		s.wg.Add(3)
		go func() { defer s.wg.Done(); d.receive(runCtx) }()
		go func() { defer s.wg.Done(); d.execute(runCtx) }()
		go func() { defer s.wg.Done(); d.heartbeat(runCtx) }()
	}
	return nil
}

// Stop stops the devices: each publishes its offline status and
// disconnects. A second call does nothing.
func (s *Simulator) Stop(ctx context.Context) error {
	s.mu.Lock()
	if s.stopped || !s.started {
		s.stopped = true
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	cancel := s.cancel
	s.mu.Unlock()
	// Order: stop the device goroutines, then say offline, then disconnect.
	cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	for _, d := range s.devices {
		if d.tr.client.IsConnectionOpen() {
			b, _ := Encode(Status{Online: false, At: time.Now().UTC()})
			pctx, c := context.WithTimeout(ctx, 2*time.Second)
			_ = d.tr.Publish(pctx, d.topics.Device(d.id, TopicStatus), true, b)
			c()
		}
		d.tr.disconnect()
	}
	return nil
}

// Report returns what the devices saw so far.
func (s *Simulator) Report() *SimReport {
	r := &SimReport{}
	for _, d := range s.devices {
		d.mu.Lock()
		r.Devices = append(r.Devices, d.counts)
		r.Runs = append(r.Runs, d.runs...)
		r.Overlaps = append(r.Overlaps, d.overlaps...)
		r.StaleAttempts = append(r.StaleAttempts, d.stale...)
		d.mu.Unlock()
	}
	return r
}

// RunSimulator runs a simulation until ctx ends, writing a progress line to
// progress every few seconds and the summary at the end, and returns the
// report. progress may be nil.
func RunSimulator(ctx context.Context, cfg SimConfig, progress io.Writer) (*SimReport, error) {
	if progress == nil {
		progress = io.Discard
	}
	s, err := NewSimulator(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "simulating %d devices (%s0..%s%d) on %s, prefix %s\n", s.cfg.Count, s.cfg.IDPrefix, s.cfg.IDPrefix, s.cfg.Count-1, s.cfg.BrokerURL, s.cfg.Prefix)
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			r := s.Report()
			t := r.Totals()
			fmt.Fprintf(progress, "%s received %d ran %d failed %d outages %d overlaps %d stale %d\n",
				time.Now().Format(time.TimeOnly), t.Received, t.Ran, t.Failed, t.Outages, len(r.Overlaps), len(r.StaleAttempts))
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Stop(sctx); err != nil {
		return s.Report(), err
	}
	r := s.Report()
	return r, r.WriteSummary(progress)
}

type attemptKey struct {
	key     string
	attempt int
}

// SimDevice is one simulated device.
type SimDevice struct {
	id     string
	cfg    *SimConfig
	topics Topics
	tr     *pahoTransport
	logger *slog.Logger
	inbox  chan CommandMessage
	work   chan struct{}

	mu           sync.Mutex
	rng          *rand.Rand
	conn         net.Conn
	offlineUntil time.Time
	highest      map[string]int
	done         map[attemptKey]Reply
	doneOrder    []attemptKey
	running      *CommandMessage
	queue        []CommandMessage
	runs         []Run
	overlaps     []Overlap
	stale        []StaleAttempt
	counts       DeviceCounts
}

// ID returns the device id.
func (d *SimDevice) ID() string { return d.id }

// Running returns the command being run, if any.
func (d *SimDevice) Running() (CommandMessage, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running == nil {
		return CommandMessage{}, false
	}
	return *d.running, true
}

// GoOffline drops the device's connection abruptly (the broker publishes
// its will) and keeps it away for dur.
func (d *SimDevice) GoOffline(dur time.Duration) {
	d.mu.Lock()
	d.offlineUntil = time.Now().Add(dur)
	c := d.conn
	d.counts.Outages++
	d.mu.Unlock()
	d.logger.Info("going offline", slog.Duration("for", dur))
	if c != nil {
		_ = c.Close()
	}
}

var errSimOffline = errors.New("simulated outage")

func (d *SimDevice) dial(u *url.URL, tc *tls.Config) (net.Conn, error) {
	d.mu.Lock()
	until := d.offlineUntil
	d.mu.Unlock()
	if time.Now().Before(until) {
		return nil, errSimOffline
	}
	c, err := dialBroker(u, tc)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.conn = c
	d.mu.Unlock()
	return c, nil
}

func (d *SimDevice) onConnect() {
	d.publishStatus(true)
}

func (d *SimDevice) publishStatus(online bool) {
	b, _ := Encode(Status{Online: online, At: time.Now().UTC()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.tr.Publish(ctx, d.topics.Device(d.id, TopicStatus), true, b); err != nil {
		d.logger.Debug("status not published", slog.Any("error", err))
	}
}

// onMessage runs on paho's goroutine: decode and queue, never block.
func (d *SimDevice) onMessage(m Message) {
	if _, kind, ok := d.topics.Parse(m.Topic); !ok || kind != TopicCmd {
		return
	}
	c, err := DecodeCommand(m.Payload)
	d.mu.Lock()
	if err != nil {
		d.counts.BadMessages++
		d.mu.Unlock()
		d.logger.Warn("bad command", slog.Any("error", err))
		return
	}
	d.counts.Received++
	d.mu.Unlock()
	select {
	case d.inbox <- c:
	default:
		d.logger.Warn("inbox full: command lost", slog.String("task", c.TaskKey))
	}
}

func (d *SimDevice) reply(ctx context.Context, kind string, r Reply) {
	b, _ := Encode(r)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.tr.Publish(ctx, d.topics.Device(d.id, kind), false, b); err != nil {
		d.logger.Debug("reply not published", slog.String("kind", kind), slog.Any("error", err))
	}
}

// receive decides for each command: stale, duplicate, or new.
func (d *SimDevice) receive(ctx context.Context) {
	for {
		var c CommandMessage
		select {
		case <-ctx.Done():
			return
		case c = <-d.inbox:
		}
		ack := Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: c.Attempt, OK: true}
		k := attemptKey{c.TaskKey, c.Attempt}
		now := time.Now().UTC()
		d.mu.Lock()
		high := d.highest[c.TaskKey]
		cached, isDone := d.done[k]
		inQueue := d.running != nil && d.running.TaskKey == c.TaskKey && d.running.Attempt == c.Attempt
		for _, q := range d.queue {
			inQueue = inQueue || (q.TaskKey == c.TaskKey && q.Attempt == c.Attempt)
		}
		var sendAck, sendResult bool
		switch {
		case c.Attempt < high:
			d.stale = append(d.stale, StaleAttempt{Device: d.id, TaskKey: c.TaskKey, Attempt: c.Attempt, Highest: high, At: now})
			ack.OK, ack.Code, ack.Error = false, CodeStale, fmt.Sprintf("stale attempt %d < %d", c.Attempt, high)
			sendAck = true
		case !isDone && !inQueue && !c.ExpiresAt.IsZero() && now.After(c.ExpiresAt):
			d.counts.Expired++
			ack.OK, ack.Code, ack.Error = false, CodeExpired, "expired at "+c.ExpiresAt.Format(time.RFC3339Nano)
			sendAck = true
		case isDone || inQueue:
			d.counts.Duplicates++
			sendAck = d.rng.Float64() >= d.cfg.DropAckRate
			sendResult = isDone
		default:
			d.highest[c.TaskKey] = c.Attempt
			if d.running != nil || len(d.queue) > 0 {
				o := Overlap{Device: d.id, TaskKey: c.TaskKey, Attempt: c.Attempt, At: now}
				if d.running != nil {
					o.RunningTask, o.RunningAttempt = d.running.TaskKey, d.running.Attempt
				} else {
					o.RunningTask, o.RunningAttempt = d.queue[0].TaskKey, d.queue[0].Attempt
				}
				d.overlaps = append(d.overlaps, o)
			}
			d.queue = append(d.queue, c)
			sendAck = d.rng.Float64() >= d.cfg.DropAckRate
		}
		if !sendAck {
			d.counts.DroppedAcks++
		}
		d.mu.Unlock()
		select {
		case d.work <- struct{}{}:
		default:
		}
		if ack.Code == CodeStale {
			d.logger.Warn("stale attempt refused", slog.String("task", c.TaskKey), slog.Int("attempt", c.Attempt), slog.Int("highest", high))
		}
		if sendAck {
			d.reply(ctx, TopicAck, ack)
		}
		if sendResult {
			d.reply(ctx, TopicResult, cached)
		}
	}
}

// execute runs queued commands one at a time.
func (d *SimDevice) execute(ctx context.Context) {
	for {
		d.mu.Lock()
		if len(d.queue) == 0 {
			d.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-d.work:
				continue
			}
		}
		c := d.queue[0]
		d.queue = d.queue[1:]
		d.running = &c
		d.mu.Unlock()

		run := Run{Device: d.id, TaskKey: c.TaskKey, Attempt: c.Attempt, CorrelationID: c.CorrelationID, Command: c.Command, Start: time.Now().UTC()}
		if d.cfg.Latency > 0 {
			t := time.NewTimer(d.cfg.Latency)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
		d.mu.Lock()
		fail := d.rng.Float64() < d.cfg.FailRate
		offline := d.rng.Float64() < d.cfg.OfflineRate
		run.End, run.OK = time.Now().UTC(), !fail
		res := Reply{CorrelationID: c.CorrelationID, TaskKey: c.TaskKey, Attempt: c.Attempt, OK: !fail}
		if fail {
			res.Error = "simulated failure"
			d.counts.Failed++
		} else {
			res.Output = []byte(fmt.Sprintf(`{"device":%q,"command":%q}`, d.id, c.Command))
		}
		d.counts.Ran++
		d.runs = append(d.runs, run)
		k := attemptKey{c.TaskKey, c.Attempt}
		d.done[k] = res
		d.doneOrder = append(d.doneOrder, k)
		if len(d.doneOrder) > 4096 {
			delete(d.done, d.doneOrder[0])
			d.doneOrder = d.doneOrder[1:]
		}
		d.running = nil
		d.mu.Unlock()
		d.reply(ctx, TopicResult, res)
		if offline {
			d.GoOffline(d.cfg.OfflineFor)
		}
	}
}

func (d *SimDevice) heartbeat(ctx context.Context) {
	t := time.NewTicker(d.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if d.tr.client.IsConnectionOpen() {
				d.publishStatus(true)
			}
		}
	}
}
