package trigger

// The Go API: each trigger is a document in Namespace and its position a
// document in PositionNamespace, both named by the trigger and written by
// compare-and-set.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// The namespaces of trigger documents.
const (
	Namespace         = "leasepool.trigger"
	PositionNamespace = "leasepool.trigger-position"
)

var (
	ErrNotFound = errors.New("trigger not found")
	ErrExists   = errors.New("trigger exists")
	// ErrUnsupported is a store with no collections to watch: only the
	// MongoDB backend has them.
	ErrUnsupported = fmt.Errorf("%w: collection: this store has no collections to watch (triggers need the MongoDB backend)", task.ErrInvalid)
)

// optionsRecord is task.Options as stored (RunAt aside).
type optionsRecord struct {
	Priority             int           `json:"priority,omitempty"`
	SpecificWorkerIDs    []string      `json:"specific_worker_ids,omitempty"`
	ConcurrentWorkerCnt  int           `json:"concurrent_worker_cnt,omitempty"`
	SuccessWorkerCnt     int           `json:"success_worker_cnt,omitempty"`
	MaxUnexpectedRetries int           `json:"max_unexpected_retries,omitempty"`
	PingInterval         task.Duration `json:"ping_interval,omitempty"`
	WorkerTimeout        task.Duration `json:"worker_timeout,omitempty"`
	LockKeys             []string      `json:"lock_keys,omitempty"`
}

// record is a Trigger as stored and as the API shows it.
type record struct {
	plain
	Options optionsRecord `json:"options"`
}

type plain Trigger

// MarshalJSON writes the trigger with its task options under "options".
func (t Trigger) MarshalJSON() ([]byte, error) {
	o := t.Options
	return json.Marshal(record{plain: plain(t), Options: optionsRecord{
		Priority: o.Priority, SpecificWorkerIDs: o.SpecificWorkerIDs, ConcurrentWorkerCnt: o.ConcurrentWorkerCnt,
		SuccessWorkerCnt: o.SuccessWorkerCnt, MaxUnexpectedRetries: o.MaxUnexpectedRetries,
		PingInterval: task.Duration(o.PingInterval), WorkerTimeout: task.Duration(o.WorkerTimeout), LockKeys: o.LockKeys,
	}})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (t *Trigger) UnmarshalJSON(b []byte) error {
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return err
	}
	*t = Trigger(r.plain)
	o := r.Options
	t.Options = task.Options{Priority: o.Priority, SpecificWorkerIDs: o.SpecificWorkerIDs, ConcurrentWorkerCnt: o.ConcurrentWorkerCnt,
		SuccessWorkerCnt: o.SuccessWorkerCnt, MaxUnexpectedRetries: o.MaxUnexpectedRetries,
		PingInterval: time.Duration(o.PingInterval), WorkerTimeout: time.Duration(o.WorkerTimeout), LockKeys: o.LockKeys}
	return nil
}

// watcher is the store's collection watcher, or ErrUnsupported.
func watcher(s task.Store) (task.CollectionWatcher, error) {
	cw, ok := s.(task.CollectionWatcher)
	if !ok {
		return nil, ErrUnsupported
	}
	return cw, nil
}

// Add validates t, checks its collection and filter against the server,
// and stores it; nothing is written when a check fails. Operations
// default to DefaultOperations; Since, CreatedAt and UpdatedAt are set to
// the store's now, so the changes from then on publish. A trigger of that
// name is an ErrExists unless replace is set: a replaced trigger keeps
// its position, unless it names another collection (then it starts from
// now).
func Add(ctx context.Context, s task.Store, t Trigger, replace bool) (*Trigger, error) {
	t.withDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if t.Table != "" {
		return addTable(ctx, s, t, replace)
	}
	if _, ok := s.(task.TableTriggerStore); ok {
		return nil, ErrCollectionOnTables
	}
	cw, err := watcher(s)
	if err != nil {
		return nil, err
	}
	if err := cw.CheckCollectionWatch(ctx, t.Watch()); err != nil {
		return nil, err
	}
	for {
		d, err := s.GetDocument(ctx, Namespace, t.Name)
		switch {
		case err == nil && !replace:
			return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", t.Name, ErrExists)
		case errors.Is(err, task.ErrNotFound):
			d = task.Document{Namespace: Namespace, ID: t.Name}
			// A position left by a removed trigger of this name is not
			// this one's: it starts from now.
			if err := s.DeleteDocument(task.WithInternalWrite(ctx), PositionNamespace, t.Name, 0); err != nil && !errors.Is(err, task.ErrNotFound) {
				return nil, fmt.Errorf("add %s: %w", t.Name, err)
			}
		case err != nil:
			return nil, fmt.Errorf("add %s: %w", t.Name, err)
		}
		now := s.Now().UTC()
		t.Since, t.CreatedAt, t.UpdatedAt = now, now, now
		if old, err := decode(d); d.Version > 0 && err == nil {
			t.CreatedAt, t.Paused = old.CreatedAt, old.Paused
			if old.Collection == t.Collection {
				t.Since = old.Since
			} else if err := s.DeleteDocument(task.WithInternalWrite(ctx), PositionNamespace, t.Name, 0); err != nil && !errors.Is(err, task.ErrNotFound) {
				// Another collection's position means nothing here: from now.
				return nil, fmt.Errorf("add %s: %w", t.Name, err)
			}
		}
		err = put(ctx, s, d, &t)
		if errors.Is(err, task.ErrConflict) && !replace {
			return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", t.Name, ErrExists)
		}
		if !task.RetryConflict(ctx, &err) {
			return &t, err
		}
	}
}

