package task

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// ReservedPrefix starts the task keys of leasepool's own (flows and the
// control doorbell in stores written before they were documents): they are
// not users' tasks, so List and Stats leave them out and they yield no
// lifecycle events.
const ReservedPrefix = "leasepool:"

// Reserved reports whether key belongs to leasepool itself, not to a task.
func Reserved(key string) bool { return strings.HasPrefix(key, ReservedPrefix) }

// reservedEnd is the first key after every key with ReservedPrefix (the
// prefix with its last byte incremented), so backends exclude reserved
// keys with a range test on the key index.
const reservedEnd = "leasepool;"

// ReservedRange is the key range [lo, hi) holding every reserved key.
func ReservedRange() (lo, hi string) { return ReservedPrefix, reservedEnd }

// ListQuery selects one page of tasks for admin tools. Every set filter
// must hold. Pages are seeks on seq, never offsets, so a deep page costs
// what the first does:
//
//   - oldest first: the next page has AfterSeq = the last task's Seq;
//   - newest first (Desc): the next page has BeforeSeq = the last task's
//     Seq; the page before (newer tasks) is AfterSeq = the first task's Seq
//     without Desc, read in reverse.
//
// Tasks published while paging land after the newest seq (SQLite's seq
// only grows; MongoDB's grows with store time), so a walk in either
// direction sees every task that existed when it started exactly once.
type ListQuery struct {
	State State  // empty: any
	Kind  string // empty: any
	// KeyPrefix keeps keys starting with it.
	KeyPrefix string
	// WorkerID keeps tasks whose worker list has an entry of this worker
	// id (in any state: running, finished, or expired and recorded).
	WorkerID string
	// Text keeps tasks whose payload, as compact JSON, contains it
	// (case-sensitive).
	Text string
	// CreatedAfter and CreatedBefore keep tasks created strictly inside the
	// range, compared in whole milliseconds (UnixMilli) as MongoDB stores
	// times; a zero bound is open. Likewise UpdatedAfter/UpdatedBefore.
	CreatedAfter, CreatedBefore time.Time
	UpdatedAfter, UpdatedBefore time.Time
	// AfterSeq keeps Seq > AfterSeq; BeforeSeq, when not 0, Seq < BeforeSeq.
	AfterSeq  int64
	BeforeSeq int64
	// Desc lists newest first (Seq descending).
	Desc  bool
	Limit int // 0: no limit
	// Reserved lists leasepool's own documents (keys under ReservedPrefix,
	// such as flow documents) instead of tasks.
	Reserved bool
}

// Validate checks q; its errors wrap ErrInvalid and name the field.
func (q ListQuery) Validate() error {
	if q.State != "" {
		if _, err := ParseState(string(q.State)); err != nil {
			return err
		}
	}
	switch {
	case q.Limit < 0:
		return invalid("limit", "must not be negative")
	case q.AfterSeq < 0:
		return invalid("after_seq", "must not be negative")
	case q.BeforeSeq < 0:
		return invalid("before_seq", "must not be negative")
	case len(q.Kind) > MaxNameLen, len(q.KeyPrefix) > MaxNameLen, len(q.WorkerID) > MaxNameLen, len(q.Text) > MaxNameLen:
		return invalid("filter", fmt.Sprintf("strings are at most %d bytes", MaxNameLen))
	}
	return nil
}

// Matches reports whether t passes q's filters (not its seq bounds): the
// reference the backends' queries agree with.
func (q ListQuery) Matches(t *Task) bool {
	switch {
	case Reserved(t.Key) != q.Reserved,
		q.State != "" && t.State != q.State,
		q.Kind != "" && t.Kind != q.Kind,
		!strings.HasPrefix(t.Key, q.KeyPrefix),
		!inRange(t.CreatedAt, q.CreatedAfter, q.CreatedBefore),
		!inRange(t.UpdatedAt, q.UpdatedAfter, q.UpdatedBefore):
		return false
	}
	if q.WorkerID != "" && !t.HasWorker(q.WorkerID) {
		return false
	}
	return q.Text == "" || PayloadContains(t.Payload, q.Text)
}

// HasWorker reports whether t's worker list has an entry of worker id.
func (t *Task) HasWorker(id string) bool {
	for _, w := range t.Attempts {
		if w.WorkerID == id {
			return true
		}
	}
	return false
}

// PayloadContains reports whether payload, as compact JSON, contains s.
func PayloadContains(payload json.RawMessage, s string) bool {
	var b bytes.Buffer
	if err := json.Compact(&b, payload); err != nil {
		return bytes.Contains(payload, []byte(s))
	}
	return bytes.Contains(b.Bytes(), []byte(s))
}

// inRange compares whole milliseconds, as MongoDB stores times.
func inRange(t, after, before time.Time) bool {
	ms := t.UnixMilli()
	return (after.IsZero() || ms > after.UnixMilli()) && (before.IsZero() || ms < before.UnixMilli())
}

// Stats is a snapshot of the queue's size.
type Stats struct {
	// Counts has one entry per state and kind with at least one task.
	Counts []StateCount `json:"counts"`
	// OldestReadyAt is when the longest-waiting ready pending task became
	// claimable (its next_claim_at); zero when no pending task is ready.
	OldestReadyAt time.Time `json:"oldest_ready_at,omitzero"`
}

// StateCount is how many tasks of one kind are in one state.
type StateCount struct {
	State State  `json:"state"`
	Kind  string `json:"kind"`
	N     int64  `json:"n"`
}

// ByState sums the counts per state.
func (s Stats) ByState() map[State]int64 {
	m := make(map[State]int64, 5)
	for _, c := range s.Counts {
		m[c.State] += c.N
	}
	return m
}
