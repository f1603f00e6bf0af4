// Package control keeps the cluster-wide controls every worker obeys:
// pauses (of everything, a kind, or a lock key such as one device) and rate
// limits (at most N starts per duration, per kind or per lock key, with
// `device:*`-style defaults). Each is a document (task.Document) in the
// store, so they outlive any process and need no leader, and every write
// rings a doorbell document whose change event tells every worker to
// reload them at event latency. The decisions made from them (is this task paused, which
// limits apply) are pure functions of a loaded State.
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// The namespaces of the control documents; a document's id is its
// target's String.
const (
	PauseNamespace = "leasepool.pause"
	LimitNamespace = "leasepool.limit"
)

// The doorbell is the document every control write touches, so that the
// write reaches every worker on the change stream: workers open theirs
// with WatchParams.Documents holding DoorbellNamespace. Deleting it is
// harmless: the next write creates it again.
const (
	DoorbellNamespace = "leasepool.control"
	DoorbellID        = "doorbell"
)

// Scope is what a target names.
type Scope string

const (
	ScopeAll   Scope = "all"   // every task
	ScopeKind  Scope = "kind"  // tasks of one kind
	ScopeLock  Scope = "lock"  // tasks taking one lock key; a name ending in * is a prefix pattern
	ScopeGroup Scope = "group" // tasks of one group (task.Options.Group)
)

// Target is what a pause or a limit applies to.
type Target struct {
	Scope Scope  `json:"scope"`
	Name  string `json:"name,omitempty"`
}

// All targets every task.
func All() Target { return Target{Scope: ScopeAll} }

// Kind targets the tasks of kind.
func Kind(kind string) Target { return Target{Scope: ScopeKind, Name: kind} }

// Lock targets the tasks taking lock key (e.g. "device:pump-7"); a key
// ending in "*" targets every key with that prefix ("device:*").
func Lock(key string) Target { return Target{Scope: ScopeLock, Name: key} }

// Group targets the tasks of group (a tenant).
func Group(group string) Target { return Target{Scope: ScopeGroup, Name: group} }

// String is the target's stored id: "all", "kind:NAME", "lock:KEY" or
// "group:NAME".
func (t Target) String() string {
	if t.Scope == ScopeAll {
		return string(ScopeAll)
	}
	return string(t.Scope) + ":" + t.Name
}

// ParseTarget reads a target's String.
func ParseTarget(s string) (Target, error) {
	if s == string(ScopeAll) {
		return All(), nil
	}
	scope, name, ok := strings.Cut(s, ":")
	t := Target{Scope: Scope(scope), Name: name}
	if !ok {
		return Target{}, fmt.Errorf("%w: target %q: want all, kind:NAME, lock:KEY or group:NAME", task.ErrInvalid, s)
	}
	return t, t.Validate()
}

// Validate checks the scope and the name.
func (t Target) Validate() error {
	switch t.Scope {
	case ScopeAll:
		if t.Name != "" {
			return fmt.Errorf("%w: target all takes no name", task.ErrInvalid)
		}
		return nil
	case ScopeKind, ScopeLock, ScopeGroup:
		return task.ValidateName(string(t.Scope), t.Name)
	}
	return fmt.Errorf("%w: target scope %q: want all, kind, lock or group", task.ErrInvalid, t.Scope)
}

// PauseInfo is one pause in force.
type PauseInfo struct {
	Target Target    `json:"target"`
	Since  time.Time `json:"since"`
}

// Limit is what bounds its target, cluster-wide: a rate (at most N
// starts per Per), a concurrency (at most Concurrency running at once,
// each on its own for a lock pattern), and for a group its Weight, its
// share of the workers against other groups. A zero part is not set: a
// target needs at least one.
type Limit struct {
	Target      Target        `json:"target"`
	N           int           `json:"n,omitempty"`
	Per         time.Duration `json:"per,omitempty"`
	Weight      int           `json:"weight,omitempty"`
	Concurrency int           `json:"concurrency,omitempty"`
}

