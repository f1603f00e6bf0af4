// jsondec.go reads a task document without reflection: the store decodes
// one for every candidate a worker reads and every change event
// another process wrote.

package sqlitestore

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/leasepool/leasepool/task"
)

// parseJSON decodes a task document: the task.Task json.Unmarshal decodes
// into a new one, or its error. Documents as appendJSON writes them take a
// path without reflection; anything else that path does not expect (an
// unknown or differently cased field, an escaped string, a number that is
// not an integer, a null where appendJSON writes a value, white space) is
// handed to json.Unmarshal, so the result and the errors are its own.
func parseJSON(data []byte) (*task.Task, error) {
	d := jsonDecoder{b: data}
	t := new(task.Task)
	if d.task(t) && d.end() {
		return t, nil
	}
	t = new(task.Task)
	if err := json.Unmarshal(data, t); err != nil {
		return nil, err
	}
	return t, nil
}

// errFallback stops the fast path: json.Unmarshal decides.
var errFallback = errors.New("sqlitestore: fall back to encoding/json")

// jsonDecoder reads the JSON appendJSON writes. Each method reports false
// (with err set) when the input is not what it expects.
type jsonDecoder struct {
	b   []byte
	i   int
	err error
}

func (d *jsonDecoder) fail() bool {
	d.err = errFallback
	return false
}

func (d *jsonDecoder) end() bool { return d.err == nil && d.i == len(d.b) }

func (d *jsonDecoder) next(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *jsonDecoder) literal(s string) bool {
	if len(d.b)-d.i >= len(s) && string(d.b[d.i:d.i+len(s)]) == s {
		d.i += len(s)
		return true
	}
	return false
}

// object calls field for each key of an object, positioned at its value.
func (d *jsonDecoder) object(field func(key []byte) bool) bool {
	if !d.next('{') {
		return d.fail()
	}
	if d.next('}') {
		return true
	}
	for {
		key, ok := d.rawString()
		if !ok || !d.next(':') || !field(key) {
			return d.fail()
		}
		if d.next('}') {
			return true
		}
		if !d.next(',') {
			return d.fail()
		}
	}
}

// slice reads an array into *dst with elem reading each element, as
// json.Unmarshal does into a new slice: null is nil, [] an empty slice.
func slice[T any](d *jsonDecoder, dst *[]T, elem func(*T) bool) bool {
	if d.literal("null") {
		*dst = nil
		return true
	}
	if !d.next('[') {
		return d.fail()
	}
	out := []T{}
	if !d.next(']') {
		for {
			out = append(out, *new(T))
			if !elem(&out[len(out)-1]) {
				return d.fail()
			}
			if d.next(']') {
				break
			}
			if !d.next(',') {
				return d.fail()
			}
		}
	}
	*dst = out
	return true
}

// rawString returns the bytes of a string without escapes, valid UTF-8
// and no control characters: what json.Unmarshal returns unchanged.
func (d *jsonDecoder) rawString() ([]byte, bool) {
	if !d.next('"') {
		return nil, d.fail()
	}
	start := d.i
	ascii := true
	for ; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			if !ascii && !utf8.Valid(s) {
				return nil, d.fail()
			}
			return s, true
		case c == '\\' || c < 0x20:
			return nil, d.fail()
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, d.fail()
}

func (d *jsonDecoder) str(dst *string) bool {
	s, ok := d.rawString()
	if ok {
		*dst = string(s)
	}
	return ok
}

func (d *jsonDecoder) strs(dst *[]string) bool { return slice(d, dst, d.str) }

// int reads an integer literal (a JSON number without fraction or
// exponent), as json.Unmarshal does into an int.
func (d *jsonDecoder) int(dst *int64) bool {
	start := d.i
	d.next('-')
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	lit := d.b[start:d.i]
	if d.i < len(d.b) && (d.b[d.i] == '.' || d.b[d.i] == 'e' || d.b[d.i] == 'E') {
		return d.fail()
	}
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	// JSON has no leading zeros: "01" is json.Unmarshal's error to report.
	if len(digits) == 0 || (len(digits) > 1 && digits[0] == '0') {
		return d.fail()
	}
	n, err := strconv.ParseInt(string(lit), 10, strconv.IntSize)
	if err != nil {
		return d.fail()
	}
	*dst = n
	return true
}

func (d *jsonDecoder) intField(dst *int) bool {
	var n int64
	if !d.int(&n) {
		return false
	}
	*dst = int(n)
	return true
}

func (d *jsonDecoder) bool(dst *bool) bool {
	switch {
	case d.literal("true"):
		*dst = true
	case d.literal("false"):
		*dst = false
	default:
		return d.fail()
	}
	return true
}

// time reads an RFC 3339 string with time.Time's own UnmarshalJSON.
func (d *jsonDecoder) time(dst *time.Time) bool {
	start := d.i
	if _, ok := d.rawString(); !ok {
		return false
	}
	if err := dst.UnmarshalJSON(d.b[start:d.i]); err != nil {
		return d.fail()
	}
	return true
}

func (d *jsonDecoder) duration(dst *task.Duration) bool {
	s, ok := d.rawString()
	if !ok {
		return false
	}
	v, err := time.ParseDuration(string(s))
	if err != nil {
		return d.fail()
	}
	*dst = task.Duration(v)
	return true
}

