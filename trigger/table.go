package trigger

// Triggers on the embedded store's tables: Trigger.Table names a table of
// the store's file, and the store (task.TableTriggerStore) keeps SQL
// triggers on it that record each matching change in an outbox table of
// leasepool's, in the user's own transaction. The elected worker's runner
// drains the outbox: each change's task is published and the change
// deleted in one transaction, so a change makes exactly one task, keyed
// by the change's number, however the workers crash.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/leasepool/leasepool/task"
)

// DefaultTableOperations are the kinds of change a table trigger takes
// by default.
var DefaultTableOperations = []string{task.OpInsert, task.OpUpdate}

// ErrCollectionOnTables is a collection trigger on the embedded store,
// whose triggers name a table.
var ErrCollectionOnTables = fmt.Errorf("%w: collection: the embedded store has tables, not collections: use --table (table in the API)", task.ErrInvalid)

// ErrTableUnsupported is a table trigger on a store without tables.
var ErrTableUnsupported = fmt.Errorf("%w: table: this store has no tables of yours (a table trigger needs the embedded store; on MongoDB use --collection)", task.ErrInvalid)

// TableKey is the task key of the change numbered id of a table
// trigger: the store never numbers two changes alike.
func TableKey(name string, id int64) string {
	return KeyPrefix + name + ":row:" + strconv.FormatInt(id, 10)
}

// TableTrigger is t's SQL side.
func (t *Trigger) TableTrigger() task.TableTrigger {
	return task.TableTrigger{Name: t.Name, Table: t.Table, Filter: t.Filter, Operations: t.Operations, Columns: t.Fields}
}

// validateTable is Validate for a table trigger: the name and the table
// are identifiers, the filter a JSON object of column values.
func (t *Trigger) validateTable() error {
	if err := validateName(t.Name); err != nil {
		return err
	}
	if t.Collection != "" {
		return invalid("collection", "give a collection or a table, not both")
	}
	if t.VersionField != "" {
		return invalid("version_field", "a table trigger never rescans: it takes no version field")
	}
	if len(t.Filter) > maxFilter {
		return invalid("filter", fmt.Sprintf("is %d bytes, more than %d", len(t.Filter), maxFilter))
	}
	if err := t.TableTrigger().Validate(); err != nil {
		return err
	}
	if !t.Options.RunAt.IsZero() {
		return invalid("run_at", "a trigger's task is claimable when published")
	}
	return t.params(TableKey(t.Name, 1<<62), nil).Validate()
}

// addTable is Add for a table trigger: the store checks the table and
// the filter's columns, and sets the SQL triggers and the definition in
// one transaction.
func addTable(ctx context.Context, s task.Store, t Trigger, replace bool) (*Trigger, error) {
	ts, ok := s.(task.TableTriggerStore)
	if !ok {
		return nil, ErrTableUnsupported
	}
	for {
		d, err := s.GetDocument(ctx, Namespace, t.Name)
		switch {
		case err == nil && !replace:
			return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", t.Name, ErrExists)
		case errors.Is(err, task.ErrNotFound):
			d = task.Document{Namespace: Namespace, ID: t.Name}
		case err != nil:
			return nil, fmt.Errorf("add %s: %w", t.Name, err)
		}
		now := s.Now().UTC()
		t.Since, t.CreatedAt, t.UpdatedAt = now, now, now
		if old, err := decode(d); d.Version > 0 && err == nil {
			t.CreatedAt, t.Paused = old.CreatedAt, old.Paused
		}
		b, err := json.Marshal(&t)
		if err != nil {
			return nil, fmt.Errorf("trigger %s: %w", t.Name, err)
		}
		d.Value = b
		_, err = ts.SetTableTrigger(task.WithInternalWrite(ctx), t.TableTrigger(), d)
		if errors.Is(err, task.ErrConflict) && !replace {
			return nil, fmt.Errorf("add %s: %w (remove it first, or replace it)", t.Name, ErrExists)
		}
		if !task.RetryConflict(ctx, &err) {
			if err != nil {
				return nil, err
			}
			return &t, nil
		}
	}
}

// tableBuild is the publish of a change of t's table: its row as the
// payload, or, for a row too large or deep for one, the change's number
// and why, so that the change still has its task.
func (t *Trigger) tableBuild(c task.OutboxChange) task.PublishParams {
	payload := c.Row
	if err := task.ValidatePayload(payload); err != nil {
		payload, _ = json.Marshal(map[string]any{"change": c.ID, "operation": c.Operation, "row_dropped": err.Error()})
	}
	return t.params(TableKey(t.Name, c.ID), payload)
}

// DefaultDrainEvery is how often the runner looks for the changes table
// triggers recorded.
const DefaultDrainEvery = 100 * time.Millisecond

// drainTables is the runner's duty on a store with tables: it publishes
// what every active table trigger recorded, every DefaultDrainEvery,
// until ctx ends.
func (r *Runner) drainTables(ctx context.Context, ts task.TableTriggerStore) error {
	t := time.NewTicker(DefaultDrainEvery)
	defer t.Stop()
	var loadedAt time.Time
	var active []loaded
	for {
		if time.Since(loadedAt) >= r.cfg.Poll {
			all, err := loadVersions(ctx, r.cfg.Store)
			if err != nil && ctx.Err() == nil {
				r.log.Warn("triggers: not read; trying again next poll", slog.Any("err", err))
			}
			if err == nil {
				active, loadedAt = active[:0], time.Now()
				for _, l := range all {
					if l.t.Table != "" && !l.t.Paused {
						active = append(active, l)
					}
				}
			}
		}
		for _, l := range active {
			def := task.Document{Namespace: Namespace, ID: l.t.Name, Version: l.version}
			for ctx.Err() == nil {
				n, err := ts.DrainOutbox(ctx, def, l.t.Name, r.cfg.Batch, l.t.tableBuild)
				if errors.Is(err, task.ErrConflict) || errors.Is(err, task.ErrNotFound) {
					// Paused, replaced or removed since read: read again.
					loadedAt = time.Time{}
					break
				}
				if err != nil {
					if ctx.Err() == nil {
						r.log.Warn("trigger: changes not published; trying again", slog.String("trigger", l.t.Name), slog.Any("err", err))
					}
					break
				}
				if n < r.cfg.Batch {
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
