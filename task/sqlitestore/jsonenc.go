// jsonenc.go writes a task document as JSON without reflection: the store
// writes one for every claim, renewal and finish.

package sqlitestore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/leasepool/leasepool/task"
)

// appendJSON appends t as JSON to b: the document json.Marshal writes, byte
// for byte, except that '<', '>' and '&' are not escaped (as with
// json.Encoder.SetEscapeHTML(false)). It fails where json.Marshal fails: a
// time outside years 0-9999, or a result or payload that is not JSON.
// It avoids reflection because every write of a task encodes its whole
// document: through reflection, with time and duration marshalers whose
// output the encoder validates again, that is a large share of a busy
// worker's CPU.
func appendJSON(b []byte, t *task.Task) ([]byte, error) {
	e := jsonAppender{b: b}
	e.raw('{')
	if t.ID != "" {
		e.key(`_id`)
		e.str(t.ID)
		e.raw(',')
	}
	e.key(`key`)
	e.str(t.Key)
	e.field(`kind`)
	e.str(t.Kind)
	if len(t.Payload) > 0 {
		e.field(`payload`)
		e.rawJSON(t.Payload)
	}
	if !t.Trace.IsZero() {
		e.field(`trace`)
		e.raw('{')
		comma := false
		if t.Trace.Traceparent != "" {
			e.key(`traceparent`)
			e.str(t.Trace.Traceparent)
			comma = true
		}
		if t.Trace.Tracestate != "" {
			if comma {
				e.raw(',')
			}
			e.key(`tracestate`)
			e.str(t.Trace.Tracestate)
		}
		e.raw('}')
	}
	e.field(`priority`)
	e.int(int64(t.Priority))
	e.field(`run_at`)
	e.time(t.RunAt)
	e.field(`seq`)
	e.int(t.Seq)
	if len(t.SpecificWorkerIDs) > 0 {
		e.field(`specific_worker_ids`)
		e.strs(t.SpecificWorkerIDs)
	}
	e.field(`concurrent_worker_cnt`)
	e.int(int64(t.ConcurrentWorkerCnt))
	e.field(`success_worker_cnt`)
	e.int(int64(t.SuccessWorkerCnt))
	e.field(`max_unexpected_retries`)
	e.int(int64(t.MaxUnexpectedRetries))
	e.field(`ping_interval`)
	e.duration(t.PingInterval)
	e.field(`worker_timeout`)
	e.duration(t.WorkerTimeout)
	if len(t.LockKeys) > 0 {
		e.field(`lock_keys`)
		e.strs(t.LockKeys)
	}
	if t.Group != "" {
		e.field(`group`)
		e.str(t.Group)
	}
	e.field(`workers`)
	e.workers(t.Attempts)
	e.field(`attempts`)
	e.int(int64(t.AttemptsStarted))
	if len(t.History) > 0 {
		e.field(`history`)
		e.workers(t.History)
	}
	if t.HistoryDropped != 0 {
		e.field(`history_dropped`)
		e.int(int64(t.HistoryDropped))
	}
	if t.Cancelled {
		e.field(`cancelled`)
		e.b = append(e.b, "true"...)
	}
	e.field(`state`)
	e.str(string(t.State))
	e.field(`next_claim_at`)
	e.time(t.NextClaimAt)
	e.field(`version`)
	e.int(t.Version)
	e.field(`created_at`)
	e.time(t.CreatedAt)
	e.field(`updated_at`)
	e.time(t.UpdatedAt)
	if t.ChangesVersion != 0 {
		e.field(`changes_version`)
		e.int(t.ChangesVersion)
	}
	if len(t.Changes) > 0 {
		e.field(`changes`)
		e.raw('[')
		for i, c := range t.Changes {
			if i > 0 {
				e.raw(',')
			}
			e.change(c)
		}
		e.raw(']')
	}
	e.raw('}')
	return e.b, e.err
}

// jsonAppender appends JSON to b; the first error sticks.
type jsonAppender struct {
	b   []byte
	err error
}

func (e *jsonAppender) raw(c byte) { e.b = append(e.b, c) }

// key writes "name": (name needs no escaping).
func (e *jsonAppender) key(name string) {
	e.b = append(e.b, '"')
	e.b = append(e.b, name...)
	e.b = append(e.b, '"', ':')
}

// field writes ,"name":.
func (e *jsonAppender) field(name string) {
	e.raw(',')
	e.key(name)
}

func (e *jsonAppender) int(n int64) { e.b = strconv.AppendInt(e.b, n, 10) }

