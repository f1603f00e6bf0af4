package protocol

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testservers"
	"github.com/leasepool/leasepool/mqttdev/broker"
)

func startBroker(t *testing.T) string {
	t.Helper()
	b, err := broker.Listen(t.Context(), broker.Config{Addr: "127.0.0.1:0", Anonymous: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b.URL()
}

func connectClient(t *testing.T, url, id string, onMessage func(Message), filters ...string) *Client {
	t.Helper()
	c, err := NewClient(ClientConfig{BrokerURL: url, ClientID: id}, ClientOptions{Role: "test", CleanSession: true, OnMessage: onMessage})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, f := range filters {
		if err := c.Subscribe(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Disconnect)
	return c
}

// TestConnectReturnsSubscribed: a message published the moment Connect
// returns reaches the subscriber. A subscription still on its way would
// let a live message (a device's will, a reply) pass by unseen.
func TestConnectReturnsSubscribed(t *testing.T) {
	t.Parallel()
	url := startBroker(t)
	pub := connectClient(t, url, "pub", func(Message) {})
	const clients = 10
	got := make(chan string, clients)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for i := range clients {
		topic := fmt.Sprintf("sub/%d", i)
		connectClient(t, url, "sub-"+strconv.Itoa(i), func(m Message) { got <- m.Topic }, topic)
		if err := pub.Publish(ctx, topic, false, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	deadline := time.After(3 * time.Second)
	for len(seen) < clients {
		select {
		case topic := <-got:
			seen[topic] = true
		case <-deadline:
			t.Fatalf("%d of %d messages published right after Connect arrived: %v", len(seen), clients, seen)
		}
	}
}

// TestConnectRefused: a broker that refuses the client's credentials
// (Mosquitto allowing no anonymous client) makes Connect fail with
// ErrRefused, not wait for its context to end: paho would retry the
// refusal silently for as long as it is let.
func TestConnectRefused(t *testing.T) {
	t.Parallel()
	url, _, _ := testservers.StartMosquittoAuth(t, "allow_anonymous false\n")
	for _, cfg := range []ClientConfig{
		{BrokerURL: url, ClientID: "anonymous"},
		{BrokerURL: url, ClientID: "stranger", Username: "stranger", Password: "guess"},
	} {
		c, err := NewClient(cfg, ClientOptions{Role: "test", CleanSession: true, OnMessage: func(Message) {}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		err = c.Connect(ctx)
		cancel()
		if !errors.Is(err, ErrRefused) {
			t.Errorf("%s: Connect: %v, want an error wrapping ErrRefused", cfg.ClientID, err)
		}
	}
}

// TestMessagesArriveInTheBrokersOrder: OnMessage gets a topic's messages
// in the order they were published, as a device's online status and the
// will after it must arrive.
func TestMessagesArriveInTheBrokersOrder(t *testing.T) {
	t.Parallel()
	url := startBroker(t)
	const n = 300
	var (
		mu   sync.Mutex
		seq  []int
		done = make(chan struct{})
	)
	connectClient(t, url, "sub", func(m Message) {
		i, _ := strconv.Atoi(string(m.Payload))
		mu.Lock()
		defer mu.Unlock()
		seq = append(seq, i)
		if len(seq) == n {
			close(done)
		}
	}, "status/+")
	pub := connectClient(t, url, "pub", func(Message) {})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for i := range n {
		if err := pub.Publish(ctx, "status/d1", true, []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d messages arrived", len(seq), n)
	}
	mu.Lock()
	defer mu.Unlock()
	for i, v := range seq {
		if v != i {
			t.Fatalf("message %d arrived as number %d: %v", v, i, seq)
		}
	}
}
