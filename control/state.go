package control

// The Go API over the stored controls, and State: the controls loaded at
// one moment, which answers the scheduler's questions without store trips.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Pause pauses target cluster-wide: workers start nothing it covers until
// Resume; what runs finishes. It reports whether target was not paused yet.
func Pause(ctx context.Context, st task.Store, target Target) (changed bool, err error) {
	return setPause(ctx, st, target, true)
}

// Resume lifts target's pause; workers start its tasks at once. It reports
// whether target was paused. Resuming everything (All) lifts only the
// pause of All, not those of kinds or lock keys.
func Resume(ctx context.Context, st task.Store, target Target) (changed bool, err error) {
	return setPause(ctx, st, target, false)
}

func setPause(ctx context.Context, st task.Store, target Target, paused bool) (changed bool, err error) {
	if err := target.Validate(); err != nil {
		return false, err
	}
	err = put(ctx, st, PauseNamespace, target.String(), func(old json.RawMessage) (any, error) {
		changed = false // again on a retry
		var v pauseValue
		if old != nil {
			_ = json.Unmarshal(old, &v) // unreadable counts as not paused
		}
		if v.Paused == paused {
			return nil, errNoChange
		}
		changed = true
		if paused {
			return pauseValue{Paused: true, Since: st.Now().UTC()}, nil
		}
		return nil, nil // deleted
	})
	return changed, err
}

// SetLimit stores the parts l sets (the rate, the weight, the
// concurrency) as its target's, keeping the parts it leaves zero as
// stored.
func SetLimit(ctx context.Context, st task.Store, l Limit) error {
	if err := l.Validate(); err != nil {
		return err
	}
	return put(ctx, st, LimitNamespace, l.Target.String(), func(old json.RawMessage) (any, error) {
		var v limitValue
		if old != nil {
			_ = json.Unmarshal(old, &v) // unreadable counts as none
		}
		if l.N > 0 {
			v.N, v.Per = l.N, task.Duration(l.Per)
		}
		if l.Weight > 0 {
			v.Weight = l.Weight
		}
		if l.Concurrency > 0 {
			v.Concurrency = l.Concurrency
		}
		return v, nil
	})
}

// RemoveLimit removes target's limit; it reports whether there was one.
func RemoveLimit(ctx context.Context, st task.Store, target Target) (removed bool, err error) {
	if err := target.Validate(); err != nil {
		return false, err
	}
	err = put(ctx, st, LimitNamespace, target.String(), func(old json.RawMessage) (any, error) {
		removed = false // again on a retry
		var v limitValue
		if old != nil {
			_ = json.Unmarshal(old, &v)
		}
		if !v.set() {
			return nil, errNoChange
		}
		removed = true
		return nil, nil // deleted
	})
	return removed, err
}

// Pauses lists the pauses in force, by target.
func Pauses(ctx context.Context, st task.Store) ([]PauseInfo, error) {
	s, err := Load(ctx, st)
	if err != nil {
		return nil, err
	}
	return s.Pauses, nil
}

// Limits lists the limits in force, by target.
func Limits(ctx context.Context, st task.Store) ([]Limit, error) {
	s, err := Load(ctx, st)
	if err != nil {
		return nil, err
	}
	return s.Limits, nil
}

// Load reads every control from st.
func Load(ctx context.Context, st task.Store) (*State, error) {
	var pauses []PauseInfo
	var limits []Limit
	err := each(ctx, st, PauseNamespace, func(target Target, v pauseValue) {
		if v.Paused {
			pauses = append(pauses, PauseInfo{Target: target, Since: v.Since})
		}
	})
	if err != nil {
		return nil, err
	}
	err = each(ctx, st, LimitNamespace, func(target Target, v limitValue) {
		if l := (Limit{Target: target, N: v.N, Per: time.Duration(v.Per), Weight: v.Weight, Concurrency: v.Concurrency}); v.set() && l.Validate() == nil {
			limits = append(limits, l)
		}
	})
	if err != nil {
		return nil, err
	}
	return NewState(pauses, limits), nil
}

// each calls fn with the target and value of every document of namespace
// that parses; one that does not is skipped and reported to
// task.SkipMalformed, so it never stops the controls from loading.
func each[V any](ctx context.Context, st task.Store, namespace string, fn func(Target, V)) error {
	docs, err := st.Documents(ctx, namespace)
	if err != nil {
		return fmt.Errorf("read %s: %w", namespace, err)
	}
	for _, d := range docs {
		var v V
		target, err := ParseTarget(d.ID)
		if err == nil {
			err = json.Unmarshal(d.Value, &v)
		}
		if err != nil {
			task.SkipMalformed(namespace, d.ID+"@"+strconv.FormatInt(d.Version, 10), err)
			continue
		}
		fn(target, v)
	}
	return nil
}

