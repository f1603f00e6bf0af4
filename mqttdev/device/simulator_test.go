package device

import (
	"context"
	"errors"
	"testing"
	"time"

	mqtt "github.com/leasepool/leasepool/internal/mochi"
	"github.com/leasepool/leasepool/internal/mochi/packets"
	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/lifecycle"
	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/mqttdev/broker"
	"github.com/leasepool/leasepool/mqttdev/protocol"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testutil.PahoShutdownGoroutines()...)
}

// TestSimulatorStartStop: devices connect and say online on Start; a
// second Start is an error; Stop says offline, disconnects, and may be
// called again.
func TestSimulatorStartStop(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := broker.Listen(ctx, broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	topics := protocol.Topics{Prefix: "simtest"}
	statuses := make(chan protocol.Status, 16)
	if err := b.Server().Subscribe(topics.All(protocol.TopicStatus), 1, func(_ *mqtt.Client, _ packets.Subscription, pk packets.Packet) {
		if st, err := protocol.DecodeStatus(pk.Payload); err == nil {
			statuses <- st
		}
	}); err != nil {
		t.Fatal(err)
	}
	s, err := NewSimulator(Config{BrokerURL: b.URL(), Prefix: "simtest", Count: 1, Heartbeat: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if st := <-statuses; !st.Online || !s.Device(0).tr.Connected() {
		t.Fatalf("after Start: status %+v, connected %v", st, s.Device(0).tr.Connected())
	}
	if err := s.Start(ctx); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("second Start = %v, want ErrStarted", err)
	}
	for range 2 {
		if err := s.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if s.Device(0).tr.Connected() {
		t.Fatal("connected after Stop")
	}
	// An online status may come twice (paho resends a publish made while
	// it resumed the session); the offline one comes last.
	for {
		select {
		case st := <-statuses:
			if !st.Online {
				return
			}
		case <-ctx.Done():
			t.Fatal("no offline status after Stop")
		}
	}
}
