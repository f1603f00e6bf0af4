// Package protocol is what both ends of leasepool's device protocol share:
// the topics, the messages and their checks (see the mqttdev package
// documentation for the rules), and the MQTT client transport both the
// worker side (mqttdev) and the device side (mqttdev/device) talk through.
// It imports neither side, so each imports it without a cycle.
package protocol

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasepool/leasepool/internal/tracing"
	"github.com/leasepool/leasepool/task"
)

// DefaultPrefix is the first topic segment when none is configured.
const DefaultPrefix = "leasepool"

// MaxIDLen is the longest device id or prefix accepted, in bytes.
const MaxIDLen = 128

// MaxMessageSize is the largest device message decoded, in bytes.
const MaxMessageSize = 1 << 20

// ValidateID checks a device id or topic prefix (field names it in the
// error): non-empty, at most MaxIDLen bytes, valid UTF-8, not "." or "..",
// and free of the MQTT wildcards "+" and "#", the level separator "/",
// white space, control characters (NUL, newline...) and format characters
// (Unicode category Cf: the bidirectional overrides and isolates U+202A to
// U+202E and U+2066 to U+2069, the marks U+200E and U+200F, zero-width
// characters). So an id is exactly one topic level and one path segment,
// cannot widen a subscription or address another device, and looks in a
// listing like what it is: no " " sorting first, no id that reorders the
// text after it. Errors wrap task.ErrInvalid and fit on one line.
func ValidateID(field, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: %s: must not be empty", task.ErrInvalid, field)
	case len(s) > MaxIDLen:
		return fmt.Errorf("%w: %s: is longer than %d bytes", task.ErrInvalid, field, MaxIDLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s: %q is not valid UTF-8", task.ErrInvalid, field, s)
	case s == "." || s == "..":
		return fmt.Errorf("%w: %s: %q is not an id", task.ErrInvalid, field, s)
	case strings.ContainsAny(s, "+#/"):
		return fmt.Errorf("%w: %s: %q must not contain '+', '#' or '/'", task.ErrInvalid, field, s)
	}
	for _, r := range s {
		var what string
		switch {
		case unicode.IsControl(r):
			what = "a control character"
		case unicode.IsSpace(r):
			what = "white space"
		case unicode.Is(unicode.Cf, r):
			what = "a format character"
		default:
			continue
		}
		// %q escapes r: the error itself prints no override.
		return fmt.Errorf("%w: %s: %q has %s (U+%04X)", task.ErrInvalid, field, s, what, r)
	}
	return nil
}

// Topic kinds: the last level of a device topic.
const (
	TopicCmd    = "cmd"
	TopicAck    = "ack"
	TopicResult = "result"
	TopicStatus = "status"
)

// Topics builds and parses the topics of one prefix. The zero value uses
// DefaultPrefix.
type Topics struct{ Prefix string }

func (t Topics) prefix() string {
	if t.Prefix == "" {
		return DefaultPrefix
	}
	return t.Prefix
}

// Device returns <prefix>/devices/<id>/<kind>. The id must have passed
// ValidateID.
func (t Topics) Device(id, kind string) string {
	return t.prefix() + "/devices/" + id + "/" + kind
}

// All returns the filter <prefix>/devices/+/<kind>.
func (t Topics) All(kind string) string { return t.Device("+", kind) }

// Parse splits a device topic into its device id and kind; ok is false for
// any other topic.
func (t Topics) Parse(topic string) (id, kind string, ok bool) {
	rest, found := strings.CutPrefix(topic, t.prefix()+"/devices/")
	if !found {
		return "", "", false
	}
	id, kind, found = strings.Cut(rest, "/")
	if !found || ValidateID("device", id) != nil {
		return "", "", false
	}
	switch kind {
	case TopicCmd, TopicAck, TopicResult, TopicStatus:
		return id, kind, true
	}
	return "", "", false
}

