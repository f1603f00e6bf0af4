// storestates.go keeps device states in the task store, one document per
// device.

package mqttdev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/leasepool/leasepool/task"
)

// StateNamespace is the namespace of the documents (task.Document) that
// StoreStates keeps device states in, one per device id.
const StateNamespace = "leasepool.device-state"

// StoreStates keeps device states in the store's documents, so that every
// worker and admin tool sees the same picture. Every task.Store is a
// task.DocumentStore; it asks for no more than the documents. Pass it as
// HandlerConfig.DeviceState.
func StoreStates(ds task.DocumentStore) DeviceStateStore { return storeStates{ds} }

type storeStates struct{ ds task.DocumentStore }

// PutDeviceState stores s unless the stored state was seen later or is
// the same status message (same online state and device time): the
// workers tracking one device race to store each status message, an
// older one must not overwrite a newer one, and the first to store one
// leaves the others nothing to write. It writes by compare-and-set,
// again on the newer document when another write came first.
func (r storeStates) PutDeviceState(ctx context.Context, s DeviceState) error {
	_, err := r.putDeviceState(ctx, s)
	return err
}

// putDeviceState is PutDeviceState telling whether it created the
// device's document: none was stored, as for a device never seen or one
// forgotten (Forget).
func (r storeStates) putDeviceState(ctx context.Context, s DeviceState) (created bool, err error) {
	value, err := json.Marshal(s)
	if err != nil {
		return false, err
	}
	for {
		d, err := r.ds.GetDocument(ctx, StateNamespace, s.ID)
		switch {
		case errors.Is(err, task.ErrNotFound):
			d = task.Document{Namespace: StateNamespace, ID: s.ID}
		case err != nil:
			return false, fmt.Errorf("device state %s: %w", s.ID, err)
		default:
			if old, err := decodeState(d); err == nil && (old.SeenAt.After(s.SeenAt) || sameStatus(old, s)) {
				return false, nil
			}
		}
		d.Value = value
		if _, err = r.ds.PutDocument(task.WithInternalWrite(ctx), d); !errors.Is(err, task.ErrConflict) {
			if err != nil {
				return false, fmt.Errorf("device state %s: %w", s.ID, err)
			}
			return d.Version == 0, nil
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
	}
}

// sameStatus reports whether old was stored from the same status message
// as s: every tracker hears each message, and the first to store it
// leaves the others nothing to write.
func sameStatus(old, s DeviceState) bool {
	return old.Online == s.Online && old.At.Equal(s.At)
}

// stateCreator is a DeviceStateStore that tells when a put created the
// device's record (StoreStates).
type stateCreator interface {
	putDeviceState(ctx context.Context, s DeviceState) (created bool, err error)
}

// DeviceStates returns every stored state, by device id. A document that
// does not decode is skipped and reported to task.SkipMalformed, so that
// one cannot fail every listing of devices.
func (r storeStates) DeviceStates(ctx context.Context) ([]DeviceState, error) {
	docs, err := r.ds.Documents(ctx, StateNamespace)
	if err != nil {
		return nil, fmt.Errorf("device states: %w", err)
	}
	out := make([]DeviceState, 0, len(docs))
	for _, d := range docs {
		s, err := decodeState(d)
		if err != nil {
			task.SkipMalformed(StateNamespace, d.ID+"@"+strconv.FormatInt(d.Version, 10), err)
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// decodeState reads a device state document, which must be of its own
// device.
func decodeState(d task.Document) (DeviceState, error) {
	var s DeviceState
	if err := json.Unmarshal(d.Value, &s); err != nil {
		return DeviceState{}, fmt.Errorf("device state %s: %w", d.ID, err)
	}
	if s.ID != d.ID {
		return DeviceState{}, fmt.Errorf("device state %s: holds device %q", d.ID, s.ID)
	}
	return s, nil
}
