package mqttdev

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

func TestPrepareFlow(t *testing.T) {
	spec := flow.Spec{Key: "seq", Steps: []flow.Step{
		{Name: "open", Action: flow.Action{Kind: Kind, Payload: json.RawMessage(`{"device":"valve-3","command":"open"}`)},
			Rollback: &flow.Action{Kind: Kind, Payload: json.RawMessage(`{"device":"valve-3","command":"close"}`)}},
		{Name: "note", Action: flow.Action{Kind: "exec", Payload: json.RawMessage(`{"argv":["true"]}`)}},
		{Name: "pump", Action: flow.Action{Kind: Kind, Payload: json.RawMessage(`{"device":"pump-7","command":"start"}`), LockKeys: []string{"site:a"}}},
	}}
	if err := PrepareFlow(&spec); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		got, want []string
	}{
		{spec.Steps[0].LockKeys, []string{"device:valve-3"}},
		{spec.Steps[0].Rollback.LockKeys, []string{"device:valve-3"}},
		{spec.Steps[1].LockKeys, nil},
		{spec.Steps[2].LockKeys, []string{"site:a", "device:pump-7"}},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("lock keys %v, want %v", c.got, c.want)
		}
	}
	if err := PrepareFlow(&spec); err != nil || len(spec.Steps[0].LockKeys) != 1 {
		t.Errorf("again: %v, %v: want the same lock keys", err, spec.Steps[0].LockKeys)
	}

	for payload, want := range map[string]string{
		`{"device":"valve-3","command":"open","ack_timout":"1s"}`:       "steps[0].rollback.payload: device: json: unknown field",
		`{"device":"a/b","command":"open"}`:                             "steps[0].rollback.payload: device:",
		`{"device":"valve-3","command":"open","offline_timeout":"-1s"}`: "steps[0].rollback.payload: offline_timeout: must not be negative",
	} {
		bad := flow.Spec{Key: "bad", Steps: []flow.Step{{Name: "s", Action: flow.Action{Kind: Kind, Payload: json.RawMessage(`{"device":"d","command":"c"}`)},
			Rollback: &flow.Action{Kind: Kind, Payload: json.RawMessage(payload)}}}}
		err := PrepareFlow(&bad)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("rollback payload %s: %v, want an invalid error containing %q", payload, err, want)
		}
	}
}
