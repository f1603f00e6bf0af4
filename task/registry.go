package task

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// WorkerInfo is one worker process in the registry. A worker id is held by
// at most one live process: the one whose registration is ahead of the
// store's clock (Until). Each process has a random Instance id, carried by
// its claims and locks (Holder.Instance).
type WorkerInfo struct {
	ID          string    `json:"id"`
	Instance    string    `json:"instance"`
	Host        string    `json:"host"`
	PID         int       `json:"pid"`
	StartedAt   time.Time `json:"started_at"`
	Kinds       []string  `json:"kinds,omitempty"`
	Concurrency int       `json:"concurrency"`
	Running     int       `json:"running"`
	Heartbeat   time.Time `json:"heartbeat"`
	// Until is when the registration lapses unless renewed; after it,
	// another process may take the id.
	Until time.Time `json:"until"`
}

// Live reports whether the registration is still ahead of now.
func (w WorkerInfo) Live(now time.Time) bool { return now.Before(w.Until) }

// RegisterParams registers or renews a worker.
type RegisterParams struct {
	Worker WorkerInfo
	// Now is store time: a registration whose Until is not after Now is
	// free to take.
	Now time.Time
	// Replace, when set, lets this registration take over one held by that
	// instance although it is still live: its process is known to be dead
	// (same host, pid gone).
	Replace string
}

// ErrWorkerIDTaken means a live process already holds the worker id.
var ErrWorkerIDTaken = errors.New("worker id held by a live process")

// WorkerIDTakenError names the live process that holds a worker id.
type WorkerIDTakenError struct{ Holder WorkerInfo }

func (e *WorkerIDTakenError) Error() string {
	h := e.Holder
	return fmt.Sprintf("worker id %q is held by a live process on host %s, pid %d (instance %s, registration until %s); stop it, pick another --id, or wait until then",
		h.ID, h.Host, h.PID, h.Instance, h.Until.Format(time.RFC3339Nano))
}

func (e *WorkerIDTakenError) Unwrap() error { return ErrWorkerIDTaken }

// Registry is the part of Store that keeps the worker registry.
type Registry interface {
	// RegisterWorker stores p.Worker under its id when the id is free (no
	// record, or one whose Until is not after p.Now), already held by
	// p.Worker.Instance, or held by p.Replace; otherwise it fails with a
	// *WorkerIDTakenError. Renewals call it again.
	RegisterWorker(ctx context.Context, p RegisterParams) error
	// UnregisterWorker deletes id's record if instance still holds it.
	UnregisterWorker(ctx context.Context, id, instance string) error
	// Workers lists every record, live or lapsed, by id.
	Workers(ctx context.Context) ([]WorkerInfo, error)
}

// ValidateWorkerInfo checks what a registration must carry.
func ValidateWorkerInfo(w WorkerInfo) error {
	if err := ValidateName("worker id", w.ID); err != nil {
		return err
	}
	if strings.TrimSpace(w.Instance) == "" {
		return invalid("instance", "must not be empty")
	}
	if w.Until.IsZero() {
		return invalid("until", "must be set")
	}
	return nil
}
