package schedule

// The Go API: each schedule is a document (task.Document) in Namespace,
// and each schedule's cursor (the latest slot published) a document in
// CursorNamespace, both named by the schedule's name and written by
// compare-and-set. A cursor is only ever moved forward.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// The namespaces of schedule documents.
const (
	Namespace       = "leasepool.schedule"
	CursorNamespace = "leasepool.schedule-cursor"
)

var (
	ErrNotFound = errors.New("schedule not found")
	ErrExists   = errors.New("schedule exists")
)

// Add validates and stores sch. Its Since, CreatedAt and UpdatedAt are set
// to the store's now, so no slot before it is owed. A schedule of that
// name is an ErrExists unless replace is set.
func Add(ctx context.Context, s task.Store, sch Schedule, replace bool) (*Schedule, error) {
	if err := sch.Validate(); err != nil {
		return nil, err
	}
	for {
		d, err := s.GetDocument(ctx, Namespace, sch.Name)
		switch {
		case err == nil && !replace:
			return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", sch.Name, ErrExists)
		case errors.Is(err, task.ErrNotFound):
			d = task.Document{Namespace: Namespace, ID: sch.Name}
		case err != nil:
			return nil, fmt.Errorf("add %s: %w", sch.Name, err)
		}
		now := s.Now().UTC()
		sch.Since, sch.CreatedAt, sch.UpdatedAt = now, now, now
		if old, err := decode(d); d.Version > 0 && err == nil {
			sch.CreatedAt = old.CreatedAt
		}
		err = put(ctx, s, d, &sch)
		if errors.Is(err, task.ErrConflict) && !replace {
			return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", sch.Name, ErrExists)
		}
		if !task.RetryConflict(ctx, &err) {
			return &sch, err
		}
	}
}

// Get returns the schedule of name, or ErrNotFound.
func Get(ctx context.Context, s task.Store, name string) (*Schedule, error) {
	d, err := get(ctx, s, name)
	if err != nil {
		return nil, err
	}
	return decode(d)
}

func get(ctx context.Context, s task.Store, name string) (task.Document, error) {
	d, err := s.GetDocument(ctx, Namespace, name)
	if errors.Is(err, task.ErrNotFound) {
		return d, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if errors.Is(err, task.ErrInvalid) {
		// No schedule can have a name a document cannot.
		return d, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	return d, err
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
// slot. A document that does not decode or validate (the runner publishes
// nothing for it) is left out and reported to task.SkipMalformed.
func List(ctx context.Context, s task.Store) ([]Info, error) {
	schs, err := loadAll(ctx, s)
	if err != nil {
		return nil, err
	}
	cursors, err := loadCursors(ctx, s)
	if err != nil {
		return nil, err
	}
	now := s.Now()
	out := make([]Info, 0, len(schs))
	for _, sch := range schs {
		in := Info{Schedule: *sch, LastSlot: cursors[sch.Name]}
		in.NextSlot = sch.nextAfter(latest(now, in.LastSlot, sch.Since))
		out = append(out, in)
	}
	return out, nil
}

// loadAll returns every stored schedule that decodes and validates, by
// name; the others are reported to task.SkipMalformed.
func loadAll(ctx context.Context, s task.Store) ([]*Schedule, error) {
	docs, err := s.Documents(ctx, Namespace)
	if err != nil {
		return nil, fmt.Errorf("schedules: %w", err)
	}
	out := make([]*Schedule, 0, len(docs))
	for _, d := range docs {
		sch, err := decode(d)
		if err == nil {
			// A document Add did not write (a built-in's name, a bad
			// template) is not a schedule.
			err = sch.Validate()
		}
		if err != nil {
			task.SkipMalformed(Namespace, docName(d), err)
			continue
		}
		out = append(out, sch)
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
	if _, err := get(ctx, s, name); err != nil {
		return err
	}
	err := s.DeleteDocument(ctx, Namespace, name, 0)
	if errors.Is(err, task.ErrNotFound) {
		return fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if err := s.DeleteDocument(ctx, CursorNamespace, name, 0); err != nil && !errors.Is(err, task.ErrNotFound) {
		return err
	}
	return nil
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

// modify changes a stored schedule by compare-and-set, again on the newer
// document when another write came first.
func modify(ctx context.Context, s task.Store, name string, fn func(*Schedule, time.Time)) (*Schedule, error) {
	for {
		d, err := get(ctx, s, name)
		if err != nil {
			return nil, err
		}
		sch, err := decode(d)
		if err != nil {
			return nil, err
		}
		now := s.Now().UTC()
		fn(sch, now)
		sch.UpdatedAt = now
		err = put(ctx, s, d, sch)
		if errors.Is(err, task.ErrNotFound) {
			return nil, fmt.Errorf("%s: %w", name, ErrNotFound) // removed meanwhile
		}
		if !task.RetryConflict(ctx, &err) {
			return sch, err
		}
	}
}

// put writes sch over d (as read: its version) by compare-and-set.
func put(ctx context.Context, s task.Store, d task.Document, sch *Schedule) error {
	b, err := json.Marshal(sch)
	if err != nil {
		return fmt.Errorf("schedule %s: %w", sch.Name, err)
	}
	d.Value = b
	_, err = s.PutDocument(task.WithInternalWrite(ctx), d)
	return err
}

func decode(d task.Document) (*Schedule, error) {
	var sch Schedule
	if err := json.Unmarshal(d.Value, &sch); err != nil {
		return nil, fmt.Errorf("schedule %s: stored document: %w", d.ID, err)
	}
	if sch.Name != d.ID {
		return nil, fmt.Errorf("schedule %s: stored document holds schedule %q", d.ID, sch.Name)
	}
	return &sch, nil
}

// docName names a document for task.SkipMalformed: its id and version,
// what changes when it is rewritten.
func docName(d task.Document) string { return d.ID + "@" + strconv.FormatInt(d.Version, 10) }

// cursor is the value of a CursorNamespace document.
type cursor struct {
	Slot time.Time `json:"slot"`
}

// loadCursors returns each schedule's latest published slot by name. An
// unreadable cursor is reported to task.SkipMalformed and left out: the
// schedule starts from its Since, and publishing is idempotent, so no
// slot runs twice.
func loadCursors(ctx context.Context, s task.Store) (map[string]time.Time, error) {
	docs, err := s.Documents(ctx, CursorNamespace)
	if err != nil {
		return nil, fmt.Errorf("schedule cursors: %w", err)
	}
	out := make(map[string]time.Time, len(docs))
	for _, d := range docs {
		var c cursor
		if err := json.Unmarshal(d.Value, &c); err != nil {
			task.SkipMalformed(CursorNamespace, docName(d), err)
			continue
		}
		out[d.ID] = c.Slot
	}
	return out, nil
}

// advance records slot as name's latest published slot, unless a later
// one is stored: runners race to advance the same cursor, and it never
// goes back.
func advance(ctx context.Context, s task.Store, name string, slot time.Time) error {
	b, err := json.Marshal(cursor{Slot: slot.UTC()})
	if err != nil {
		return err
	}
	for {
		d, err := s.GetDocument(ctx, CursorNamespace, name)
		switch {
		case errors.Is(err, task.ErrNotFound):
			d = task.Document{Namespace: CursorNamespace, ID: name}
		case err != nil:
			return err
		default:
			var c cursor
			if json.Unmarshal(d.Value, &c) == nil && !c.Slot.Before(slot) {
				return nil
			}
		}
		d.Value = b
		_, err = s.PutDocument(task.WithInternalWrite(ctx), d)
		if !task.RetryConflict(ctx, &err) {
			return err
		}
	}
}
