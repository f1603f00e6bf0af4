package protocol

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/leasepool/leasepool/task"
)

// badIDs are ids every entry must refuse: each names its reason.
var badIDs = []struct{ id, reason string }{
	{"", "empty"},
	{" ", "white space"},
	{"a b", "white space"},
	{"dev\u00a0", "white space"},
	{".", "not an id"},
	{"..", "not an id"},
	{"dev\u202e1", "format character (U+202E)"},
	{"dev\u2066", "format character (U+2066)"},
	{"dev\u200f", "format character (U+200F)"},
	{"dev\u200e", "format character (U+200E)"},
	{"dev\ufeff", "format character (U+FEFF)"},
	{"dev\x00", "control character (U+0000)"},
	{"dev\n", "control character (U+000A)"},
	{"dev\x7f", "control character (U+007F)"},
	{"a/b", "'/'"}, {"+", "'+'"}, {"#", "'#'"}, {"dev+1", "'+'"},
	{"\xff", "UTF-8"},
	{strings.Repeat("x", MaxIDLen+1), "longer than"},
}

func TestValidateID(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"dev-1", "ÄÖ", "a.b_c:d", "...", ".a", "デバイス", strings.Repeat("x", MaxIDLen)} {
		if err := ValidateID("device", ok); err != nil {
			t.Errorf("ValidateID(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range badIDs {
		err := ValidateID("device", bad.id)
		if !errors.Is(err, task.ErrInvalid) || !strings.HasPrefix(err.Error(), "invalid: device: ") || !strings.Contains(err.Error(), bad.reason) {
			t.Errorf("ValidateID(%q) = %v, want an error wrapping ErrInvalid naming device and %q", bad.id, err, bad.reason)
			continue
		}
		if msg := err.Error(); strings.ContainsFunc(msg, func(r rune) bool { return !strconv.IsPrint(r) }) {
			t.Errorf("ValidateID(%q) error %q holds an unprintable character", bad.id, msg)
		}
	}
}

// TestTopicsParseBadID: a message on the topic of a refused id is no
// device's.
func TestTopicsParseBadID(t *testing.T) {
	t.Parallel()
	tp := Topics{}
	for _, bad := range badIDs {
		if bad.id == "" || strings.Contains(bad.id, "/") {
			continue // not one topic level: TestTopics
		}
		for _, kind := range []string{TopicStatus, TopicAck, TopicResult, TopicCmd} {
			if id, _, ok := tp.Parse(tp.Device(bad.id, kind)); ok {
				t.Errorf("Parse(%q) = %q, ok; want refused", tp.Device(bad.id, kind), id)
			}
		}
	}
}

func TestTopics(t *testing.T) {
	t.Parallel()
	tp := Topics{}
	if got := tp.Device("d1", TopicCmd); got != "leasepool/devices/d1/cmd" {
		t.Fatalf("Device = %q", got)
	}
	if got := (Topics{Prefix: "p"}).All(TopicStatus); got != "p/devices/+/status" {
		t.Fatalf("All = %q", got)
	}
	id, kind, ok := tp.Parse("leasepool/devices/d1/result")
	if !ok || id != "d1" || kind != TopicResult {
		t.Fatalf("Parse = %q %q %v", id, kind, ok)
	}
	for _, bad := range []string{"leasepool/devices/d1/other", "leasepool/devices/a/b/cmd", "other/devices/d1/cmd", "leasepool/devices//cmd", "leasepool/devices/d1"} {
		if _, _, ok := tp.Parse(bad); ok {
			t.Errorf("Parse(%q) ok, want refused", bad)
		}
	}
}

func TestCommandRoundTrip(t *testing.T) {
	t.Parallel()
	m := CommandMessage{TaskKey: "k", Attempt: 3, CorrelationID: NewCorrelationID(), Command: "reboot",
		Args: json.RawMessage(`{"delay":5}`), SentAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "v=1"}
	b, err := Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCommand(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.TaskKey != m.TaskKey || got.Attempt != 3 || got.CorrelationID != m.CorrelationID || string(got.Args) != `{"delay":5}` || !got.SentAt.Equal(m.SentAt) ||
		got.Traceparent != m.Traceparent || got.Tracestate != m.Tracestate {
		t.Fatalf("round trip: %+v", got)
	}
	for _, bad := range []string{
		``, `null`, `[]`, `{}`, `{"task_key":"k","attempt":0,"correlation_id":"c","command":"x"}`,
		`{"task_key":"k","attempt":1,"correlation_id":"c/d","command":"x"}`,
		`{"task_key":"k","attempt":1,"correlation_id":"c","command":""}`,
		`{"task_key":"k","attempt":1,"correlation_id":"c","command":"x","args":[1]}`,
		`{"task_key":"k","attempt":1,"correlation_id":"c","command":"x"} {}`,
		`{"task_key":"k","attempt":1,"correlation_id":"c","command":"x","traceparent":"00-12-34-01"}`,
		`{"task_key":"k","attempt":1,"correlation_id":"c","command":"x","tracestate":"v=1"}`,
	} {
		if _, err := DecodeCommand([]byte(bad)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("DecodeCommand(%s) = %v, want ErrBadMessage", bad, err)
		}
	}
}

func TestReplyRoundTrip(t *testing.T) {
	t.Parallel()
	r := Reply{CorrelationID: "c1", TaskKey: "k", Attempt: 1, OK: false, Error: "boom", Output: json.RawMessage(`{"a":1}`)}
	b, _ := Encode(r)
	got, err := DecodeReply(b)
	if err != nil || got.Error != "boom" || got.OK || string(got.Output) != `{"a":1}` {
		t.Fatalf("DecodeReply = %+v, %v", got, err)
	}
	if _, err := DecodeReply([]byte(`{"correlation_id":"c","task_key":"","attempt":1}`)); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("empty task key accepted: %v", err)
	}
	if _, err := DecodeReply(make([]byte, MaxMessageSize+1)); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("oversized accepted: %v", err)
	}
	st, err := DecodeStatus([]byte(`{"online":true,"at":"2026-01-02T03:04:05Z"}`))
	if err != nil || !st.Online {
		t.Fatalf("DecodeStatus = %+v, %v", st, err)
	}
}

