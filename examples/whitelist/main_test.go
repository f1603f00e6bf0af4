package main

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/store"
	"github.com/leasepool/leasepool/task"
)

// TestWhitelist runs the example with devices that fail a fifth of their
// commands: every change ends applied by the attempt that succeeded, each
// device ran one command at a time and no more than the rate allows.
func TestWhitelist(t *testing.T) {
	path := filepath.Join(t.TempDir(), "whitelist.db")
	cfg := config{store: path, devices: 3, people: 4, rateN: 2, ratePer: 500 * time.Millisecond, failRate: 0.2}
	changes, err := run(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != cfg.devices*cfg.people {
		t.Fatalf("%d changes; want %d", len(changes), cfg.devices*cfg.people)
	}
	s, err := store.Open(t.Context(), "sqlite:"+path, store.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	type span struct{ from, to time.Time }
	byDevice := map[string][]span{}
	retried := 0
	for _, c := range changes {
		doc, err := s.Get(t.Context(), changeKey(c.ID))
		if err != nil {
			t.Fatalf("change %d's task: %v", c.ID, err)
		}
		var cmd mqttdev.Command
		if err := json.Unmarshal(doc.Payload, &cmd); err != nil || cmd.Device != c.Device {
			t.Errorf("change %d (%s) has the command %s", c.ID, c.Device, doc.Payload)
		}
		if doc.State != task.StateSucceeded || c.Status != "applied" {
			t.Errorf("change %d %s with its task %s; want applied and succeeded", c.ID, c.Status, doc.State)
		}
		var won int
		for _, a := range doc.AttemptHistory() {
			if a.State == task.AttemptSuccess {
				won = a.Attempt
			}
			byDevice[c.Device] = append(byDevice[c.Device], span{a.StartedAt, a.EndedAt})
		}
		if won != c.Attempt {
			t.Errorf("change %d written back by attempt %d; its task succeeded by attempt %d", c.ID, c.Attempt, won)
		}
		if won > 1 {
			retried++
		}
	}
	t.Logf("%d changes, %d applied after a failed attempt", len(changes), retried)
	for dev, spans := range byDevice {
		slices.SortFunc(spans, func(a, b span) int { return a.from.Compare(b.from) })
		for i := 1; i < len(spans); i++ {
			if spans[i].from.Before(spans[i-1].to) {
				t.Errorf("%s ran two commands at once: %v and %v", dev, spans[i-1], spans[i])
			}
		}
		for i := cfg.rateN; i < len(spans); i++ {
			if d := spans[i].from.Sub(spans[i-cfg.rateN].from); d < cfg.ratePer {
				t.Errorf("%s started %d commands within %s; the limit is %d per %s", dev, cfg.rateN+1, d, cfg.rateN, cfg.ratePer)
			}
		}
		if len(spans) < cfg.people {
			t.Errorf("%s ran %d commands; want at least %d", dev, len(spans), cfg.people)
		}
	}
}
