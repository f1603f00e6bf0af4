// FaultTransport: the fault-injecting wrapper of unit tests.

package protocol

import (
	"context"
	"sync"
	"time"
)

// FaultTransport wraps a Transport and injects faults, for unit tests:
// Drop loses a publish silently (the broker never sees it, the caller sees
// success), Delay holds each publish back, Err fails it, and
// InjectDisconnect takes the connection down for a while.
type FaultTransport struct {
	Inner Transport

	mu    sync.Mutex
	drop  func(topic string, payload []byte) bool
	delay time.Duration
	err   error
	count map[string]int
}

// NewFaultTransport wraps inner with no faults set.
func NewFaultTransport(inner Transport) *FaultTransport {
	return &FaultTransport{Inner: inner, count: map[string]int{}}
}

// SetDrop sets the function that decides which publishes are lost; nil
// loses none.
func (f *FaultTransport) SetDrop(fn func(topic string, payload []byte) bool) {
	f.mu.Lock()
	f.drop = fn
	f.mu.Unlock()
}

// SetDelay delays every publish by d.
func (f *FaultTransport) SetDelay(d time.Duration) { f.mu.Lock(); f.delay = d; f.mu.Unlock() }

// SetErr makes every publish fail with err; nil clears it.
func (f *FaultTransport) SetErr(err error) { f.mu.Lock(); f.err = err; f.mu.Unlock() }

// Published reports how many publishes to topic were attempted.
func (f *FaultTransport) Published(topic string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[topic]
}

func (f *FaultTransport) Publish(ctx context.Context, topic string, retained bool, payload []byte) error {
	f.mu.Lock()
	f.count[topic]++
	drop, delay, err := f.drop, f.delay, f.err
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	if err != nil {
		return err
	}
	if drop != nil && drop(topic, payload) {
		return nil
	}
	return f.Inner.Publish(ctx, topic, retained, payload)
}

func (f *FaultTransport) Subscribe(ctx context.Context, filter string) error {
	return f.Inner.Subscribe(ctx, filter)
}

func (f *FaultTransport) Connect(ctx context.Context) error { return f.Inner.Connect(ctx) }

func (f *FaultTransport) Disconnect() { f.Inner.Disconnect() }

func (f *FaultTransport) Connected() bool { return f.Inner.Connected() }

// InjectDisconnect drops the connection (as Disconnect: the user's OnLost
// runs), keeps it down for down, then connects again, within ctx. Publishes
// meanwhile fail as on a real outage.
func (f *FaultTransport) InjectDisconnect(ctx context.Context, down time.Duration) error {
	f.Inner.Disconnect()
	t := time.NewTimer(down)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return f.Inner.Connect(ctx)
}
