// The size of a rollout's document: how it is encoded, the bounds every
// write keeps, and the largest document a rollout can grow to over its
// life, which Create checks against the store's limit.

package rollout

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasepool/leasepool/task"
)

// Bounds of what a rollout's document holds, in bytes as stored (JSON
// without HTML escaping). With them, the largest document a rollout can
// reach is known at create (MaxSize), so a rollout accepted can always be
// written.
const (
	// MaxArgsLen bounds Spec.Args and Spec.RollbackArgs, compacted.
	MaxArgsLen = 64 << 10
	// MaxDispatched is how many dispatch times Exec.Dispatched keeps: the
	// last ones.
	MaxDispatched = 8
	// MaxErrorLen bounds Exec.Error; MaxReasonLen Rollout.Reason;
	// MaxDetailLen Event.Detail.
	MaxErrorLen  = 160
	MaxReasonLen = 256
	MaxDetailLen = 256
	// SizeMargin is what checkSize keeps free under the store's limit
	// beyond MaxSize: room for a field a later version writes that
	// MaxSize does not know of, rather than a rollout wedged at its next
	// write.
	SizeMargin = 1 << 10
)

// encode is the document as stored: JSON without HTML escaping, so that
// '<', '>' and '&' take one byte each, as counted at create.
func encode(r *Rollout) ([]byte, error) { return encodeJSON(r) }

func encodeJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// bound holds r to the bounds every write keeps: texts clipped, the last
// MaxDispatched dispatch times per device, and the args free of the HTML
// escapes a document written by json.Marshal holds (six bytes for one).
func (r *Rollout) bound() {
	r.Spec.Args = unescapeHTML(r.Spec.Args)
	r.Spec.RollbackArgs = unescapeHTML(r.Spec.RollbackArgs)
	r.Reason = clip(r.Reason, MaxReasonLen)
	for i := range r.Events {
		r.Events[i].Detail = clip(r.Events[i].Detail, MaxDetailLen)
	}
	for i := range r.Devices {
		e := &r.Devices[i]
		e.Error = clip(e.Error, MaxErrorLen)
		if n := len(e.Dispatched) - MaxDispatched; n > 0 {
			e.Dispatched = slices.Delete(e.Dispatched, 0, n)
		}
	}
}

// clip returns s with every rune that is not printable (or not UTF-8)
// replaced by '?', cut to at most n bytes as JSON encodes it (a '"' or a
// '\' takes two).
func clip(s string, n int) string {
	clean := true
	size := 0
	for _, c := range s {
		if c == utf8.RuneError || !unicode.IsPrint(c) {
			clean = false
			break
		}
		size += runeCost(c)
	}
	if clean && size <= n {
		return s
	}
	var b strings.Builder
	size = 0
	for _, c := range s {
		if c == utf8.RuneError || !unicode.IsPrint(c) {
			c = '?'
		}
		if size += runeCost(c); size > n {
			break
		}
		b.WriteRune(c)
	}
	return b.String()
}

func runeCost(c rune) int {
	if c == '"' || c == '\\' {
		return 2
	}
	return utf8.RuneLen(c)
}

// unescapeHTML undoes the escapes of '<', '>' and '&' (\u003c, \u003e,
// \u0026) in valid JSON: the same value, in fewer bytes.
func unescapeHTML(src json.RawMessage) json.RawMessage {
	if !bytes.Contains(src, []byte(`\u00`)) {
		return src
	}
	out := make([]byte, 0, len(src))
	for i := 0; i < len(src); i++ {
		c := src[i]
		if c != '\\' || i+1 >= len(src) {
			out = append(out, c)
			continue
		}
		// A backslash is an escape, inside a string.
		if src[i+1] == 'u' && i+5 < len(src) {
			switch strings.ToLower(string(src[i+2 : i+6])) {
			case "003c":
				out, i = append(out, '<'), i+5
				continue
			case "003e":
				out, i = append(out, '>'), i+5
				continue
			case "0026":
				out, i = append(out, '&'), i+5
				continue
			}
		}
		// Any other escape: its second byte too, so that "\\" stays one.
		out, i = append(out, c, src[i+1]), i+1
	}
	return out
}

// compactArgs is args as stored: compact, not HTML-escaped.
func compactArgs(args json.RawMessage) json.RawMessage {
	if len(args) == 0 {
		return args
	}
	var b bytes.Buffer
	if err := json.Compact(&b, args); err != nil {
		return args // Validate refuses it
	}
	return b.Bytes()
}

