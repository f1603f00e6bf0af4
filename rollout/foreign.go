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

	"github.com/leasepool/leasepool/mqttdev"
	"github.com/leasepool/leasepool/task"
)

// foreign says why t, the task under one of a rollout's keys, is not the
// one the rollout publishes there, which sends want; "" when it is. A
// task is adopted only when running it sends the device exactly want
// (device, command, args, timeouts) under the device's lock, once: one
// published first by anyone else (a squatter) is not, whatever it holds.
func foreign(t *task.Task, want mqttdev.Command) string {
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
	}
	return ""
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
