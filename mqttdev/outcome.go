package mqttdev

import "strings"

// FailureOf classifies the error a finished attempt of a device task left
// in the store (task.Attempt.Error, text only): how the device failed,
// for the counts of fleet rollouts. It returns CommandDeviceFailed,
// CommandRefused, CommandNoAck, CommandResultTimeout, CommandOffline, or
// CommandError for anything else (a bad payload, a handler not started).
func FailureOf(errText string) CommandOutcome {
	switch {
	case strings.Contains(errText, ErrDeviceFailed.Error()):
		return CommandDeviceFailed
	case strings.Contains(errText, ErrRefused.Error()):
		return CommandRefused
	case strings.Contains(errText, ErrNoAck.Error()):
		return CommandNoAck
	case strings.Contains(errText, ErrResultTimeout.Error()):
		return CommandResultTimeout
	case strings.Contains(errText, ErrOffline.Error()):
		return CommandOffline
	}
	return CommandError
}
