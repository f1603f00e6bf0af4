package mqttdev

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func TestPublishParams(t *testing.T) {
	t.Parallel()
	p, err := PublishParams("job-1", Command{Device: "pump-7", Command: "open", Args: json.RawMessage(`{"pct":50}`)},
		task.Options{LockKeys: []string{"site:a"}, Priority: 2})
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != Kind || p.Priority != 2 || fmt.Sprint(p.LockKeys) != "[site:a device:pump-7]" {
		t.Fatalf("params: %+v", p)
	}
	c, err := DecodePayload(p.Payload)
	if err != nil || c.Device != "pump-7" || time.Duration(c.AckTimeout) != DefaultAckTimeout || c.MaxPublishes != DefaultMaxPublishes {
		t.Fatalf("DecodePayload = %+v, %v", c, err)
	}
	// The lock key is not added twice.
	p, _ = PublishParams("job-1", Command{Device: "d", Command: "x"}, task.Options{LockKeys: []string{"device:d"}})
	if len(p.LockKeys) != 1 {
		t.Fatalf("lock keys %v", p.LockKeys)
	}
	for name, tc := range map[string]struct {
		key  string
		c    Command
		opts task.Options
		want string
	}{
		"injection":   {"k", Command{Device: "a/#", Command: "x"}, task.Options{}, "device"},
		"nul":         {"k", Command{Device: "x\x00", Command: "x"}, task.Options{}, "device"},
		"no command":  {"k", Command{Device: "d"}, task.Options{}, "command"},
		"args":        {"k", Command{Device: "d", Command: "x", Args: json.RawMessage(`"s"`)}, task.Options{}, "args"},
		"publishes":   {"k", Command{Device: "d", Command: "x", MaxPublishes: -1}, task.Options{}, "max_publishes"},
		"ack timeout": {"k", Command{Device: "d", Command: "x", AckTimeout: -1}, task.Options{}, "ack_timeout"},
		"key":         {"", Command{Device: "d", Command: "x"}, task.Options{}, "key"},
		"options":     {"k", Command{Device: "d", Command: "x"}, task.Options{PingInterval: time.Second, WorkerTimeout: time.Second}, "worker_timeout"},
	} {
		_, err := PublishParams(tc.key, tc.c, tc.opts)
		if !errors.Is(err, task.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrInvalid naming %s", name, err, tc.want)
		}
	}
}
