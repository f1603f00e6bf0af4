package consumer

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/leasepool/leasepool/task"
)

// output gathers what a handler records for its attempt (Job.SetResult,
// Job.Log), bounded as task.Record stores it; the outcome write stores it.
type output struct {
	mu      sync.Mutex
	now     func() time.Time // store time; nil: the local clock
	result  json.RawMessage
	log     []task.LogLine
	dropped int
}

// SetResult records v, as JSON, as this attempt's result, stored with the
// attempt when it ends (whatever the outcome) and read back with
// task.Task.Result once the task succeeded. A later call replaces it; nil
// clears it. It fails, recording nothing, when v does not encode or its
// JSON is over task.MaxResultSize bytes.
func (j *Job) SetResult(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("%w: result: %w", task.ErrInvalid, err)
	}
	if err := task.ValidateResult(b); err != nil {
		return err
	}
	j.out.mu.Lock()
	j.out.result = b
	j.out.mu.Unlock()
	return nil
}

// Log records one short line with this attempt, its operands formatted
// as fmt.Sprint does (as testing.T.Log), cleaned and cut by task.LogText.
// The attempt keeps its latest task.MaxLogLines lines and counts the ones
// before. It is safe for concurrent use.
func (j *Job) Log(args ...any) { j.log(fmt.Sprint(args...)) }

// Logf is Log with fmt.Sprintf's formatting.
func (j *Job) Logf(format string, args ...any) { j.log(fmt.Sprintf(format, args...)) }

func (j *Job) log(msg string) {
	j.out.mu.Lock()
	defer j.out.mu.Unlock()
	at := time.Now()
	if j.out.now != nil {
		at = j.out.now()
	}
	j.out.log = append(j.out.log, task.LogLine{At: at.UTC(), Msg: task.LogText(msg)})
	if n := len(j.out.log) - task.MaxLogLines; n > 0 {
		// Copy down rather than reslice, so memory stays bounded too.
		j.out.log = append(j.out.log[:0], j.out.log[n:]...)
		j.out.dropped += n
	}
}

// Output returns what the handler recorded so far.
func (j *Job) Output() task.Output {
	j.out.mu.Lock()
	defer j.out.mu.Unlock()
	return task.Output{Result: j.out.result, Log: append([]task.LogLine(nil), j.out.log...), LogDropped: j.out.dropped}
}

// withOutput makes an outcome write record out on h's entry first.
func withOutput(h task.Holder, out task.Output, write func(*task.Task) error) func(*task.Task) error {
	return func(t *task.Task) error {
		t.Record(h, out)
		return write(t)
	}
}
