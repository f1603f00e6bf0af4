package task_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

func ExamplePublishParams_Validate() {
	p := task.PublishParams{Key: "report-2030-01", Kind: "exec"}
	p.PingInterval = 2 * time.Second
	if err := p.Validate(); err != nil {
		panic(err)
	}
	// Validate changes nothing; NewTask fills the defaults.
	fmt.Println(p.ConcurrentWorkerCnt, p.WorkerTimeout)
	t, err := task.NewTask(p, time.Now())
	if err != nil {
		panic(err)
	}
	fmt.Println(t.ConcurrentWorkerCnt, t.SuccessWorkerCnt, t.MaxUnexpectedRetries, time.Duration(t.PingInterval), time.Duration(t.WorkerTimeout), string(t.Payload))

	bad := task.PublishParams{Key: "k", Kind: "exec", Options: task.Options{PingInterval: 5 * time.Second, WorkerTimeout: 5 * time.Second}}
	err = bad.Validate()
	fmt.Println(errors.Is(err, task.ErrInvalid), err)
	// Output:
	// 0 0s
	// 1 1 3 2s 8s {}
	// true invalid: worker_timeout: (5s) must be above ping_interval (5s)
}

func ExampleNewTask() {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	t, err := task.NewTask(task.PublishParams{
		Key:     "resize/42",
		Kind:    "exec",
		Options: task.Options{RunAt: now.Add(time.Minute), MaxUnexpectedRetries: task.NoRetries},
	}, now)
	if err != nil {
		panic(err)
	}
	fmt.Println(t.Key, t.State, t.NextClaimAt.Format(time.TimeOnly), t.MaxUnexpectedRetries, t.Version)
	// Output:
	// resize/42 pending 12:01:00 0 1
}
