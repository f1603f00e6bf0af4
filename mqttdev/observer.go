package mqttdev

import (
	"context"
	"errors"
	"time"

	"github.com/leasepool/leasepool/consumer"
)

// CommandObserver is told how each device command attempt ended, for
// metrics (package metrics implements it). It is called from handler
// goroutines at once: it must be safe for concurrent use and not block.
type CommandObserver interface {
	CommandDone(CommandEvent)
}

// CommandEvent is one attempt's command exchange, as seen by the worker.
type CommandEvent struct {
	Outcome CommandOutcome
	// Duration runs from the start of the attempt to its end: for
	// CommandOK and CommandDeviceFailed the round trip to the device's
	// result, including any republishes and waits for the device.
	Duration time.Duration
}

// CommandOutcome is how a device command attempt ended.
type CommandOutcome string

// The outcomes of a device command attempt.
const (
	CommandOK            CommandOutcome = "ok"             // the device reported success
	CommandDeviceFailed  CommandOutcome = "device_failed"  // the device reported failure
	CommandRefused       CommandOutcome = "refused"        // the device refused it (stale, expired)
	CommandNoAck         CommandOutcome = "no_ack"         // timeout: no copy acked
	CommandResultTimeout CommandOutcome = "result_timeout" // timeout: acked, no result in time
	CommandOffline       CommandOutcome = "offline"        // snoozed: the device was or stayed offline
	CommandCancelled     CommandOutcome = "cancelled"      // the attempt's context ended (lease lost, stop)
	CommandError         CommandOutcome = "error"          // anything else (bad payload, not started)
)

// commandOutcome classifies what Handle returned.
func commandOutcome(ctx context.Context, err error) CommandOutcome {
	var snooze *consumer.SnoozeError
	switch {
	case err == nil:
		return CommandOK
	case errors.Is(err, ErrDeviceFailed):
		return CommandDeviceFailed
	case errors.Is(err, ErrRefused):
		return CommandRefused
	case errors.Is(err, ErrNoAck):
		return CommandNoAck
	case errors.Is(err, ErrResultTimeout):
		return CommandResultTimeout
	case errors.As(err, &snooze):
		return CommandOffline
	case ctx.Err() != nil:
		return CommandCancelled
	default:
		return CommandError
	}
}

// RoundTrip reports whether the device answered, so Duration is a round
// trip.
func (o CommandOutcome) RoundTrip() bool { return o == CommandOK || o == CommandDeviceFailed }
