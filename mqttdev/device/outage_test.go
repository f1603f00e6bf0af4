package device

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/protocol"
)

// outageBound is how long after its start a simulated outage of
// outageLength may take to end in an online status: the outage itself,
// then at most a reconnect backoff step and a connect.
const (
	outageLength = time.Second
	outageBound  = 2 * time.Second
)

// TestOutagesEndWhenTheySay cuts every device's connection a few times
// over, on the embedded broker and on Mosquitto: each time a subscriber
// sees the device's will (offline) and then its online status, published
// no sooner than the outage's end and within outageBound of its start.
func TestOutagesEndWhenTheySay(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		testOutages(t, ctx, b.URL(), "outage")
	})
	t.Run("mosquitto", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// A prefix of this run's own: the shared broker keeps retained
		// statuses of earlier runs.
		testOutages(t, ctx, testservers.MQTTURL(t), "outage"+protocol.NewCorrelationID()[:8])
	})
}

type seenStatus struct {
	device string
	status protocol.Status
	at     time.Time
}

// watchStatuses subscribes to every status under topics and sends each
// one seen on the channel it returns (of capacity n), with a count of the
// times it lost its connection: on its clean session a will published
// while it reconnects would be lost, and only the retained status that
// followed it seen.
func watchStatuses(t *testing.T, ctx context.Context, url string, topics protocol.Topics, n int) (<-chan seenStatus, *atomic.Int64) {
	t.Helper()
	seen := make(chan seenStatus, n)
	// Counted, not logged: paho reports a loss on a goroutine of its own,
	// which may run after the test has ended.
	lost := new(atomic.Int64)
	sub, err := protocol.NewClient(protocol.ClientConfig{BrokerURL: url}, protocol.ClientOptions{
		Role: "admin", CleanSession: true,
		OnMessage: func(m protocol.Message) {
			id, kind, ok := topics.Parse(m.Topic)
			st, err := protocol.DecodeStatus(m.Payload)
			if ok && kind == protocol.TopicStatus && err == nil {
				seen <- seenStatus{device: id, status: st, at: time.Now()}
			}
		},
		OnLost: func(err error) {
			if !errors.Is(err, protocol.ErrDisconnected) {
				lost.Add(1)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(ctx, topics.All(protocol.TopicStatus)); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(ctx); err != nil {
		t.Fatalf("subscriber on %s: %v", url, err)
	}
	t.Cleanup(sub.Disconnect)
	return seen, lost
}

func testOutages(t *testing.T, ctx context.Context, url, prefix string) {
	topics := protocol.Topics{Prefix: prefix}
	seen, _ := watchStatuses(t, ctx, url, topics, 256)

	const count, outages = 3, 3
	// Device ids of this test's own (their client ids follow them): the
	// other outage test runs beside it on the same broker, and a client
	// id connecting twice takes over the other's session.
	s, err := NewSimulator(Config{BrokerURL: url, Prefix: prefix, IDPrefix: prefix + "-dev-", Count: count, OfflineFor: outageLength, Heartbeat: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.WithoutCancel(ctx))

	// Each device's last status seen, and since when.
	last := map[string]seenStatus{}
	awaitAll := func(what string, want func(seenStatus) bool) {
		t.Helper()
		for {
			n := 0
			for _, d := range s.Devices() {
				if st, ok := last[d.ID()]; ok && want(st) {
					n++
				}
			}
			if n == count {
				return
			}
			select {
			case st := <-seen:
				last[st.device] = st
			case <-ctx.Done():
				t.Fatalf("%s: last statuses seen %+v", what, last)
			}
		}
	}
	awaitAll("every device online after Start", func(st seenStatus) bool { return st.status.Online })

	for round := range outages {
		cut := time.Now()
		for _, d := range s.Devices() {
			d.GoOffline(outageLength)
		}
		// The will of each device, then its online status of after the
		// outage: a status of before the cut (a resent publish) is not it.
		offline := map[string]bool{}
		awaitAll("every device's will", func(st seenStatus) bool {
			offline[st.device] = offline[st.device] || (!st.status.Online && st.at.After(cut))
			return offline[st.device]
		})
		awaitAll("every device back online", func(st seenStatus) bool {
			return st.status.Online && st.at.After(cut) && !st.status.At.Before(cut)
		})
		for _, d := range s.Devices() {
			st := last[d.ID()]
			if back := st.status.At.Sub(cut); back < outageLength-50*time.Millisecond {
				t.Errorf("round %d: %s online %s after its outage began, before its end (%s)", round, d.ID(), back.Round(time.Millisecond), outageLength)
			}
			if back := st.at.Sub(cut); back > outageBound {
				t.Errorf("round %d: %s back online %s after its %s outage began, want within %s", round, d.ID(), back.Round(time.Millisecond), outageLength, outageBound)
			} else {
				t.Logf("round %d: %s back online %s after its %s outage began", round, d.ID(), back.Round(time.Millisecond), outageLength)
			}
		}
	}
	if got := s.Report().Totals().Outages; got != count*outages {
		t.Errorf("outages counted: %d, want %d", got, count*outages)
	}
}

// TestScheduledOutageEndsWhenItSays takes every tenth device of a fleet
// away at once for 2 s (Config.Outage), on the embedded broker and on
// Mosquitto: a subscriber sees each one's will, then its online status
// published no sooner than the outage's end and seen within a second of
// it; the report records each outage with its end and return.
func TestScheduledOutageEndsWhenItSays(t *testing.T) {
	t.Parallel()
	t.Run("embedded", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		testScheduledOutage(t, ctx, b.URL(), "soutage")
	})
	t.Run("mosquitto", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		testScheduledOutage(t, ctx, testservers.MQTTURL(t), "soutage"+protocol.NewCorrelationID()[:8])
	})
}

func testScheduledOutage(t *testing.T, ctx context.Context, url, prefix string) {
	const (
		count, every = 300, 10
		length       = 2 * time.Second
		slack        = time.Second
	)
	topics := protocol.Topics{Prefix: prefix}
	seen, lost := watchStatuses(t, ctx, url, topics, 4*count)

	idPrefix := prefix + "-dev-" // of its own: see testOutages
	s, err := NewSimulator(Config{BrokerURL: url, Prefix: prefix, IDPrefix: idPrefix, Count: count, Heartbeat: time.Minute,
		Outage: ScheduledOutage{Every: every, After: time.Second, For: length}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop(context.WithoutCancel(ctx))
	if got := s.Connected(); got != count {
		t.Errorf("Connected() after Start: %d, want %d", got, count)
	}

	// Per device away: when its will was seen, then its online status of
	// after the will.
	will, back := map[string]time.Time{}, map[string]seenStatus{}
	for len(back) < count/every {
		select {
		case st := <-seen:
			n, _ := strconv.Atoi(strings.TrimPrefix(st.device, idPrefix))
			switch {
			case n%every != 0:
			case !st.status.Online:
				if _, ok := will[st.device]; !ok {
					will[st.device] = st.at
				}
			case !will[st.device].IsZero():
				if _, ok := back[st.device]; !ok {
					back[st.device] = st
				}
			}
		case <-ctx.Done():
			t.Fatalf("%d of %d devices seen back after their outage (%d wills seen; the subscriber lost its connection %d times)", len(back), count/every, len(will), lost.Load())
		}
	}
	// The report marks a device back once its online status is
	// acknowledged, which may come just after the broker delivered it here.
	outages := map[string]Outage{}
	testutil.Within(5*time.Second, func() bool {
		clear(outages)
		for _, o := range s.Report().Outages {
			outages[o.Device] = o
		}
		for id := range back {
			if outages[id].Back.IsZero() {
				return false
			}
		}
		return true
	})
	if len(outages) != count/every {
		t.Errorf("report: %d outages, want %d", len(outages), count/every)
	}
	var latest time.Duration
	for id, st := range back {
		o, ok := outages[id]
		switch {
		case !ok:
			t.Errorf("%s: back online, no outage in the report", id)
		case st.status.At.Before(o.Until.Add(-50 * time.Millisecond)):
			t.Errorf("%s: online status of %s, before its outage's end %s", id, st.status.At, o.Until)
		case st.at.Sub(o.Until) > slack:
			t.Errorf("%s: back online %s after its outage's end, want within %s", id, st.at.Sub(o.Until).Round(time.Millisecond), slack)
		case o.Until.Sub(o.From) != length || o.Back.IsZero():
			t.Errorf("%s: outage %+v, want %s long and back", id, o, length)
		}
		latest = max(latest, st.at.Sub(o.From))
	}
	t.Logf("%d devices away for %s at once: the last seen back %s after its outage began", len(back), length, latest.Round(time.Millisecond))
}