func (e *jsonAppender) duration(d task.Duration) {
	e.raw('"')
	e.b = append(e.b, time.Duration(d).String()...)
	e.raw('"')
}

func (e *jsonAppender) time(t time.Time) {
	if y := t.Year(); y < 0 || y > 9999 {
		e.fail(fmt.Errorf("json: time %s: year outside of range [0,9999]", t))
		return
	}
	e.raw('"')
	e.b = t.AppendFormat(e.b, time.RFC3339Nano)
	e.raw('"')
}

// rawJSON writes a json.RawMessage compacted, as json.Marshal does, which
// also refuses one that is not JSON.
func (e *jsonAppender) rawJSON(m json.RawMessage) {
	buf := bytes.NewBuffer(e.b)
	if err := json.Compact(buf, m); err != nil {
		e.fail(fmt.Errorf("json: raw message: %w", err))
		return
	}
	e.b = buf.Bytes()
}

func (e *jsonAppender) fail(err error) {
	if e.err == nil {
		e.err = err
	}
}

func (e *jsonAppender) strs(ss []string) {
	e.raw('[')
	for i, s := range ss {
		if i > 0 {
			e.raw(',')
		}
		e.str(s)
	}
	e.raw(']')
}

func (e *jsonAppender) workers(ws []task.Attempt) {
	if ws == nil {
		e.b = append(e.b, "null"...)
		return
	}
	e.raw('[')
	for i := range ws {
		if i > 0 {
			e.raw(',')
		}
		e.worker(&ws[i])
	}
	e.raw(']')
}

func (e *jsonAppender) worker(w *task.Attempt) {
	e.raw('{')
	e.key(`worker_id`)
	e.str(w.WorkerID)
	if w.Instance != "" {
		e.field(`instance`)
		e.str(w.Instance)
	}
	e.field(`state`)
	e.str(string(w.State))
	e.field(`attempt`)
	e.int(int64(w.Attempt))
	e.field(`lease_until`)
	e.time(w.LeaseUntil)
	e.field(`started_at`)
	e.time(w.StartedAt)
	if w.ClaimVersion != 0 {
		e.field(`claim_version`)
		e.int(w.ClaimVersion)
	}
	if !w.EndedAt.IsZero() {
		e.field(`ended_at`)
		e.time(w.EndedAt)
	}
	if w.Error != "" {
		e.field(`error`)
		e.str(w.Error)
	}
	if len(w.Result) > 0 {
		e.field(`result`)
		e.rawJSON(w.Result)
	}
	if len(w.Log) > 0 {
		e.field(`log`)
		e.log(w.Log)
	}
	if w.LogDropped != 0 {
		e.field(`log_dropped`)
		e.int(int64(w.LogDropped))
	}
	if w.OutputDropped {
		e.field(`output_dropped`)
		e.b = append(e.b, "true"...)
	}
	if len(w.Slots) > 0 {
		e.field(`slots`)
		e.strs(w.Slots)
	}
	e.raw('}')
}

func (e *jsonAppender) change(c task.Change) {
	e.raw('{')
	e.key(`op`)
	e.str(c.Op)
	if c.WorkerID != "" {
		e.field(`worker_id`)
		e.str(c.WorkerID)
	}
	if c.Instance != "" {
		e.field(`instance`)
		e.str(c.Instance)
	}
	if c.Attempt != 0 {
		e.field(`attempt`)
		e.int(int64(c.Attempt))
	}
	if c.Error != "" {
		e.field(`error`)
		e.str(c.Error)
	}
	if !c.Until.IsZero() {
		e.field(`until`)
		e.time(c.Until)
	}
	if len(c.Log) > 0 {
		e.field(`log`)
		e.log(c.Log)
	}
	e.raw('}')
}

func (e *jsonAppender) log(lines []task.LogLine) {
	e.raw('[')
	for i, l := range lines {
		if i > 0 {
			e.raw(',')
		}
		e.raw('{')
		e.key(`at`)
		e.time(l.At)
		e.field(`msg`)
		e.str(l.Msg)
		e.raw('}')
	}
	e.raw(']')
}

const hexDigits = "0123456789abcdef"

// str writes s quoted as encoding/json does without HTML escaping:
// control characters as \n, \r, \t, \b, \f or \u00XX, invalid UTF-8 as
// \ufffd, and U+2028 and U+2029 escaped.
func (e *jsonAppender) str(s string) {
	b := append(e.b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	e.b = append(b, '"')
}
