// The simulator: a fleet of devices started and stopped together.

package device

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/redact"
	"github.com/leasepool/leasepool/mqttdev/protocol"
)

// Simulator runs simulated devices, each with its own MQTT client, last
// will and heartbeat. Use Start and Stop in process, or RunSimulator.
type Simulator struct {
	cfg     Config
	devices []*Device
	life    lifecycle.Runner
	// connected counts the devices Start has connected so far.
	connected atomic.Int64
}

// NewSimulator checks cfg and prepares the devices.
func NewSimulator(cfg Config) (*Simulator, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	s := &Simulator{cfg: cfg}
	topics := protocol.Topics{Prefix: cfg.Prefix}
	for n := range cfg.Count {
		i := cfg.First + n
		id := cfg.IDPrefix + strconv.Itoa(i)
		d := &Device{
			id:      id,
			cfg:     &s.cfg,
			topics:  topics,
			rng:     rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))),
			highest: map[string]int{},
			done:    map[attemptKey]protocol.Reply{},
			arrived: make(chan struct{}, 1),
			work:    make(chan struct{}, 1),
			counts:  Counts{ID: id},
			logger:  cfg.Logger.With(slog.String("device", id)),
		}
		d.life, d.endLife = context.WithCancel(context.Background())
		if cfg.Attributes != nil {
			d.attrs = cfg.Attributes(i, id)
			if err := d.attrs.Validate("attributes"); err != nil {
				return nil, fmt.Errorf("simulator: device %s: %w", id, err)
			}
		}
		if cfg.Behavior != nil {
			d.behave = cfg.Behavior(i)
		}
		cc := protocol.ClientConfig{
			BrokerURL: cfg.BrokerURL,
			ClientID:  "leasepool-sim-" + id, // device id's own: broker.SimClientIDPrefix
			Username:  cfg.Username,
			Password:  cfg.Password,
		}
		if secret, ok := cfg.Secrets[id]; ok {
			cc.Username, cc.Password = id, secret
		}
		tr, err := protocol.NewClient(cc, protocol.ClientOptions{
			Role:        "sim",
			OnMessage:   d.onMessage,
			OnConnect:   d.onConnect,
			WillTopic:   topics.Device(id, protocol.TopicStatus),
			WillPayload: func() []byte { b, _ := protocol.Encode(protocol.Status{Online: false, At: time.Now().UTC()}); return b },
			Dial:        d.dial,
			Logger:      d.logger,
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
func (s *Simulator) Devices() []*Device { return s.devices }

// Device returns the i-th device of this simulator (its id's index is
// Config.First+i).
func (s *Simulator) Device(i int) *Device { return s.devices[i] }

// Start connects every device (retrying until ctx ends), subscribes them to
// their command topics, publishes their online status, and starts their
// heartbeats and executors. ctx bounds the start only. A second call
// returns lifecycle.ErrStarted.
func (s *Simulator) Start(ctx context.Context) error {
	run, err := s.life.Start(ctx)
	if err != nil {
		return fmt.Errorf("simulator: %w", err)
	}
	// Devices connect a few at a time: a fleet of hundreds is up in a
	// second, not one round trip after another.
	sem := make(chan struct{}, connectParallel)
	errs := make(chan error, len(s.devices))
	var wg sync.WaitGroup
	for _, d := range s.devices {
		_ = d.tr.Subscribe(ctx, d.topics.Device(d.id, protocol.TopicCmd))
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := d.tr.Connect(ctx); err != nil {
				errs <- fmt.Errorf("simulator: device %s: %w", d.id, err)
				return
			}
			s.connected.Add(1)
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		_ = s.Stop(context.WithoutCancel(ctx))
		return err
	}
	for _, d := range s.devices {
		s.life.Go(func() { d.receive(run) })
		s.life.Go(func() { d.execute(run) })
		s.life.Go(func() { d.heartbeat(run) })
	}
	if o := s.cfg.Outage; o.Every > 0 {
		s.life.Go(func() { s.scheduledOutage(run, o) })
	}
	return nil
}

// Connected returns how many devices Start has connected so far: its
// progress, for a fleet that takes seconds to come up.
func (s *Simulator) Connected() int { return int(s.connected.Load()) }

// scheduledOutage takes every o.Every-th device away at once, o.After
// after the start, for o.For (and its share of o.Spread).
func (s *Simulator) scheduledOutage(ctx context.Context, o ScheduledOutage) {
	t := time.NewTimer(o.After)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	var away []*Device
	for n, d := range s.devices {
		if (s.cfg.First+n)%o.Every == 0 {
			away = append(away, d)
		}
	}
	for k, d := range away {
		d.GoOffline(o.For + o.Spread*time.Duration(k)/time.Duration(len(away)))
	}
}

// connectParallel bounds the devices connecting at once in Start.
const connectParallel = 32

// fileHeadroom is the open files a simulator needs beside one connection
// per device: the runtime's, the log's, a store's.
const fileHeadroom = 64

// Stop stops the devices: their goroutines end, then each publishes its
// offline status and disconnects. It may be called again; ctx bounds the
// wait.
func (s *Simulator) Stop(ctx context.Context) error {
	return s.life.Stop(ctx, func() {
		// Every life ends first, so that every device away leaves its
		// dial at once; a disconnect then waits for its client's
		// reconnect loop to end, at most a backoff step, and the
		// disconnects side by side wait for those steps together rather
		// than one after another.
		for _, d := range s.devices {
			d.mu.Lock()
			d.endLife()
			d.mu.Unlock()
		}
		sem := make(chan struct{}, stopParallel)
		var wg sync.WaitGroup
		for _, d := range s.devices {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				d.stop()
				if d.tr.Connected() {
					b, _ := protocol.Encode(protocol.Status{Online: false, At: time.Now().UTC()})
					pctx, c := context.WithTimeout(context.Background(), 2*time.Second)
					_ = d.tr.Publish(pctx, d.topics.Device(d.id, protocol.TopicStatus), true, b)
					c()
				}
				d.tr.Disconnect()
			}()
		}
		wg.Wait()
	})
}

// stopParallel bounds the devices Stop disconnects at once.
const stopParallel = 256

// Report returns what the devices saw so far.
func (s *Simulator) Report() *Report {
	r := &Report{}
	for _, d := range s.devices {
		d.mu.Lock()
		r.Devices = append(r.Devices, d.counts)
		r.Runs = append(r.Runs, d.runs...)
		r.Overlaps = append(r.Overlaps, d.overlaps...)
		r.StaleAttempts = append(r.StaleAttempts, d.stale...)
		r.Outages = append(r.Outages, d.outages...)
		d.mu.Unlock()
	}
	return r
}

// RunOptions bound a RunSimulator.
type RunOptions struct {
	// Duration, when positive, is how long the simulation runs from the
	// moment every device is up (a fleet of thousands takes seconds to
	// connect); zero runs until ctx ends.
	Duration time.Duration
	// StartTimeout, when positive, bounds the start: devices that cannot
	// connect (a broker away, a credential refused) are retried until
	// then.
	StartTimeout time.Duration
}

// RunSimulator runs a simulation as opts say, writing a progress line to
// progress every second while the devices connect and every few seconds
// after, and the summary at the end; it returns the report. progress may
// be nil.
func RunSimulator(ctx context.Context, cfg Config, opts RunOptions, progress io.Writer) (*Report, error) {
	if progress == nil {
		progress = io.Discard
	}
	s, err := NewSimulator(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := RaiseFileLimit(cfg.Count + fileHeadroom); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	fmt.Fprintf(progress, "simulating %d devices (%s%d..%s%d) on %s, prefix %s\n", s.cfg.Count, s.cfg.IDPrefix, s.cfg.First,
		s.cfg.IDPrefix, s.cfg.First+s.cfg.Count-1, redact.URL(s.cfg.BrokerURL), s.cfg.Prefix)
	begin := time.Now()
	started := make(chan struct{})
	var printing sync.WaitGroup
	printing.Add(1)
	go func() {
		defer printing.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-started:
				return
			case <-t.C:
				fmt.Fprintf(progress, "connecting: %d of %d devices up (%s)\n", s.Connected(), s.cfg.Count, time.Since(begin).Round(100*time.Millisecond))
			}
		}
	}()
	sctx := ctx
	if opts.StartTimeout > 0 {
		var cancel context.CancelFunc
		sctx, cancel = context.WithTimeoutCause(ctx, opts.StartTimeout, fmt.Errorf("devices not up within %s", opts.StartTimeout))
		defer cancel()
	}
	err = s.Start(sctx)
	close(started)
	printing.Wait()
	if err != nil {
		return nil, fmt.Errorf("%w (%d of %d devices up)", err, s.Connected(), s.cfg.Count)
	}
	fmt.Fprintf(progress, "connected: %d devices up in %s\n", s.Connected(), time.Since(begin).Round(100*time.Millisecond))
	if o := s.cfg.Outage; o.Every > 0 {
		fmt.Fprintf(progress, "outage: every %dth device away %s after the start, for %s (returns spread over %s)\n", o.Every, o.After, o.For, o.Spread)
	}
	if opts.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.Duration)
		defer cancel()
	}
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
