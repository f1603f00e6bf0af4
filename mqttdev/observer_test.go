package mqttdev

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev/device"
	"github.com/leasepool/leasepool/task"
)

// recorder keeps what the handler reported.
type recorder struct {
	mu     sync.Mutex
	events []CommandEvent
}

func (r *recorder) CommandDone(e CommandEvent) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// TestObserverOutcomes runs a command that succeeds, one nobody acks and
// one whose result never comes, through a real broker and simulated
// device, and checks the observer was told each outcome once, with the
// round trip of the one that came back.
func TestObserverOutcomes(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := setup(t, setupOpts{sim: device.Config{Latency: 100 * time.Millisecond}, observer: rec})
	if err := e.handler.Handle(ctxT(t, 20*time.Second), job("obs-ok", 1, Command{Device: e.dev(0), Command: "x"})); err != nil {
		t.Fatalf("Handle ok: %v", err)
	}
	err := e.handler.Handle(ctxT(t, 20*time.Second), job("obs-noack", 1, Command{Device: e.prefix + "-silent", Command: "x",
		AckTimeout: task.Duration(100 * time.Millisecond), MaxPublishes: 2}))
	if !errors.Is(err, ErrNoAck) {
		t.Fatalf("Handle silent device = %v, want ErrNoAck", err)
	}
	err = e.handler.Handle(ctxT(t, 20*time.Second), job("obs-rt", 1, Command{Device: e.dev(0), Command: "x",
		ResultTimeout: task.Duration(50 * time.Millisecond)}))
	if !errors.Is(err, ErrResultTimeout) {
		t.Fatalf("Handle = %v, want ErrResultTimeout", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	want := []CommandOutcome{CommandOK, CommandNoAck, CommandResultTimeout}
	if len(rec.events) != len(want) {
		t.Fatalf("observed %+v, want outcomes %v", rec.events, want)
	}
	for i, ev := range rec.events {
		if ev.Outcome != want[i] {
			t.Errorf("event %d: outcome %s, want %s", i, ev.Outcome, want[i])
		}
	}
	if ok := rec.events[0]; !ok.Outcome.RoundTrip() || ok.Duration < 100*time.Millisecond {
		t.Errorf("ok event %+v: want a round trip of at least the device's 100ms latency", ok)
	}
}
