// stepview.go: what a step's handler is given of its step, out of the
// envelope its task carries, for the middleware and for remote workers.

package flow

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// stepEnvelope decodes a step task's envelope; tasks whose key does not
// look like a step's are not parsed at all.
func stepEnvelope(t *task.Task) (envelope, bool) {
	var env envelope
	if !strings.Contains(t.Key, "/do") && !strings.Contains(t.Key, "/undo") {
		return env, false
	}
	if err := json.Unmarshal(t.Payload, &env); err != nil || env.Flow.Flow == "" || env.Flow.TaskKey() != t.Key {
		return env, false
	}
	return env, true
}

// StepPayload returns the payload a flow step task's handler sees (its
// action's own, out of the envelope the flow wraps it in), and whether t
// is a flow step task at all, so that what looks at a task before its
// handler runs (a consumer.Gate) reads what the handler will.
func StepPayload(t *task.Task) (json.RawMessage, bool) {
	payload, _, ok := UnwrapStep(t)
	return payload, ok
}

// StepView is what a flow step's handler is told of its step, which a Go
// handler reads through CurrentStep and Params: a remote worker's job
// carries it (docs/http-api.md#remote-workers).
type StepView struct {
	Flow string `json:"flow"`
	Step string `json:"step"`
	// Undo is set on a step's rollback.
	Undo bool `json:"undo,omitempty"`
	// Params are the shared parameters as they stood when the step was
	// published: the request's and each finished step's result by name.
	Params map[string]json.RawMessage `json:"params,omitempty"`
	// TimeoutMS is the step's timeout (0: none), which a Go worker's
	// middleware keeps by cancelling the handler and failing the attempt.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// UnwrapStep returns the payload a flow step task's handler sees and its
// step, and whether t is a flow step task at all.
func UnwrapStep(t *task.Task) (payload json.RawMessage, step StepView, ok bool) {
	if t == nil {
		return nil, StepView{}, false
	}
	env, ok := stepEnvelope(t)
	if !ok {
		return nil, StepView{}, false
	}
	return env.Payload, StepView{Flow: env.Flow.Flow, Step: env.Flow.Name, Undo: env.Flow.Undo, Params: env.Params,
		TimeoutMS: time.Duration(env.Timeout).Milliseconds()}, true
}
