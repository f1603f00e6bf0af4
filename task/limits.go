// limits.go holds what every entry checks of a caller's input: the
// limits on options, names, keys, lock keys, times and JSON, and the
// reserved names leasepool keeps for itself.

package task

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on task options, refused at publish (by Validate, so the Go API,
// the CLI and every backend agree).
const (
	// MinPingInterval is the shortest ping_interval: each renewal is a
	// store write, and shorter periods only load the store.
	MinPingInterval = 10 * time.Millisecond
	// MinWorkerTimeout is the shortest worker_timeout. A holder counts on
	// its lease only until a tenth of worker_timeout before it ends (see
	// ping.Renewer.Remaining), so the claim write, the first renewal and the
	// store clock's error must all fit well inside it.
	MinWorkerTimeout = 100 * time.Millisecond
	// MaxPayloadSize is the largest payload, in bytes of JSON. Backends
	// refuse a document whose payload is larger.
	MaxPayloadSize = 1 << 20
	// MaxNameLen is the longest key, kind, worker id or lock key, in bytes.
	MaxNameLen = 512
	// MaxJSONDepth is how deeply a payload, a result, a flow's parameters
	// or any JSON the API reads may nest arrays and objects. MongoDB
	// refuses documents nested over 100 levels and SQLite's JSON functions
	// (the list filters) stop at 1,000; leasepool's own documents embed
	// these values a few levels down (MaxStoredDepth), within both.
	MaxJSONDepth = 64
	// MaxStoredDepth bounds the nesting of any payload a backend writes:
	// leasepool's own documents (a flow's) hold user JSON of MaxJSONDepth
	// a few levels down.
	MaxStoredDepth = MaxJSONDepth + 16
)

// MinTime and MaxTime bound every time a caller gives (run_at, a
// schedule's start and end, a snooze): a year like 9999 overflows the
// nanosecond clock arithmetic (int64 nanoseconds end in 2262) and the
// stores' comparisons.
var (
	MinTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	MaxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

// ValidateTime checks a time a caller gives: zero (unset), or from MinTime
// to MaxTime. Its errors wrap ErrInvalid and name the field.
func ValidateTime(field string, t time.Time) error {
	if t.IsZero() || (!t.Before(MinTime) && !t.After(MaxTime)) {
		return nil
	}
	return invalid(field, fmt.Sprintf("%s is outside %s .. %s", t.UTC().Format(time.RFC3339), MinTime.Format(time.DateOnly), MaxTime.Format(time.DateOnly)))
}

// ValidateLockKey checks a task's lock key: a valid name. Any name will
// do: the locks leasepool takes itself (rate-limit slots, singletons'
// leases) live in namespaces of their own (LockNamespace), where no task's
// key reaches them.
func ValidateLockKey(field, k string) error { return ValidateName(field, k) }

// ValidateKey checks the key of a task a caller publishes: a valid name
// outside ReservedPrefix that a URL path can name (see PathNameable).
func ValidateKey(field, key string) error {
	if err := ValidateName(field, key); err != nil {
		return err
	}
	if !PathNameable(key) {
		return invalid(field, fmt.Sprintf("%q cannot be named in a URL path (no leading \"/\", \"//\", or \".\" or \"..\" between slashes)", key))
	}
	if Reserved(key) {
		return reservedKey(field, key)
	}
	return nil
}

// PathNameable reports whether key, escaped into a URL path such as
// /api/v1/tasks/KEY, still names key after the path cleaning HTTP clients
// and servers do: no empty segment but a last one (a leading "/" or "//")
// and no "." or ".." segment. Keys may hold "/" otherwise (flow steps'
// keys do).
func PathNameable(key string) bool {
	segs := strings.Split(key, "/")
	for i, s := range segs {
		if s == "." || s == ".." || (s == "" && i < len(segs)-1) {
			return false
		}
	}
	return true
}

func reservedKey(field, key string) error {
	return invalid(field, fmt.Sprintf("%q is reserved (the %s prefix is leasepool's own)", key, ReservedPrefix))
}

// internalWrite marks a context of leasepool's own writes.
type internalWrite struct{}

// WithInternalWrite returns a context for leasepool's own writes, under
// which Publish and every backend's Insert accept a key under
// ReservedPrefix, every backend's PutDocument a namespace under
// DocumentPrefix, and Publish bounds the payload by MaxStoredDepth (a flow
// step's payload wraps the flow's parameters, each checked against
// MaxJSONDepth when published). It is not for callers' input: what a caller gives is checked by Validate, and a reserved
// document its reader cannot read is skipped (SkipMalformed), never run.
func WithInternalWrite(ctx context.Context) context.Context {
	return context.WithValue(ctx, internalWrite{}, true)
}

func isInternalWrite(ctx context.Context) bool { return ctx.Value(internalWrite{}) != nil }

// CheckInsertKey is the key check every backend's Insert makes: a valid
// name, and under ReservedPrefix only in a context from WithInternalWrite.
func CheckInsertKey(ctx context.Context, key string) error {
	if err := ValidateName("key", key); err != nil {
		return err
	}
	if Reserved(key) && !isInternalWrite(ctx) {
		return reservedKey("key", key)
	}
	return nil
}

// ValidatePayload checks a task payload as a caller gives it: valid JSON
// and UTF-8 (empty means {}) of at most MaxPayloadSize bytes, nested at
// most MaxJSONDepth levels.
func ValidatePayload(b json.RawMessage) error {
	if len(b) > MaxPayloadSize {
		return invalid("payload", fmt.Sprintf("is %d bytes, more than the limit of %d", len(b), MaxPayloadSize))
	}
	return ValidateJSON("payload", b, MaxJSONDepth)
}

// ValidateStoredPayload is the payload check every backend's write makes:
// ValidatePayload with leasepool's own documents' depth, MaxStoredDepth.
func ValidateStoredPayload(b json.RawMessage) error {
	if len(b) > MaxPayloadSize {
		return invalid("payload", fmt.Sprintf("is %d bytes, more than the limit of %d", len(b), MaxPayloadSize))
	}
	return ValidateJSON("payload", b, MaxStoredDepth)
}

// ValidateJSON checks JSON b of field: valid (empty is), valid UTF-8 (which
// encoding/json would otherwise rewrite to U+FFFD) and nested at most
// depth levels of arrays and objects.
func ValidateJSON(field string, b []byte, depth int) error {
	if len(b) == 0 {
		return nil
	}
	if !utf8.Valid(b) {
		return invalid(field, "is not valid UTF-8")
	}
	if jsonDepthOver(b, depth) {
		return invalid(field, fmt.Sprintf("nested deeper than %d levels", depth))
	}
	if !json.Valid(b) {
		return invalid(field, "is not valid JSON")
	}
	return nil
}

// ValidateName checks a key, kind, worker id or lock key: non-empty, at most
// MaxNameLen bytes of valid UTF-8, no control characters.
func ValidateName(field, s string) error {
	if s == "" {
		return invalid(field, "must not be empty")
	}
	if len(s) > MaxNameLen {
		return invalid(field, fmt.Sprintf("is longer than %d bytes", MaxNameLen))
	}
	if !utf8.ValidString(s) {
		return invalid(field, fmt.Sprintf("%q is not valid UTF-8", s))
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		return invalid(field, fmt.Sprintf("%q has a control character", s))
	}
	return nil
}

func invalid(field, msg string) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalid, field, msg)
}
