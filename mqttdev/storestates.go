// records.go keeps device states in the task store's shared records.

package mqttdev

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/leasepool/leasepool/task"
)

// recordKind is the task.Record kind device states are kept under.
const recordKind = "device-state"

// StoreStates keeps device states in the task store's shared records, so
// that every worker and admin tool sees the same picture. Every task.Store
// is a task.RecordStore; it asks for no more than the records. Pass it as
// HandlerConfig.DeviceState.
func StoreStates(rs task.RecordStore) DeviceStateStore { return recordStates{rs} }

type recordStates struct{ rs task.RecordStore }

func (r recordStates) PutDeviceState(ctx context.Context, s DeviceState) error {
	value, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return r.rs.PutRecord(ctx, task.Record{Kind: recordKind, ID: s.ID, Value: value, At: s.SeenAt})
}

func (r recordStates) DeviceStates(ctx context.Context) ([]DeviceState, error) {
	recs, err := r.rs.Records(ctx, recordKind)
	if err != nil {
		return nil, err
	}
	out := make([]DeviceState, 0, len(recs))
	for _, rec := range recs {
		var s DeviceState
		if err := json.Unmarshal(rec.Value, &s); err != nil {
			return nil, fmt.Errorf("device state %s: %w", rec.ID, err)
		}
		out = append(out, s)
	}
	return out, nil
}
