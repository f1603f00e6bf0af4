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
}

// NewSimulator checks cfg and prepares the devices.
func NewSimulator(cfg Config) (*Simulator, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	s := &Simulator{cfg: cfg}
	topics := protocol.Topics{Prefix: cfg.Prefix}
	for i := range cfg.Count {
		id := cfg.IDPrefix + strconv.Itoa(i)
		d := &Device{
			id:      id,
			cfg:     &s.cfg,
			topics:  topics,
			rng:     rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(i))),
			highest: map[string]int{},
			done:    map[attemptKey]protocol.Reply{},
			inbox:   make(chan protocol.CommandMessage, 1024),
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

// Device returns the i-th device.
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
			}
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
	return nil
}

// connectParallel bounds the devices connecting at once in Start.
const connectParallel = 32

// Stop stops the devices: their goroutines end, then each publishes its
// offline status and disconnects. It may be called again; ctx bounds the
// wait.
func (s *Simulator) Stop(ctx context.Context) error {
	return s.life.Stop(ctx, func() {
		for _, d := range s.devices {
			d.stop()
			if d.tr.Connected() {
				b, _ := protocol.Encode(protocol.Status{Online: false, At: time.Now().UTC()})
				pctx, c := context.WithTimeout(context.Background(), 2*time.Second)
				_ = d.tr.Publish(pctx, d.topics.Device(d.id, protocol.TopicStatus), true, b)
				c()
			}
			d.tr.Disconnect()
		}
	})
}

// Report returns what the devices saw so far.
func (s *Simulator) Report() *Report {
	r := &Report{}
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
func RunSimulator(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
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
	fmt.Fprintf(progress, "simulating %d devices (%s0..%s%d) on %s, prefix %s\n", s.cfg.Count, s.cfg.IDPrefix, s.cfg.IDPrefix, s.cfg.Count-1, redact.URL(s.cfg.BrokerURL), s.cfg.Prefix)
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