// State is the controls as loaded at one moment. Its methods are pure and
// safe for concurrent use; a nil *State controls nothing.
type State struct {
	Pauses []PauseInfo
	Limits []Limit

	pauseAll    bool
	pauseKinds  map[string]bool
	pauseLocks  patterns[bool]
	kindLimits  map[string]Limit
	lockLimits  patterns[Limit]
	groupLimits map[string]Limit
}

// NewState indexes pauses and limits (sorted by target).
func NewState(pauses []PauseInfo, limits []Limit) *State {
	s := &State{
		Pauses: slices.Clone(pauses), Limits: slices.Clone(limits),
		pauseKinds: map[string]bool{}, kindLimits: map[string]Limit{}, groupLimits: map[string]Limit{},
	}
	slices.SortFunc(s.Pauses, func(a, b PauseInfo) int { return strings.Compare(a.Target.String(), b.Target.String()) })
	slices.SortFunc(s.Limits, func(a, b Limit) int { return strings.Compare(a.Target.String(), b.Target.String()) })
	for _, p := range s.Pauses {
		switch p.Target.Scope {
		case ScopeAll:
			s.pauseAll = true
		case ScopeKind:
			s.pauseKinds[p.Target.Name] = true
		case ScopeLock:
			s.pauseLocks.add(p.Target.Name, true)
		}
	}
	for _, l := range s.Limits {
		switch l.Target.Scope {
		case ScopeKind:
			s.kindLimits[l.Target.Name] = l
		case ScopeLock:
			s.lockLimits.add(l.Target.Name, l)
		case ScopeGroup:
			s.groupLimits[l.Target.Name] = l
		}
	}
	return s
}

// Paused reports whether t may not start now, and the pause that holds it.
func (s *State) Paused(t *task.Task) (Target, bool) {
	if s == nil || t == nil {
		return Target{}, false
	}
	if s.pauseAll {
		return All(), true
	}
	if s.pauseKinds[t.Kind] {
		return Kind(t.Kind), true
	}
	for _, k := range t.LockKeys {
		if pattern, _, ok := s.pauseLocks.match(k); ok {
			return Lock(pattern), true
		}
	}
	return Target{}, false
}

// Bucket is one rate limit applied to one task: its starts count against
// the N slot locks of Key.
type Bucket struct {
	// Key names the counted resource: "kind:NAME" or "lock:KEY" (for a
	// pattern limit, the task's own lock key: each device its own bucket).
	Key string
	N   int
	Per time.Duration
}

// SlotKey is the lock key of slot i in task.LockRate, which every start
// counted in b holds for Per and never releases early.
func (b Bucket) SlotKey(i int) string { return b.Key + "#" + strconv.Itoa(i) }

// Buckets returns the limits t's start counts against: its kind's, and for
// each lock key the exact limit or else the longest matching pattern's.
func (s *State) Buckets(t *task.Task) []Bucket {
	if s == nil || t == nil {
		return nil
	}
	var out []Bucket
	if l, ok := s.kindLimits[t.Kind]; ok && l.N > 0 {
		out = append(out, Bucket{Key: Kind(t.Kind).String(), N: l.N, Per: l.Per})
	}
	for _, k := range t.LockKeys {
		if _, l, ok := s.lockLimits.match(k); ok && l.N > 0 {
			out = append(out, Bucket{Key: Lock(k).String(), N: l.N, Per: l.Per})
		}
	}
	if l, ok := s.groupLimits[t.Group]; ok && t.Group != "" && l.N > 0 {
		out = append(out, Bucket{Key: Group(t.Group).String(), N: l.N, Per: l.Per})
	}
	return out
}

// patterns maps lock keys, exact or "prefix*", to values; an exact key
// beats a pattern, a longer pattern a shorter one.
type patterns[V any] struct {
	exact    map[string]V
	prefixes []string // longest first
	byPrefix map[string]V
}

func (p *patterns[V]) add(key string, v V) {
	if prefix, ok := strings.CutSuffix(key, "*"); ok {
		if p.byPrefix == nil {
			p.byPrefix = map[string]V{}
		}
		p.byPrefix[prefix] = v
		p.prefixes = append(p.prefixes, prefix)
		slices.SortStableFunc(p.prefixes, func(a, b string) int { return len(b) - len(a) })
		return
	}
	if p.exact == nil {
		p.exact = map[string]V{}
	}
	p.exact[key] = v
}

// match returns the entry that governs key: its name as stored and value.
func (p *patterns[V]) match(key string) (string, V, bool) {
	if v, ok := p.exact[key]; ok {
		return key, v, true
	}
	for _, prefix := range p.prefixes {
		if strings.HasPrefix(key, prefix) {
			return prefix + "*", p.byPrefix[prefix], true
		}
	}
	var zero V
	return "", zero, false
}
