package mqttdev

import (
	"fmt"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/flow"
	"github.com/leasepool/leasepool/task"
)

// PrepareFlow makes spec's device steps (and rollbacks) of kind Kind into
// device job sequence steps: each payload is checked as a Command (errors
// name the field, e.g. steps[2].payload: ..., and wrap task.ErrInvalid)
// and the device's lock key is added to the action's lock keys. A flow's
// steps then drive one command per device at a time across the cluster,
// and a flow whose next device is busy waits in that device's line (by the
// flow's priority, then its arrival) without holding up flows that need
// other devices.
func PrepareFlow(spec *flow.Spec) error {
	for i := range spec.Steps {
		st := &spec.Steps[i]
		field := fmt.Sprintf("steps[%d]", i)
		if err := prepareAction(&st.Action, field); err != nil {
			return err
		}
		if st.Rollback != nil {
			if err := prepareAction(st.Rollback, field+".rollback"); err != nil {
				return err
			}
		}
	}
	return nil
}

func prepareAction(a *flow.Action, field string) error {
	if a.Kind != Kind {
		return nil
	}
	c, err := DecodePayload(a.Payload)
	if err != nil {
		return fmt.Errorf("%w: %s.payload: %s", task.ErrInvalid, field, strings.TrimPrefix(reason(err), "payload: "))
	}
	if lk := LockKey(c.Device); !slices.Contains(a.LockKeys, lk) {
		a.LockKeys = append(slices.Clone(a.LockKeys), lk)
	}
	return nil
}

// reason is err's text without the leading "invalid: ".
func reason(err error) string {
	return strings.TrimPrefix(err.Error(), task.ErrInvalid.Error()+": ")
}
