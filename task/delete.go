package task

import (
	"fmt"
	"time"
)

// DeleteParams selects finished tasks to delete (retention).
type DeleteParams struct {
	// State is the finished state to delete: succeeded, failed or cancelled.
	State State
	// Before: only tasks whose last write (updated_at) is before it.
	Before time.Time
	// Limit bounds one call, so that a large delete never holds the store
	// for long; required.
	Limit int
}

// Validate refuses an unfinished state or a missing limit: a delete must
// never reach a pending or running task.
func (p DeleteParams) Validate() error {
	if !p.State.Finished() {
		return invalid("state", fmt.Sprintf("%q is not a finished state (succeeded, failed, cancelled)", p.State))
	}
	if p.Limit <= 0 {
		return invalid("limit", "must be at least 1")
	}
	if p.Before.IsZero() {
		return invalid("before", "must be set")
	}
	return nil
}