func FuzzDecodeReply(f *testing.F) {
	f.Add([]byte(`{"correlation_id":"c","task_key":"k","attempt":1,"ok":true,"output":{"a":1}}`))
	f.Add([]byte(`{"correlation_id":"c","task_key":"k","attempt":-1}`))
	f.Add([]byte(`{"correlation_id":"+","task_key":"k\u0000","attempt":9e99}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeReply(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		if r.Attempt < 1 || ValidateID("c", r.CorrelationID) != nil || task.ValidateName("k", r.TaskKey) != nil {
			t.Fatalf("accepted invalid reply %+v", r)
		}
		again, err := Encode(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeReply(again); err != nil {
			t.Fatalf("re-encoded reply refused: %v", err)
		}
	})
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add([]byte(`{"task_key":"k","attempt":1,"correlation_id":"c","command":"x","args":{"a":[1]},"sent_at":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"task_key":"k","attempt":1,"correlation_id":"c","command":"x","args":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCommand(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		again, err := Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeCommand(again); err != nil {
			t.Fatalf("re-encoded command refused: %v", err)
		}
	})
}

func FuzzDecodeStatus(f *testing.F) {
	f.Add([]byte(`{"online":true,"at":"2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := DecodeStatus(b); err != nil && !errors.Is(err, ErrBadMessage) {
			t.Fatalf("error %v does not wrap ErrBadMessage", err)
		}
	})
}

func FuzzTopicsParse(f *testing.F) {
	f.Add("leasepool/devices/d/cmd")
	f.Fuzz(func(t *testing.T, topic string) {
		id, kind, ok := Topics{}.Parse(topic)
		if ok && (ValidateID("device", id) != nil || (Topics{}).Device(id, kind) != topic) {
			t.Fatalf("Parse(%q) = %q %q", topic, id, kind)
		}
	})
}

// TestCopyingStoreKeepsItsOwnPublish: what resume changes in the store
// (Dup) is not the packet the publisher handed over.
func TestCopyingStoreKeepsItsOwnPublish(t *testing.T) {
	t.Parallel()
	s := copyingStore{mqtt.NewMemoryStore()}
	s.Open()
	defer s.Close()
	p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
	p.Qos, p.MessageID, p.TopicName, p.Payload = 1, 7, "t", []byte("x")
	s.Put("o.7", p)
	stored, ok := s.Get("o.7").(*packets.PublishPacket)
	if !ok || stored == p || stored.MessageID != 7 || stored.TopicName != "t" {
		t.Fatalf("stored %+v: want a copy of the publish", stored)
	}
	stored.Dup = true
	if p.Dup {
		t.Fatal("setting Dup on the stored packet changed the publisher's")
	}
}
