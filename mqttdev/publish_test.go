package mqttdev_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// TestDecodePayloadStrict: a device payload with a field it does not know
// (a misspelt ack_timeout) is refused with one line naming the field, as the
// exec and sleep payloads are.
func TestDecodePayloadStrict(t *testing.T) {
	t.Parallel()
	for _, payload := range []string{
		`{"device":"d1","command":"on","ack_timout":"1s"}`,
		`{"device":"d1","command":"on"} {"x":1}`,
	} {
		_, err := mqttdev.DecodePayload(json.RawMessage(payload))
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), "payload") || strings.Contains(err.Error(), "\n") {
			t.Errorf("DecodePayload(%s) = %v; want one-line ErrInvalid naming payload", payload, err)
		}
	}
	_, err := mqttdev.DecodePayload(json.RawMessage(`{"device":"d1","command":"on","ack_timout":"1s"}`))
	if err == nil || !strings.Contains(err.Error(), "ack_timout") {
		t.Errorf("error %v does not name ack_timout", err)
	}
	c, err := mqttdev.DecodePayload(json.RawMessage(`{"device":"d1","command":"on","ack_timeout":"2s"}`))
	if err != nil || time.Duration(c.AckTimeout) != 2*time.Second {
		t.Errorf("DecodePayload of a good payload = %+v, %v", c, err)
	}
}

// TestPublishParamsValidatesOnce: the params PublishParams returns are as
// given (defaults are filled by task.NewTask, once): NoRetries stays
// NoRetries however often they are validated.
func TestPublishParamsValidatesOnce(t *testing.T) {
	t.Parallel()
	p, err := mqttdev.PublishParams("k", mqttdev.Command{Device: "d1", Command: "on"},
		task.Options{MaxUnexpectedRetries: task.NoRetries, SpecificWorkerIDs: []string{"w1"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	if p.MaxUnexpectedRetries != task.NoRetries || p.ConcurrentWorkerCnt != 0 {
		t.Errorf("params changed: retries %d concurrent %d", p.MaxUnexpectedRetries, p.ConcurrentWorkerCnt)
	}
	tk, err := task.NewTask(p, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if tk.MaxUnexpectedRetries != 0 {
		t.Errorf("document retries %d, want 0 (none)", tk.MaxUnexpectedRetries)
	}
}
