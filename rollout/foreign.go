// Telling a rollout's own device tasks from others under its keys.

package rollout

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// foreign says why t, the task under one of r's keys, is not the one r
// publishes there, which sends want; "" when it is. A task is adopted
// only when running it sends the device exactly want (device, command,
// args, timeouts) under the device's lock, once, and it runs when r's
// would: any worker may claim it, at r's priority, from its publish on.
// One published first by anyone else (a squatter) is not, whatever it
// holds: pinned to a worker that never comes, or to run a year on, it
// would hold its wave open for good.
func foreign(t *task.Task, r *Rollout, want mqttdev.Command) string {
	if t.Kind != mqttdev.Kind {
		return fmt.Sprintf("its kind is %q", t.Kind)
	}
	got, err := mqttdev.DecodePayload(t.Payload)
	if err != nil {
		return "its payload is not a device command"
	}
	// want with mqttdev's defaults filled, as got has them.
	b, err := json.Marshal(want)
	if err == nil {
		want, err = mqttdev.DecodePayload(b)
	}
	if err != nil {
		return "the rollout's own command does not encode: " + err.Error()
	}
	switch {
	case got.Device != want.Device:
		return fmt.Sprintf("it is for device %q", got.Device)
	case got.Command != want.Command:
		return fmt.Sprintf("its command is %q", got.Command)
	case !sameJSON(got.Args, want.Args):
		return "its args differ"
	}
	got.Args, want.Args = nil, nil
	switch {
	case !reflect.DeepEqual(got, want):
		return "its timeouts differ"
	case !slices.Contains(t.LockKeys, mqttdev.LockKey(want.Device)):
		return "it does not hold the device's lock"
	case t.ConcurrentWorkerCnt != 1 || t.SuccessWorkerCnt != 1 || t.MaxUnexpectedRetries != 0:
		return "it may run more than once"
	case len(t.SpecificWorkerIDs) > 0:
		return fmt.Sprintf("it is pinned to workers %q", t.SpecificWorkerIDs)
	case t.Priority != r.Spec.Priority:
		return fmt.Sprintf("its priority is %d, not the rollout's %d", t.Priority, r.Spec.Priority)
	case late(t, r):
		return fmt.Sprintf("it runs at %s, after its publish at %s", t.RunAt.UTC().Format(time.RFC3339), t.CreatedAt.UTC().Format(time.RFC3339))
	}
	return ""
}

// late reports whether t, never claimed yet, waits past its publish:
// the rollout publishes its tasks to run at once. A rollout that is
// withdrawing cancels every task under its keys not yet running (its own
// placeholders wait a day, withdrawTask), so when one would run does not
// matter then; and once claimed, a task's run_at moves only by its
// workers' doing (a retry's backoff, a snooze).
func late(t *task.Task, r *Rollout) bool {
	if r.State == StateAborting || r.State == StateCancelling || t.State.Finished() || t.AttemptsStarted > 0 {
		return false
	}
	return t.RunAt.After(t.CreatedAt)
}

// foreignError is the execution's error for a foreign task under key.
func foreignError(key, why string) string {
	return "a task not this rollout's holds its key (" + why + "): " + key
}

// sameJSON reports whether a and b are the same JSON value, as a store
// may hand it back: the same members in the same order, strings and
// numbers by value (1.0 and 1, \u003c and <).
func sameJSON(a, b json.RawMessage) bool {
	ca, errA := canonJSON(a)
	cb, errB := canonJSON(b)
	return errA == nil && errB == nil && ca == cb
}

func canonJSON(raw json.RawMessage) (string, error) {
	var out strings.Builder
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return out.String(), nil
		}
		if err != nil {
			return "", err
		}
		switch v := tok.(type) {
		case json.Delim:
			out.WriteString(v.String())
		case string:
			out.WriteString(strconv.Quote(v))
		case json.Number:
			if i, err := strconv.ParseInt(v.String(), 10, 64); err == nil {
				out.WriteString(strconv.FormatInt(i, 10))
			} else if f, err := v.Float64(); err == nil {
				out.WriteString(strconv.FormatFloat(f, 'g', -1, 64))
			} else {
				out.WriteString(v.String())
			}
		case bool:
			out.WriteString(strconv.FormatBool(v))
		case nil:
			out.WriteString("null")
		}
		out.WriteByte(' ')
	}
}