// MaxSize is the largest document r's own can grow to over its life
// (its executions are in shards: MaxShardSize): every wave approved,
// started, ended and stopped (an abort or a cancel after retry-failed
// reopened every wave stops them all) and its counts at their longest,
// every event at its longest, the rate's window full, every time and
// version at its longest. Only the name, spec, devices and waves, fixed
// at create, are r's own.
func (r *Rollout) MaxSize() (int, error) {
	far := farTime()
	quotes := func(n int) string { return strings.Repeat(`"`, n/2) }
	w := *r
	w.Devices, w.sums = nil, nil
	w.Spec.Args, w.Spec.RollbackArgs = unescapeHTML(r.Spec.Args), unescapeHTML(r.Spec.RollbackArgs)
	w.State, w.Reason = StateCancelling, quotes(MaxReasonLen)
	w.Wave = len(r.Waves) - 1
	w.Waves = slices.Clone(r.Waves)
	most := Counts{Total: MaxDevices, Queued: MaxDevices, Running: MaxDevices, Succeeded: MaxDevices, Failed: MaxDevices,
		Refused: MaxDevices, TimedOut: MaxDevices, Offline: MaxDevices, Cancelled: MaxDevices, Skipped: MaxDevices}
	for i := range w.Waves {
		w.Waves[i].Approved, w.Waves[i].StartedAt, w.Waves[i].EndedAt, w.Waves[i].Stopped = true, far, far, true
		w.Waves[i].Counts = most
	}
	w.RolledBack, w.DeviceCount = most, MaxDevices
	w.ShardKey = newShardKey(r.Name)
	w.Shards = make([]int64, shardCount(len(r.Devices)))
	for i := range w.Shards {
		w.Shards[i] = math.MaxInt64
	}
	w.Dispatches = make([]time.Time, r.Spec.Rate.N)
	for i := range w.Dispatches {
		w.Dispatches[i] = far
	}
	if r.Spec.RollbackCommand != "" {
		w.Rollback = &Rollback{Command: r.Spec.RollbackCommand, StartedAt: far, EndedAt: far}
	}
	w.Events = make([]Event, MaxEvents)
	for i := range w.Events {
		w.Events[i] = Event{Seq: math.MaxInt64, Type: EventRollbackStarted, At: far, Wave: w.Wave, Detail: quotes(MaxDetailLen), Version: math.MaxInt64}
	}
	w.EventSeq, w.Version = math.MaxInt64, math.MaxInt64
	w.CreatedAt, w.UpdatedAt, w.EndedAt = far, far, far
	b, err := encode(&w)
	return len(b), err
}

func farTime() time.Time { return time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC) }

// MaxShardSize is the largest shard document of r's can grow to: every
// execution at its longest (the longest outcome, error and dispatch
// history, an attempt count no rollout reaches).
func (r *Rollout) MaxShardSize() (int, error) {
	far := farTime()
	quotes := func(n int) string { return strings.Repeat(`"`, n/2) }
	dispatched := make([]time.Time, MaxDispatched)
	for i := range dispatched {
		dispatched[i] = far
	}
	most := 0
	for i := range shardCount(len(r.Devices)) {
		execs := slices.Clone(shard(r.Devices, i))
		for j := range execs {
			e := &execs[j]
			e.Outcome, e.Attempt, e.Lost, e.Published = OutcomeTimedOut, math.MaxInt, MaxLost, true
			e.DispatchedAt, e.EndedAt, e.Dispatched, e.Error = far, far, dispatched, quotes(MaxErrorLen)
			if r.Spec.RollbackCommand != "" {
				e.Rollback = OutcomeTimedOut
			}
		}
		b, err := encodeJSON(shardDoc{Rollout: r.Name, Index: math.MaxInt, Devices: execs})
		if err != nil {
			return 0, err
		}
		most = max(most, len(b))
	}
	return most, nil
}

// checkSize refuses a rollout whose document could outgrow the store's
// limit (task.MaxDocumentSize) less SizeMargin over its life.
func (r *Rollout) checkSize() error {
	n, err := r.MaxSize()
	if err != nil {
		return err
	}
	if shard, err := r.MaxShardSize(); err != nil {
		return err
	} else if most := task.MaxDocumentSize - SizeMargin; shard > most {
		return invalid("devices", "a shard of %d executions could grow to %d bytes, more than %d: use shorter device ids", ShardSize, shard, most)
	}
	if most := task.MaxDocumentSize - SizeMargin; n > most {
		return invalid("args", "with %d devices and these args and rollback_args, the rollout's document could grow to %d bytes, more than %d (the store's %d less %d to spare): send smaller args or fewer devices",
			len(r.Devices), n, most, task.MaxDocumentSize, SizeMargin)
	}
	return nil
}
