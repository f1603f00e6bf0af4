package mqttdev

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// Kind is the task kind of device commands; register the Handler for it.
const Kind = "device"

// Defaults of Command's fields.
const (
	DefaultAckTimeout    = 5 * time.Second
	DefaultResultTimeout = time.Minute
	DefaultMaxPublishes  = 3
	// MaxMaxPublishes bounds Command.MaxPublishes.
	MaxMaxPublishes = 100
)

// Command is the payload of a device task: which device runs which command.
type Command struct {
	// Device is the device id (see ValidateID). Required.
	Device string `json:"device"`
	// Command names what the device should do. Required, at most 128 bytes.
	Command string `json:"command"`
	// Args is a JSON object passed to the device as is; empty means none.
	Args json.RawMessage `json:"args,omitempty"`
	// AckTimeout is how long to wait for the device's ack after each
	// publish. Zero means DefaultAckTimeout.
	AckTimeout task.Duration `json:"ack_timeout,omitempty"`
	// ResultTimeout is how long to wait for the result after the ack. Zero
	// means DefaultResultTimeout.
	ResultTimeout task.Duration `json:"result_timeout,omitempty"`
	// MaxPublishes is how many times the command is published while no ack
	// comes (the first publish included). Zero means DefaultMaxPublishes.
	MaxPublishes int `json:"max_publishes,omitempty"`
	// OfflineTimeout bounds how long the command waits, without spending
	// retries, for its device to come online, counted from the task's
	// publish; after it each attempt that finds the device away fails and
	// the task's retries decide. Zero waits as long as it takes.
	OfflineTimeout task.Duration `json:"offline_timeout,omitempty"`
}

// LockKey returns the lock key that serialises commands to device id.
func LockKey(id string) string { return "device:" + id }

// validate checks c; its errors wrap task.ErrInvalid and name the field.
func (c *Command) validate() error {
	if err := ValidateID("device", c.Device); err != nil {
		return err
	}
	if err := protocol.ValidateCommandName(c.Command); err != nil {
		return err
	}
	if err := protocol.CheckArgs(c.Args); err != nil {
		return err
	}
	switch {
	case c.AckTimeout < 0:
		return fmt.Errorf("%w: ack_timeout: must not be negative", task.ErrInvalid)
	case c.ResultTimeout < 0:
		return fmt.Errorf("%w: result_timeout: must not be negative", task.ErrInvalid)
	case c.OfflineTimeout < 0:
		return fmt.Errorf("%w: offline_timeout: must not be negative", task.ErrInvalid)
	case c.MaxPublishes < 0 || c.MaxPublishes > MaxMaxPublishes:
		return fmt.Errorf("%w: max_publishes: %d is not in 0..%d", task.ErrInvalid, c.MaxPublishes, MaxMaxPublishes)
	}
	return nil
}

// withDefaults returns c with zero fields set to their defaults.
func (c Command) withDefaults() Command {
	if c.AckTimeout == 0 {
		c.AckTimeout = task.Duration(DefaultAckTimeout)
	}
	if c.ResultTimeout == 0 {
		c.ResultTimeout = task.Duration(DefaultResultTimeout)
	}
	if c.MaxPublishes == 0 {
		c.MaxPublishes = DefaultMaxPublishes
	}
	return c
}

// PublishParams builds the publish of a device command under key: kind
// Kind, c as the payload, and LockKey(c.Device) added to opts.LockKeys so
// that one command per device runs at a time across the cluster. It checks
// c and opts and returns an error wrapping task.ErrInvalid, naming the
// field, before anything is written. Pass the result to task.Publish.
func PublishParams(key string, c Command, opts task.Options) (task.PublishParams, error) {
	if err := c.validate(); err != nil {
		return task.PublishParams{}, err
	}
	payload, err := json.Marshal(c)
	if err != nil {
		return task.PublishParams{}, fmt.Errorf("%w: args: %w", task.ErrInvalid, err)
	}
	lk := LockKey(c.Device)
	opts.LockKeys = slices.Clone(opts.LockKeys)
	if !slices.Contains(opts.LockKeys, lk) {
		opts.LockKeys = append(opts.LockKeys, lk)
	}
	p := task.PublishParams{Key: key, Kind: Kind, Payload: payload, Options: opts}
	if err := p.Validate(); err != nil {
		return task.PublishParams{}, err
	}
	return p, nil
}

// DecodePayload reads a device task's payload and checks it, with its
// defaults filled. A field it does not know (a misspelt "ack_timout") is
// refused, as the built-in kinds do. Errors wrap task.ErrInvalid.
func DecodePayload(payload json.RawMessage) (Command, error) {
	var c Command
	d := json.NewDecoder(bytes.NewReader(payload))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return Command{}, fmt.Errorf("%w: payload: device: %w", task.ErrInvalid, err)
	}
	if d.More() {
		return Command{}, fmt.Errorf("%w: payload: device: data after the JSON object", task.ErrInvalid)
	}
	if err := c.validate(); err != nil {
		return Command{}, err
	}
	return c.withDefaults(), nil
}
