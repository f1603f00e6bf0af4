package task

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// NoWorker is a kind that no live worker in the registry runs, beside the
// kinds live workers do run. A task of that kind is stored and waits until
// a worker for it starts; publishers warn about it (a mistyped kind looks
// just like this), or refuse it when asked to be strict.
type NoWorker struct {
	Kind string
	// Live are the kinds live workers run, sorted, each once.
	Live []string
}

// String says which kind no live worker runs, and which kinds they do:
// no live worker runs kind "resze" (live: exec, noop, resize).
func (n NoWorker) String() string {
	live := "none"
	if len(n.Live) > 0 {
		live = strings.Join(n.Live, ", ")
	}
	return fmt.Sprintf("no live worker runs kind %q (live: %s)", n.Kind, live)
}

// Warning is n as a publish's warning: the task was stored and waits.
func (n NoWorker) Warning() string {
	return n.String() + "; the task waits until one does"
}

// Refusal is n as the refusal of a strict publish, naming field (the
// kind's field); it wraps ErrInvalid.
func (n NoWorker) Refusal(field string) error {
	return invalid(field, n.String()+"; a strict publish refuses it")
}

// KindsWithoutWorker returns, for each of kinds (in order, each once) that
// no worker live at now in r runs, a NoWorker. A live worker that
// registered no kinds claims every kind, and so runs them all.
func KindsWithoutWorker(ctx context.Context, r Registry, now time.Time, kinds ...string) ([]NoWorker, error) {
	ws, err := r.Workers(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the worker registry: %w", err)
	}
	var live []string
	for _, w := range ws {
		if !w.Live(now) {
			continue
		}
		if len(w.Kinds) == 0 {
			return nil, nil
		}
		live = append(live, w.Kinds...)
	}
	slices.Sort(live)
	live = slices.Compact(live)
	var out []NoWorker
	seen := map[string]bool{}
	for _, k := range kinds {
		if seen[k] || slices.Contains(live, k) {
			continue
		}
		seen[k] = true
		out = append(out, NoWorker{Kind: k, Live: live})
	}
	return out, nil
}