// skip moves past one JSON value and returns its bytes; the caller
// validates them.
func (d *jsonDecoder) skip() ([]byte, bool) {
	start, depth := d.i, 0
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case '"':
			d.i++
			for d.i < len(d.b) && d.b[d.i] != '"' {
				if d.b[d.i] == '\\' {
					d.i++
				}
				d.i++
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return d.value(start)
			}
			depth--
		case ',':
			if depth == 0 {
				return d.value(start)
			}
		}
		d.i++
	}
	return d.value(start)
}

func (d *jsonDecoder) value(start int) ([]byte, bool) {
	v := d.b[start:min(d.i, len(d.b))]
	if len(v) == 0 || space(v[0]) || space(v[len(v)-1]) || !json.Valid(v) {
		return nil, d.fail()
	}
	return v, true
}

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// raw reads a json.RawMessage: a copy of the value's bytes.
func (d *jsonDecoder) raw(dst *json.RawMessage) bool {
	v, ok := d.skip()
	if ok {
		*dst = append(json.RawMessage(nil), v...)
	}
	return ok
}

// reflect decodes one value with json.Unmarshal (fields the fast path
// leaves to it, such as log lines).
func (d *jsonDecoder) reflect(dst any) bool {
	v, ok := d.skip()
	if !ok {
		return false
	}
	if err := json.Unmarshal(v, dst); err != nil {
		return d.fail()
	}
	return true
}

func (d *jsonDecoder) task(t *task.Task) bool {
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "_id":
			return d.str(&t.ID)
		case "key":
			return d.str(&t.Key)
		case "kind":
			return d.str(&t.Kind)
		case "payload":
			return d.raw(&t.Payload)
		case "trace":
			return d.object(func(key []byte) bool {
				switch string(key) {
				case "traceparent":
					return d.str(&t.Trace.Traceparent)
				case "tracestate":
					return d.str(&t.Trace.Tracestate)
				}
				return d.fail()
			})
		case "priority":
			return d.intField(&t.Priority)
		case "run_at":
			return d.time(&t.RunAt)
		case "seq":
			return d.int(&t.Seq)
		case "specific_worker_ids":
			return d.strs(&t.SpecificWorkerIDs)
		case "concurrent_worker_cnt":
			return d.intField(&t.ConcurrentWorkerCnt)
		case "success_worker_cnt":
			return d.intField(&t.SuccessWorkerCnt)
		case "max_unexpected_retries":
			return d.intField(&t.MaxUnexpectedRetries)
		case "ping_interval":
			return d.duration(&t.PingInterval)
		case "worker_timeout":
			return d.duration(&t.WorkerTimeout)
		case "lock_keys":
			return d.strs(&t.LockKeys)
		case "group":
			return d.str(&t.Group)
		case "workers":
			return d.workers(&t.Attempts)
		case "attempts":
			return d.intField(&t.AttemptsStarted)
		case "history":
			return d.workers(&t.History)
		case "history_dropped":
			return d.intField(&t.HistoryDropped)
		case "cancelled":
			return d.bool(&t.Cancelled)
		case "state":
			return d.str((*string)(&t.State))
		case "next_claim_at":
			return d.time(&t.NextClaimAt)
		case "version":
			return d.int(&t.Version)
		case "created_at":
			return d.time(&t.CreatedAt)
		case "updated_at":
			return d.time(&t.UpdatedAt)
		case "changes_version":
			return d.int(&t.ChangesVersion)
		case "changes":
			return d.changes(&t.Changes)
		}
		return d.fail()
	})
}

func (d *jsonDecoder) workers(dst *[]task.Attempt) bool { return slice(d, dst, d.worker) }

func (d *jsonDecoder) worker(w *task.Attempt) bool {
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "worker_id":
			return d.str(&w.WorkerID)
		case "instance":
			return d.str(&w.Instance)
		case "state":
			return d.str((*string)(&w.State))
		case "attempt":
			return d.intField(&w.Attempt)
		case "lease_until":
			return d.time(&w.LeaseUntil)
		case "started_at":
			return d.time(&w.StartedAt)
		case "claim_version":
			return d.int(&w.ClaimVersion)
		case "ended_at":
			return d.time(&w.EndedAt)
		case "slots":
			return d.strs(&w.Slots)
		case "error":
			return d.str(&w.Error)
		case "result":
			return d.raw(&w.Result)
		case "log":
			return d.reflect(&w.Log)
		case "log_dropped":
			return d.intField(&w.LogDropped)
		case "output_dropped":
			return d.bool(&w.OutputDropped)
		}
		return d.fail()
	})
}

func (d *jsonDecoder) changes(dst *[]task.Change) bool { return slice(d, dst, d.change) }

func (d *jsonDecoder) change(c *task.Change) bool {
	return d.object(func(key []byte) bool {
		switch string(key) {
		case "op":
			return d.str(&c.Op)
		case "worker_id":
			return d.str(&c.WorkerID)
		case "instance":
			return d.str(&c.Instance)
		case "attempt":
			return d.intField(&c.Attempt)
		case "error":
			return d.str(&c.Error)
		case "until":
			return d.time(&c.Until)
		case "log":
			return d.reflect(&c.Log)
		}
		return d.fail()
	})
}