// CommandMessage is published by a worker on <prefix>/devices/<id>/cmd.
type CommandMessage struct {
	TaskKey       string          `json:"task_key"`
	Attempt       int             `json:"attempt"`
	CorrelationID string          `json:"correlation_id"`
	Command       string          `json:"command"`
	Args          json.RawMessage `json:"args,omitempty"`
	SentAt        time.Time       `json:"sent_at"`
	// ExpiresAt is when the worker stops waiting for the ack of this
	// publish; a device must refuse (CodeExpired) a command it receives
	// later, e.g. one queued in its session while it was offline.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Traceparent and Tracestate are the W3C trace context of the attempt
	// that sent the command, when it is traced: a device that traces its
	// work makes its spans children of it, and may echo it in its replies.
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// Reply codes of refusals.
const (
	CodeStale   = "stale_attempt" // a later attempt of the task was seen
	CodeExpired = "expired"       // received after expires_at
)

// Reply is published by a device on <prefix>/devices/<id>/ack (the command
// was accepted or refused) and on <prefix>/devices/<id>/result (it ran).
type Reply struct {
	CorrelationID string `json:"correlation_id"`
	TaskKey       string `json:"task_key"`
	Attempt       int    `json:"attempt"`
	OK            bool   `json:"ok"`
	Error         string `json:"error,omitempty"`
	// Code classifies a refusal: CodeStale, CodeExpired, or empty.
	Code   string          `json:"code,omitempty"`
	Output json.RawMessage `json:"output,omitempty"`
	// Traceparent is the command's, echoed (optional).
	Traceparent string `json:"traceparent,omitempty"`
}

// Status is published retained by a device on <prefix>/devices/<id>/status:
// online at connect and on every heartbeat, offline as its last will and
// before a clean disconnect. In a will, At is when the will was set.
type Status struct {
	Online bool      `json:"online"`
	At     time.Time `json:"at"`
	// Attributes are what the device announces of itself (model,
	// firmware, site...), in its online statuses; absent in a will.
	// Workers keep them in the device inventory.
	Attributes Labels `json:"attributes,omitempty"`
}

// ErrBadMessage is wrapped by every decode error of a device message.
var ErrBadMessage = errors.New("bad device message")

func bad(what, msg string) error { return fmt.Errorf("%w: %s: %s", ErrBadMessage, what, msg) }

func decodeStrict(what string, b []byte, v any) error {
	if len(b) > MaxMessageSize {
		return bad(what, fmt.Sprintf("%d bytes is over %d", len(b), MaxMessageSize))
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadMessage, what, err)
	}
	if d.More() {
		return bad(what, "trailing data after the JSON object")
	}
	return nil
}

func checkCommon(what, key string, attempt int, corr string) error {
	if err := task.ValidateName("task_key", key); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadMessage, what, err)
	}
	if attempt < 1 {
		return bad(what, fmt.Sprintf("attempt %d must be at least 1", attempt))
	}
	if err := ValidateID("correlation_id", corr); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrBadMessage, what, err)
	}
	return nil
}

// DecodeCommand decodes and checks a command message (device side).
func DecodeCommand(b []byte) (CommandMessage, error) {
	var m CommandMessage
	if err := decodeStrict("command", b, &m); err != nil {
		return CommandMessage{}, err
	}
	if err := checkCommon("command", m.TaskKey, m.Attempt, m.CorrelationID); err != nil {
		return CommandMessage{}, err
	}
	if err := ValidateCommandName(m.Command); err != nil {
		return CommandMessage{}, fmt.Errorf("%w: command: %w", ErrBadMessage, err)
	}
	if err := CheckArgs(m.Args); err != nil {
		return CommandMessage{}, fmt.Errorf("%w: command: %w", ErrBadMessage, err)
	}
	if err := tracing.Check("traceparent", "tracestate", m.Traceparent, m.Tracestate); err != nil {
		return CommandMessage{}, fmt.Errorf("%w: command: %w", ErrBadMessage, err)
	}
	return m, nil
}

// DecodeReply decodes and checks an ack or result message (worker side).
func DecodeReply(b []byte) (Reply, error) {
	var r Reply
	if err := decodeStrict("reply", b, &r); err != nil {
		return Reply{}, err
	}
	if err := checkCommon("reply", r.TaskKey, r.Attempt, r.CorrelationID); err != nil {
		return Reply{}, err
	}
	return r, nil
}

// DecodeStatus decodes a status message.
func DecodeStatus(b []byte) (Status, error) {
	var s Status
	if err := decodeStrict("status", b, &s); err != nil {
		return Status{}, err
	}
	return s, nil
}

// Encode marshals a protocol message.
func Encode(v any) ([]byte, error) { return json.Marshal(v) }

// ValidateCommandName checks a command name: non-empty, at most MaxIDLen
// bytes, valid UTF-8 without control characters. Errors wrap
// task.ErrInvalid.
func ValidateCommandName(s string) error {
	if s == "" {
		return fmt.Errorf("%w: command: must not be empty", task.ErrInvalid)
	}
	if len(s) > MaxIDLen {
		return fmt.Errorf("%w: command: is longer than %d bytes", task.ErrInvalid, MaxIDLen)
	}
	if strings.IndexFunc(s, unicode.IsControl) >= 0 || !utf8.ValidString(s) {
		return fmt.Errorf("%w: command: %q has a control character or invalid UTF-8", task.ErrInvalid, s)
	}
	return nil
}

// CheckArgs checks command arguments: absent, or a JSON object. Errors wrap
// task.ErrInvalid.
func CheckArgs(args json.RawMessage) error {
	if len(args) == 0 {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(args, &m); err != nil || m == nil {
		return fmt.Errorf("%w: args: must be a JSON object", task.ErrInvalid)
	}
	return nil
}

// NewCorrelationID returns a fresh random correlation id (32 hex digits).
func NewCorrelationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