// Get returns the trigger of name, or ErrNotFound.
func Get(ctx context.Context, s task.Store, name string) (*Trigger, error) {
	d, err := get(ctx, s, name)
	if err != nil {
		return nil, err
	}
	return decode(d)
}

func get(ctx context.Context, s task.Store, name string) (task.Document, error) {
	d, err := s.GetDocument(ctx, Namespace, name)
	if errors.Is(err, task.ErrNotFound) || errors.Is(err, task.ErrInvalid) {
		return d, fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	return d, err
}

// Info is a trigger with where it stands.
type Info struct {
	Trigger
	// Position says how far the trigger has published.
	Position Position `json:"position"`
}

// MarshalJSON writes the trigger's fields and its position.
func (in Info) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(in.Trigger)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m["position"], err = json.Marshal(in.Position); err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// List returns every stored trigger by name, with its position. A
// document that does not decode or validate (the runner runs nothing for
// it) is left out and reported to task.SkipMalformed.
func List(ctx context.Context, s task.Store) ([]Info, error) {
	trs, err := loadAll(ctx, s)
	if err != nil {
		return nil, err
	}
	docs, err := s.Documents(ctx, PositionNamespace)
	if err != nil {
		return nil, fmt.Errorf("trigger positions: %w", err)
	}
	pos := map[string]Position{}
	for _, d := range docs {
		var p Position
		if err := json.Unmarshal(d.Value, &p); err != nil {
			task.SkipMalformed(PositionNamespace, docName(d), err)
			continue
		}
		pos[d.ID] = p
	}
	out := make([]Info, 0, len(trs))
	for _, t := range trs {
		out = append(out, Info{Trigger: *t, Position: pos[t.Name]})
	}
	return out, nil
}

// loadAll returns every stored trigger that decodes and validates, by
// name, with the version of its document; the others are reported to
// task.SkipMalformed.
func loadAll(ctx context.Context, s task.Store) ([]*Trigger, error) {
	loaded, err := loadVersions(ctx, s)
	out := make([]*Trigger, len(loaded))
	for i, l := range loaded {
		out[i] = l.t
	}
	return out, err
}

type loaded struct {
	t       *Trigger
	version int64
}

func loadVersions(ctx context.Context, s task.Store) ([]loaded, error) {
	docs, err := s.Documents(ctx, Namespace)
	if err != nil {
		return nil, fmt.Errorf("triggers: %w", err)
	}
	out := make([]loaded, 0, len(docs))
	for _, d := range docs {
		t, err := decode(d)
		if err == nil {
			err = t.Validate()
		}
		if err != nil {
			task.SkipMalformed(Namespace, docName(d), err)
			continue
		}
		out = append(out, loaded{t: t, version: d.Version})
	}
	return out, nil
}

// Remove deletes the trigger of name and its position. Tasks already
// published stay; the runner stops following it within a poll.
func Remove(ctx context.Context, s task.Store, name string) error {
	d, err := get(ctx, s, name)
	if err != nil {
		return err
	}
	if ts, ok := s.(task.TableTriggerStore); ok {
		// Its SQL triggers (a table trigger's) go with it, and what they
		// recorded that is not published yet.
		err := ts.DropTableTrigger(task.WithInternalWrite(ctx), name, d)
		if errors.Is(err, task.ErrNotFound) {
			return fmt.Errorf("%s: %w", name, ErrNotFound)
		}
		return err
	}
	err = s.DeleteDocument(task.WithInternalWrite(ctx), Namespace, name, 0)
	if errors.Is(err, task.ErrNotFound) {
		return fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	if err != nil {
		return err
	}
	if err := s.DeleteDocument(task.WithInternalWrite(ctx), PositionNamespace, name, 0); err != nil && !errors.Is(err, task.ErrNotFound) {
		return err
	}
	return nil
}

// Pause stops the trigger of name from publishing; its position stays.
func Pause(ctx context.Context, s task.Store, name string) (*Trigger, error) {
	return modify(ctx, s, name, func(t *Trigger) { t.Paused = true })
}

// Resume lets the trigger of name publish again, from its position: the
// changes made while it was paused publish too.
func Resume(ctx context.Context, s task.Store, name string) (*Trigger, error) {
	return modify(ctx, s, name, func(t *Trigger) { t.Paused = false })
}

func modify(ctx context.Context, s task.Store, name string, fn func(*Trigger)) (*Trigger, error) {
	for {
		d, err := get(ctx, s, name)
		if err != nil {
			return nil, err
		}
		t, err := decode(d)
		if err != nil {
			return nil, err
		}
		fn(t)
		t.UpdatedAt = s.Now().UTC()
		err = put(ctx, s, d, t)
		if errors.Is(err, task.ErrNotFound) {
			return nil, fmt.Errorf("%s: %w", name, ErrNotFound)
		}
		if !task.RetryConflict(ctx, &err) {
			return t, err
		}
	}
}

func put(ctx context.Context, s task.Store, d task.Document, t *Trigger) error {
	b, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("trigger %s: %w", t.Name, err)
	}
	d.Value = b
	_, err = s.PutDocument(task.WithInternalWrite(ctx), d)
	return err
}

func decode(d task.Document) (*Trigger, error) {
	var t Trigger
	if err := json.Unmarshal(d.Value, &t); err != nil {
		return nil, fmt.Errorf("trigger %s: stored document: %w", d.ID, err)
	}
	if t.Name != d.ID {
		return nil, fmt.Errorf("trigger %s: stored document holds trigger %q", d.ID, t.Name)
	}
	return &t, nil
}

func docName(d task.Document) string { return d.ID + "@" + strconv.FormatInt(d.Version, 10) }

// Position is how far a trigger has published, stored only after what it
// names is published.
type Position struct {
	// Token resumes the change stream after the last change published
	// (or left out by the filter). Empty: from StartAt.
	Token task.Token `json:"token,omitempty"`
	// StartAt is where a stream starts without a token: the trigger's
	// Since, or a rescan's start.
	StartAt time.Time `json:"start_at,omitzero"`
	// Published counts the tasks published for changes (those already
	// there, by a replay, included).
	Published int64 `json:"published,omitempty"`
	// Rescan is the latest rescan, when the server had lost the position.
	Rescan *Rescan   `json:"rescan,omitempty"`
	At     time.Time `json:"updated_at,omitzero"`
}

// Rescan is one rescan of the matching documents.
type Rescan struct {
	// From: the stream resumes from here once the scan is done, so every
	// change made during the scan publishes too.
	From time.Time `json:"from"`
	// Done is false while the scan runs: a runner that finds it false
	// scans again (the same keys: nothing published twice).
	Done bool `json:"done"`
	// Published counts the documents the scan published tasks for
	// (already there included).
	Published int64 `json:"published"`
	// Count is how many rescans the trigger has had.
	Count int `json:"count"`
}

// loadPosition returns name's position and its document's version (0:
// none stored).
func loadPosition(ctx context.Context, s task.Store, name string) (Position, int64, error) {
	d, err := s.GetDocument(ctx, PositionNamespace, name)
	if errors.Is(err, task.ErrNotFound) {
		return Position{}, 0, nil
	}
	if err != nil {
		return Position{}, 0, err
	}
	var p Position
	if err := json.Unmarshal(d.Value, &p); err != nil {
		// A forged or broken position: start from the trigger's Since, as
		// for a new trigger (the keys make a replay publish nothing new).
		task.SkipMalformed(PositionNamespace, docName(d), err)
		return Position{}, d.Version, nil
	}
	return p, d.Version, nil
}

// savePosition stores p over version (0: none stored) and returns the new
// version. A conflict (a former holder's write, in the instant two may
// overlap) is resolved by writing over the newer one: both published
// what they stored.
func savePosition(ctx context.Context, s task.Store, name string, version int64, p Position) (int64, error) {
	p.At = s.Now().UTC()
	b, err := json.Marshal(p)
	if err != nil {
		return version, err
	}
	for {
		d, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: PositionNamespace, ID: name, Version: version, Value: b})
		if err == nil {
			return d.Version, nil
		}
		if !errors.Is(err, task.ErrConflict) || ctx.Err() != nil {
			return version, err
		}
		cur, gerr := s.GetDocument(ctx, PositionNamespace, name)
		switch {
		case errors.Is(gerr, task.ErrNotFound) && version != 0:
			// Removed meanwhile (Remove): a position written now would
			// outlive its trigger.
			return 0, fmt.Errorf("trigger %s: position removed: %w", name, ErrNotFound)
		case errors.Is(gerr, task.ErrNotFound):
			version = 0
		case gerr != nil:
			return version, gerr
		default:
			version = cur.Version
		}
	}
}
