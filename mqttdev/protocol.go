// The shared protocol, under the names this package has always given it:
// the worker side's users need not import mqttdev/protocol themselves.

package mqttdev

import "github.com/leasepool/leasepool/mqttdev/protocol"

// Types of the shared protocol package.
type (
	// ClientConfig says how to reach the broker.
	ClientConfig = protocol.ClientConfig
	// Transport is the MQTT surface the handler uses (see
	// HandlerConfig.WrapTransport).
	Transport = protocol.Transport
	// Message is one MQTT message received.
	Message = protocol.Message
	// FaultTransport injects faults into a Transport, for tests.
	FaultTransport = protocol.FaultTransport
	// Topics builds and parses the topics of one prefix.
	Topics = protocol.Topics
	// CommandMessage is a command on <prefix>/devices/<id>/cmd.
	CommandMessage = protocol.CommandMessage
	// Reply is an ack or result of a device.
	Reply = protocol.Reply
	// Status is a device's retained online status.
	Status = protocol.Status
	// Labels are a device's attributes or operator labels.
	Labels = protocol.Labels
)

// Constants of the shared protocol package.
const (
	DefaultPrefix  = protocol.DefaultPrefix
	MaxIDLen       = protocol.MaxIDLen
	MaxMessageSize = protocol.MaxMessageSize
	TopicCmd       = protocol.TopicCmd
	TopicAck       = protocol.TopicAck
	TopicResult    = protocol.TopicResult
	TopicStatus    = protocol.TopicStatus
	CodeStale      = protocol.CodeStale
	CodeExpired    = protocol.CodeExpired
	MaxLabels      = protocol.MaxLabels
)

// ErrBadMessage is wrapped by every decode error of a device message.
var ErrBadMessage = protocol.ErrBadMessage

// ValidateID checks a device id or topic prefix; see protocol.ValidateID.
func ValidateID(field, s string) error { return protocol.ValidateID(field, s) }

// NewFaultTransport wraps inner with no faults set.
func NewFaultTransport(inner Transport) *FaultTransport { return protocol.NewFaultTransport(inner) }

// DecodeCommand decodes and checks a command message (device side).
func DecodeCommand(b []byte) (CommandMessage, error) { return protocol.DecodeCommand(b) }

// DecodeReply decodes and checks an ack or result message.
func DecodeReply(b []byte) (Reply, error) { return protocol.DecodeReply(b) }

// DecodeStatus decodes a status message.
func DecodeStatus(b []byte) (Status, error) { return protocol.DecodeStatus(b) }

// Encode marshals a protocol message.
func Encode(v any) ([]byte, error) { return protocol.Encode(v) }

// NewCorrelationID returns a fresh random correlation id.
func NewCorrelationID() string { return protocol.NewCorrelationID() }
