package flow

// What a process keeps of the split flows it read or wrote (split.go):
// parts by id are content that never changes, so they are read once.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/leasepool/leasepool/task"
)

// partCache keeps the split flows this process read or wrote last, by key
// and token, shared and never changed: a part id names one content for
// ever, so a flow is brought up to a newer head by reading the parts that
// head names anew.
var partCache = struct {
	sync.Mutex
	m map[string]*Flow
}{m: map[string]*Flow{}}

// cachedFlows bounds partCache (a 10,000-step flow holds some MiB).
const cachedFlows = 16

func cacheKey(key, token string) string { return key + "\x00" + token }

func cached(key, token string) *Flow {
	partCache.Lock()
	defer partCache.Unlock()
	return partCache.m[cacheKey(key, token)]
}

func cachePut(f *Flow) {
	partCache.Lock()
	defer partCache.Unlock()
	k := cacheKey(f.Key, f.split.Token)
	if old := partCache.m[k]; old != nil && old.Version > f.Version {
		return
	}
	if _, ok := partCache.m[k]; !ok && len(partCache.m) >= cachedFlows {
		for x := range partCache.m {
			delete(partCache.m, x)
			break
		}
	}
	partCache.m[k] = f
}

// clone returns a copy of f that its caller may change.
func (f *Flow) clone() *Flow {
	c := *f
	c.Progress = slices.Clone(f.Progress)
	c.Params = maps.Clone(f.Params)
	c.Events = slices.Clone(f.Events)
	if f.split != nil {
		sp := *f.split
		sp.Parts = slices.Clone(sp.Parts)
		c.split = &sp
	}
	c.started, c.stops, c.shared, c.base, c.allDirty = nil, nil, false, nil, false
	return &c
}

// specCache keeps the steps of the split flows this process read, by key
// and token: a stored flow's steps never change.
var specCache = struct {
	sync.Mutex
	m map[string]*specEntry
}{m: map[string]*specEntry{}}

type specEntry struct {
	steps []Step
	g     *graph
}

// specOf returns the steps of the split flow of head d and their graph,
// shared: read once per process.
func specOf(ctx context.Context, s task.Store, id string, sp *split) (*specEntry, error) {
	k := cacheKey(id, sp.Token)
	specCache.Lock()
	e := specCache.m[k]
	specCache.Unlock()
	if e != nil {
		return e, nil
	}
	var steps []Step
	for n, first := range sp.Spec {
		var p specPart
		if err := getPart(ctx, s, specID(id, sp.Token, n), &p); err != nil {
			return nil, err
		}
		if p.First != first || len(steps) != first {
			return nil, fmt.Errorf("flow document %s: spec part %d starts at step %d, not %d", id, n, p.First, first)
		}
		steps = append(steps, p.Steps...)
	}
	if len(steps) != sp.Steps {
		return nil, fmt.Errorf("flow document %s: %d steps in its parts but %d named", id, len(steps), sp.Steps)
	}
	e = &specEntry{steps: steps, g: newGraph(steps)}
	specCache.Lock()
	defer specCache.Unlock()
	if len(specCache.m) >= cachedFlows {
		for x := range specCache.m {
			delete(specCache.m, x)
			break
		}
	}
	specCache.m[k] = e
	return e, nil
}