// MaxLimitN bounds N: each start takes one of N slot locks.
const MaxLimitN = 1000

// MaxLimitPer bounds Per: a slot lock is held until its start plus Per,
// which must stay a time the stores can hold (see task.MaxTime); past it
// the nanoseconds overflow and the slot reads as long expired.
const MaxLimitPer = 100 * 365 * 24 * time.Hour

// MaxWeight bounds a group's weight; DefaultWeight is a group's without one.
const (
	MaxWeight     = 1000
	DefaultWeight = 1
)

// MaxConcurrency bounds a concurrency limit: each running task holds one
// of its slot locks.
const MaxConcurrency = 1000

// Validate checks the target (kind, lock or group, not all) and each part
// set: the rate, the weight (groups only), the concurrency.
func (l Limit) Validate() error {
	if l.Target.Scope == ScopeAll {
		return fmt.Errorf("%w: a limit applies to a kind, a lock key or a group, not all", task.ErrInvalid)
	}
	if err := l.Target.Validate(); err != nil {
		return err
	}
	if l.Weight < 0 || l.Weight > MaxWeight {
		return fmt.Errorf("%w: limit %s: weight must be 1 to %d, got %d", task.ErrInvalid, l.Target, MaxWeight, l.Weight)
	}
	if l.Weight != 0 && l.Target.Scope != ScopeGroup {
		return fmt.Errorf("%w: limit %s: weight applies to a group only", task.ErrInvalid, l.Target)
	}
	if l.Concurrency < 0 || l.Concurrency > MaxConcurrency {
		return fmt.Errorf("%w: limit %s: concurrency must be 1 to %d, got %d", task.ErrInvalid, l.Target, MaxConcurrency, l.Concurrency)
	}
	if l.N == 0 && l.Per == 0 {
		if l.Weight == 0 && l.Concurrency == 0 {
			return fmt.Errorf("%w: limit %s: give a rate, a weight or a concurrency", task.ErrInvalid, l.Target)
		}
		return nil
	}
	if l.N < 1 || l.N > MaxLimitN {
		return fmt.Errorf("%w: limit %s: N must be 1 to %d, got %d", task.ErrInvalid, l.Target, MaxLimitN, l.N)
	}
	if l.Per < time.Millisecond || l.Per > MaxLimitPer {
		return fmt.Errorf("%w: limit %s: the duration must be from 1ms to %s, got %s", task.ErrInvalid, l.Target, MaxLimitPer, l.Per)
	}
	return nil
}

// String is the rate as the CLI reads it: "N/DURATION"; "-" for none.
func (l Limit) String() string {
	if l.N == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%s", l.N, l.Per)
}

// ParseRate reads "N/DURATION" (e.g. "2/1s"; "2/s" means 2/1s).
func ParseRate(s string) (n int, per time.Duration, err error) {
	ns, ds, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("%w: rate %q: want N/DURATION such as 2/1s", task.ErrInvalid, s)
	}
	if _, err := fmt.Sscan(ns, &n); err != nil || fmt.Sprint(n) != ns {
		return 0, 0, fmt.Errorf("%w: rate %q: %q is not a whole number", task.ErrInvalid, s, ns)
	}
	if ds != "" && (ds[0] < '0' || ds[0] > '9') {
		ds = "1" + ds
	}
	if per, err = time.ParseDuration(ds); err != nil {
		return 0, 0, fmt.Errorf("%w: rate %q: %w", task.ErrInvalid, s, err)
	}
	return n, per, nil
}

// pauseValue and limitValue are the stored document values. A resume or
// a removal deletes the document; a value marked off (paused false, N
// zero) reads as no control, as a store upgraded from shared records may
// hold one.
type pauseValue struct {
	Paused bool      `json:"paused"`
	Since  time.Time `json:"since,omitzero"`
}

