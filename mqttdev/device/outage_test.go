package device

import (
	"context"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
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

func testOutages(t *testing.T, ctx context.Context, url, prefix string) {
	topics := protocol.Topics{Prefix: prefix}
	seen := make(chan seenStatus, 256)
	sub, err := protocol.NewClient(protocol.ClientConfig{BrokerURL: url}, protocol.ClientOptions{
		Role: "admin", CleanSession: true,
		OnMessage: func(m protocol.Message) {
			id, kind, ok := topics.Parse(m.Topic)
			st, err := protocol.DecodeStatus(m.Payload)
			if ok && kind == protocol.TopicStatus && err == nil {
				seen <- seenStatus{device: id, status: st, at: time.Now()}
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
	defer sub.Disconnect()

	const count, outages = 3, 3
	s, err := NewSimulator(Config{BrokerURL: url, Prefix: prefix, Count: count, OfflineFor: outageLength, Heartbeat: time.Minute})
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
