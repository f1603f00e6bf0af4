package schedule

// The Go API: schedules are records of kind "schedule" in the task store,
// and each schedule's cursor (the latest slot published) a record of kind
// "schedule-cursor" whose At is that slot, so the store's "a put older than
// the stored record is ignored" keeps it from ever going back.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Record kinds in the store.
const (
	RecordKind = "schedule"
	CursorKind = "schedule-cursor"
)

var (
	ErrNotFound = errors.New("schedule not found")
	ErrExists   = errors.New("schedule exists")
	// ErrNoRecords means the store cannot hold schedules.
	ErrNoRecords = errors.New("store has no shared records")
)

type records interface {
	task.RecordStore
	task.RecordDeleter
}

func recordsOf(s task.Store) (records, error) {
	rs, ok := s.(records)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrNoRecords, s)
	}
	return rs, nil
}

// Add validates and stores sch. Its Since, CreatedAt and UpdatedAt are set
// to the store's now, so no slot before it is owed. A schedule of that
// name is an ErrExists unless replace is set.
func Add(ctx context.Context, s task.Store, sch Schedule, replace bool) (*Schedule, error) {
	if err := sch.Validate(); err != nil {
		return nil, err
	}
	old, err := Get(ctx, s, sch.Name)
	switch {
	case err == nil && !replace:
		return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", sch.Name, ErrExists)
	case err != nil && !errors.Is(err, ErrNotFound):
		return nil, err
	}
	now := s.Now().UTC()
	sch.Since, sch.CreatedAt, sch.UpdatedAt = now, now, now
	if old != nil {
		sch.CreatedAt = old.CreatedAt
	}
	return &sch, put(ctx, s, &sch)
}

// Get returns the schedule of name, or ErrNotFound.
func Get(ctx context.Context, s task.Store, name string) (*Schedule, error) {
	all, err := load(ctx, s, RecordKind)
	if err != nil {
		return nil, err
	}
	for _, r := range all {
		if r.ID == name {
			return decode(r)
		}
	}
	return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
}

// Info is a schedule with where it stands.
type Info struct {
	Schedule
	// LastSlot is the latest slot published (zero: none yet).
	LastSlot time.Time `json:"last_slot,omitzero"`
	// NextSlot is the next slot after now and after LastSlot (zero: none,
	// the schedule has ended).
	NextSlot time.Time `json:"next_slot,omitzero"`
}

// List returns every stored schedule by name, with its last and next
// slot. A record that does not decode or validate (the runner publishes
// nothing for it) is left out and reported to task.SkipMalformed.
func List(ctx context.Context, s task.Store) ([]Info, error) {
	recs, err := load(ctx, s, RecordKind)
	if err != nil {
		return nil, err
	}
	cursors, err := loadCursors(ctx, s)
	if err != nil {
		return nil, err
	}
	now := s.Now()
	out := make([]Info, 0, len(recs))
	for _, r := range recs {
		sch, err := decode(r)
		if err == nil {
			err = sch.Validate()
		}
		if err != nil {
			// Skipped as the runner skips it: it publishes nothing.
			task.SkipMalformed(RecordKind, r.ID+"@"+r.At.UTC().Format(time.RFC3339Nano), err)
			continue
		}
		in := Info{Schedule: *sch, LastSlot: cursors[sch.Name]}
		in.NextSlot = sch.nextAfter(latest(now, in.LastSlot, sch.Since))
		out = append(out, in)
	}
	return out, nil
}

// nextAfter is the first slot after t within [Start, End], or zero.
func (s *Schedule) nextAfter(t time.Time) time.Time {
	tt, err := s.timetable()
	if err != nil {
		return time.Time{}
	}
	n := tt.Next(latest(t, s.Start.Add(-time.Nanosecond)))
	if !s.End.IsZero() && n.After(s.End) {
		return time.Time{}
	}
	return n
}

// Remove deletes the schedule of name and its cursor. Tasks already
// published stay; a runner that loaded the schedule just before may still
// publish one more slot.
func Remove(ctx context.Context, s task.Store, name string) error {
	if _, err := Get(ctx, s, name); err != nil {
		return err
	}
	rs, err := recordsOf(s)
	if err != nil {
		return err
	}
	if err := rs.DeleteRecord(ctx, RecordKind, name); err != nil {
		return err
	}
	return rs.DeleteRecord(ctx, CursorKind, name)
}

// Pause stops the schedule of name from publishing.
func Pause(ctx context.Context, s task.Store, name string) (*Schedule, error) {
	return modify(ctx, s, name, func(sch *Schedule, _ time.Time) { sch.Paused = true })
}

// Resume lets the schedule of name publish again, from now: slots that
// fell while it was paused are not owed.
func Resume(ctx context.Context, s task.Store, name string) (*Schedule, error) {
	return modify(ctx, s, name, func(sch *Schedule, now time.Time) {
		if sch.Paused {
			sch.Paused, sch.Since = false, now
		}
	})
}

// modify changes a stored schedule. The last writer wins (records are
// ordered by their time), which is all an operator's pause needs.
func modify(ctx context.Context, s task.Store, name string, fn func(*Schedule, time.Time)) (*Schedule, error) {
	sch, err := Get(ctx, s, name)
	if err != nil {
		return nil, err
	}
	now := s.Now().UTC()
	fn(sch, now)
	sch.UpdatedAt = now
	return sch, put(ctx, s, sch)
}

func put(ctx context.Context, s task.Store, sch *Schedule) error {
	rs, err := recordsOf(s)
	if err != nil {
		return err
	}
	b, err := json.Marshal(sch)
	if err != nil {
		return fmt.Errorf("schedule %s: %w", sch.Name, err)
	}
	return rs.PutRecord(ctx, task.Record{Kind: RecordKind, ID: sch.Name, Value: b, At: sch.UpdatedAt})
}

func load(ctx context.Context, s task.Store, kind string) ([]task.Record, error) {
	rs, err := recordsOf(s)
	if err != nil {
		return nil, err
	}
	return rs.Records(ctx, kind)
}

func decode(r task.Record) (*Schedule, error) {
	var sch Schedule
	if err := json.Unmarshal(r.Value, &sch); err != nil {
		return nil, fmt.Errorf("schedule %s: stored record: %w", r.ID, err)
	}
	return &sch, nil
}

// cursor is the value of a CursorKind record.
type cursor struct {
	Slot time.Time `json:"slot"`
}

// loadCursors returns each schedule's latest published slot by name.
func loadCursors(ctx context.Context, s task.Store) (map[string]time.Time, error) {
	recs, err := load(ctx, s, CursorKind)
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(recs))
	for _, r := range recs {
		var c cursor
		if err := json.Unmarshal(r.Value, &c); err != nil {
			// Unreadable: the schedule starts from its Since, and
			// publishing is idempotent, so no slot runs twice.
			continue
		}
		out[r.ID] = c.Slot
	}
	return out, nil
}

// advance records slot as name's latest published slot; an older slot
// than the stored one is ignored by the store.
func advance(ctx context.Context, s task.Store, name string, slot time.Time) error {
	rs, err := recordsOf(s)
	if err != nil {
		return err
	}
	b, err := json.Marshal(cursor{Slot: slot.UTC()})
	if err != nil {
		return err
	}
	return rs.PutRecord(ctx, task.Record{Kind: CursorKind, ID: name, Value: b, At: slot})
}