type limitValue struct {
	N           int           `json:"n,omitempty"`
	Per         task.Duration `json:"per,omitempty"`
	Weight      int           `json:"weight,omitempty"`
	Concurrency int           `json:"concurrency,omitempty"`
}

// set reports whether v bounds anything.
func (v limitValue) set() bool { return v.N > 0 || v.Weight > 0 || v.Concurrency > 0 }

// errNoChange is put's fn saying the stored value already holds.
var errNoChange = errors.New("no change")

// put writes the document namespace/id with the value fn makes from the
// stored one (nil when none; a nil value from fn deletes the document),
// by compare-and-set, again from the newer document when another write
// came first; then rings the doorbell.
func put(ctx context.Context, st task.Store, namespace, id string, fn func(old json.RawMessage) (any, error)) error {
	for {
		var old json.RawMessage
		d, err := st.GetDocument(ctx, namespace, id)
		switch {
		case err == nil:
			old = d.Value
		case errors.Is(err, task.ErrNotFound):
			d = task.Document{Namespace: namespace, ID: id}
		default:
			return fmt.Errorf("read %s %s: %w", namespace, id, err)
		}
		v, err := fn(old)
		if errors.Is(err, errNoChange) {
			return nil
		}
		if err != nil {
			return err
		}
		if v == nil {
			err = st.DeleteDocument(ctx, namespace, id, d.Version)
			if errors.Is(err, task.ErrNotFound) && d.Version == 0 {
				err = nil
			}
		} else {
			d.Value, err = json.Marshal(v)
			if err != nil {
				return fmt.Errorf("encode %s %s: %w", namespace, id, err)
			}
			_, err = st.PutDocument(task.WithInternalWrite(ctx), d)
		}
		if errors.Is(err, task.ErrConflict) || (errors.Is(err, task.ErrNotFound) && d.Version > 0) {
			if err := ctx.Err(); err != nil {
				return err
			}
			continue // written or deleted since it was read
		}
		if err != nil {
			return fmt.Errorf("write %s %s: %w", namespace, id, err)
		}
		return Ring(ctx, st)
	}
}

// Ring touches the doorbell document so every worker reloads the
// controls now. Control writes ring it themselves. A put that loses to a
// concurrent one is done: that one's write came after this call read the
// doorbell, so after what the caller wrote before ringing.
func Ring(ctx context.Context, st task.Store) error {
	version, err := doorbellVersion(ctx, st)
	for err == nil {
		value := json.RawMessage(fmt.Sprintf(`{"rung_at":%q}`, st.Now().UTC().Format(time.RFC3339Nano)))
		_, err = st.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: DoorbellNamespace, ID: DoorbellID, Version: version, Value: value})
		if !errors.Is(err, task.ErrConflict) {
			break
		}
		// Rung by another writer since, or deleted meanwhile: then again.
		var now int64
		if now, err = doorbellVersion(ctx, st); err == nil && now > version {
			return nil
		}
		version = now
	}
	if err != nil {
		return fmt.Errorf("ring the control doorbell: %w", err)
	}
	return nil
}

// doorbellVersion is the doorbell's stored version, 0 when there is none.
func doorbellVersion(ctx context.Context, st task.Store) (int64, error) {
	d, err := st.GetDocument(ctx, DoorbellNamespace, DoorbellID)
	if errors.Is(err, task.ErrNotFound) {
		return 0, nil
	}
	return d.Version, err
}

// MarshalJSON writes Per as a duration string ("1s").
func (l Limit) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Target      Target        `json:"target"`
		N           int           `json:"n"`
		Per         task.Duration `json:"per"`
		Weight      int           `json:"weight,omitempty"`
		Concurrency int           `json:"concurrency,omitempty"`
	}{l.Target, l.N, task.Duration(l.Per), l.Weight, l.Concurrency})
}
