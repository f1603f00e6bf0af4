package flow

// A flow of more than inlineSteps steps is not one document: its stored
// document (the head) keeps the flow's own fields, and its steps and their
// records live in part documents in PartNamespace:
//
//   - spec parts, written once at publish (a stored flow's steps never
//     change), each some hundreds of KiB of steps;
//   - state parts of partSteps steps each: their Progress and their
//     results (the shared parameters named as one of them).
//
// A state part is copied on write: a write stores the parts whose steps
// changed under new ids and then swaps the head by compare-and-set on its
// version, naming them; only then are the parts it replaced deleted (off
// the write's path: the flow's next write need not wait for it). The
// head is the one point of the compare-and-set, so a flow still moves by
// one write that applies once, and a reader sees the parts one head names:
// a consistent flow. A writer that lost the head's compare-and-set deletes
// the parts it wrote; one that died in between (or before its deletes)
// leaves parts no head names, which DeleteStopped removes with the flow
// (decision 0021).
//
// Part ids are unique for ever (the flow's random token and a random
// suffix per write), so a process keeps the parts it read (partCache) and
// reads again only the ones a head names anew: a step's outcome reads the
// head and the part or two that changed, and writes them, whatever the
// flow's size.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/leasepool/leasepool/task"
)

// PartNamespace holds the parts of flows too large for one document.
const PartNamespace = "leasepool.flow-part"

// Sizes of a split flow; variables so that tests split small flows.
var (
	// inlineSteps: a flow of at most this many steps is one document.
	inlineSteps = 100
	// partSteps is the number of steps of a state part.
	partSteps = 50
	// specPartBytes is what a spec part holds at most, in bytes of JSON,
	// unless one step alone is larger.
	specPartBytes = 256 << 10
)

// split is where a split flow's parts are.
type split struct {
	// Token is random per flow publish: part ids of a flow deleted and
	// published again never meet the old ones'.
	Token string `json:"token"`
	Steps int    `json:"steps"`
	// Spec is the first step of each spec part.
	Spec []int `json:"spec"`
	// Parts is each state part's id suffix; empty: a part never written
	// (its steps not started, no results).
	Parts []string `json:"parts"`

	// base is the head's parameters: the request's, none named as a step.
	// No transition changes them (results and retries touch only step
	// names), so every write keeps them as read.
	base map[string]json.RawMessage
}

// headDoc is a split flow's stored document: the flow without its steps
// and records, with the parts' ids.
type headDoc struct {
	Flow
	Steps    []Step                     `json:"steps,omitempty"`
	Progress []Progress                 `json:"progress,omitempty"`
	Params   map[string]json.RawMessage `json:"params"`
	Split    *split                     `json:"split,omitempty"`
}

type specPart struct {
	First int    `json:"first"`
	Steps []Step `json:"steps"`
}

type statePart struct {
	First    int                        `json:"first"`
	Progress []Progress                 `json:"progress"`
	Params   map[string]json.RawMessage `json:"params,omitempty"`
}

func specID(key, token string, n int) string {
	return key + "~" + token + "~s" + strconv.Itoa(n)
}

func partID(key, token string, n int, suffix string) string {
	return key + "~" + token + "~p" + strconv.Itoa(n) + "~" + suffix
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// decodeSplit reads the parts the head d names and returns the flow,
// shared (partCache's: the caller clones it to change it).
func decodeSplit(ctx context.Context, s task.Store, d task.Document, h *headDoc) (*Flow, error) {
	sp := h.Split
	f := &h.Flow
	f.Version, f.split = d.Version, sp
	sp.base = h.Params
	if sp.base == nil {
		sp.base = map[string]json.RawMessage{}
	}
	nparts := (sp.Steps + partSteps - 1) / partSteps
	if sp.Steps <= 0 || len(sp.Parts) != nparts || len(sp.Spec) == 0 {
		return nil, fmt.Errorf("flow document %s: split into %d parts for %d steps", d.ID, len(sp.Parts), sp.Steps)
	}
	old := cached(d.ID, sp.Token)
	if old != nil && old.Version == d.Version {
		return old, nil
	}
	spec, err := specOf(ctx, s, d.ID, sp)
	if err != nil {
		return nil, err
	}
	f.Steps, f.g = spec.steps, spec.g
	if old != nil && len(old.Progress) == sp.Steps {
		f.Progress = slices.Clone(old.Progress)
		f.Params = maps.Clone(old.Params)
	} else {
		old = nil
		f.Progress = make([]Progress, sp.Steps)
		f.Params = maps.Clone(sp.base)
	}
	for n, suffix := range sp.Parts {
		if old != nil && old.split.Parts[n] == suffix {
			continue
		}
		lo, hi := n*partSteps, min(sp.Steps, (n+1)*partSteps)
		p, err := readPart(ctx, s, f, n, suffix)
		if err != nil {
			return nil, err
		}
		copy(f.Progress[lo:hi], p.Progress)
		for i := lo; i < hi; i++ {
			delete(f.Params, f.Steps[i].Name)
			if v, ok := sp.base[f.Steps[i].Name]; ok {
				f.Params[f.Steps[i].Name] = v
			}
		}
		for k, v := range p.Params {
			f.Params[k] = v
		}
	}
	f.summarise()
	f.shared = true
	cachePut(f)
	return f, nil
}

// readPart reads state part n of the split flow f, stored under suffix
// ("": never written: its steps' records are empty). The parts read and
// written last are kept (stateParts): a part id names one content.
func readPart(ctx context.Context, s task.Store, f *Flow, n int, suffix string) (statePart, error) {
	lo, hi := n*partSteps, min(f.split.Steps, (n+1)*partSteps)
	p := statePart{First: lo, Progress: make([]Progress, hi-lo)}
	if suffix == "" {
		return p, nil
	}
	id := partID(f.Key, f.split.Token, n, suffix)
	if c, ok := stateParts.get(id); ok {
		return c, nil
	}
	if err := getPart(ctx, s, id, &p); err != nil {
		return p, err
	}
	if p.First != lo || len(p.Progress) != hi-lo {
		return p, fmt.Errorf("flow document %s: state part %d holds steps %d+%d, not %d-%d", f.Key, n, p.First, len(p.Progress), lo, hi)
	}
	stateParts.put(id, p)
	return p, nil
}

// stateParts keeps the state parts read or written last, by id; shared,
// never changed.
var stateParts = partLRU{m: map[string]statePart{}}

// keptParts bounds stateParts (a part is some KiB).
const keptParts = 512

type partLRU struct {
	sync.Mutex
	m     map[string]statePart
	order []string
}

func (c *partLRU) get(id string) (statePart, bool) {
	c.Lock()
	defer c.Unlock()
	p, ok := c.m[id]
	return p, ok
}

func (c *partLRU) put(id string, p statePart) {
	c.Lock()
	defer c.Unlock()
	if _, ok := c.m[id]; ok {
		return
	}
	c.m[id] = p
	c.order = append(c.order, id)
	if len(c.order) > keptParts {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
}

// stepRun is what a step's worker reads of its flow: whether the flow
// waits on its run, and the step.
type stepRun struct {
	State State
	Gen   int
	Step  Step
	Prog  Progress
}

// readStep reads what ref's worker needs of its flow: of a split flow,
// the head and the one part that holds the step, not the whole flow.
func readStep(ctx context.Context, s task.Store, ref StepRef) (stepRun, error) {
	for {
		d, err := load(ctx, s, ref.Flow)
		if err != nil {
			return stepRun{}, err
		}
		var h headDoc
		if err := json.Unmarshal(d.Value, &h); err != nil || h.Split == nil || h.Key != d.ID {
			f, err := decode(ctx, s, d)
			if errors.Is(err, errPartGone) {
				continue
			}
			if err != nil {
				return stepRun{}, err
			}
			r := stepRun{State: f.State, Gen: f.Gen}
			if ref.Step >= 0 && ref.Step < len(f.Steps) {
				r.Step, r.Prog = f.Steps[ref.Step], f.Progress[ref.Step]
			}
			return r, nil
		}
		f, sp := &h.Flow, h.Split
		f.split = sp
		r := stepRun{State: f.State, Gen: f.Gen}
		if ref.Step < 0 || ref.Step >= sp.Steps || len(sp.Parts) != (sp.Steps+partSteps-1)/partSteps {
			return r, nil
		}
		spec, err := specOf(ctx, s, d.ID, sp)
		if err != nil {
			return r, err
		}
		n := ref.Step / partSteps
		p, err := readPart(ctx, s, f, n, sp.Parts[n])
		if errors.Is(err, errPartGone) {
			continue
		}
		if err != nil {
			return r, err
		}
		r.Step, r.Prog = spec.steps[ref.Step], p.Progress[ref.Step-n*partSteps]
		return r, nil
	}
}

// waitsOn reports whether the flow waits on the run ref names.
func (r stepRun) waitsOn(ref StepRef) bool {
	run := r.Prog.Do
	if ref.Undo {
		run = r.Prog.Undo
	}
	return !r.State.Finished() && r.Gen == ref.Gen && r.Step.Name == ref.Name && run.State == RunActive
}

// errPartGone: a part the head named was deleted by a newer write after
// the head was read; the caller reads the head again.
var errPartGone = errors.New("flow part replaced meanwhile")

func getPart(ctx context.Context, s task.Store, id string, v any) error {
	d, err := s.GetDocument(ctx, PartNamespace, id)
	if errors.Is(err, task.ErrNotFound) {
		return fmt.Errorf("flow part %s: %w", id, errPartGone)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(d.Value, v); err != nil {
		return fmt.Errorf("flow part %s: %w", id, err)
	}
	return nil
}

func putPart(ctx context.Context, s task.Store, id string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: PartNamespace, ID: id, Value: b})
	return err
}

func deleteParts(ctx context.Context, s task.Store, ids []string) {
	ctx = context.WithoutCancel(ctx)
	for _, id := range ids {
		// Best effort: a part left behind is only space, removed with the
		// flow.
		_ = s.DeleteDocument(task.WithInternalWrite(ctx), PartNamespace, id, 0)
	}
}

// newSplit stores the parts of the new flow f (steps, and state parts for
// none but the steps a transition touched) and returns its head's value.
// The parts are written before the head: a head never names a part not
// stored. written lists them, for the caller to delete if the head loses.
func newSplit(ctx context.Context, s task.Store, f *Flow) (head []byte, written []string, err error) {
	sp := &split{Token: randomHex(8), Steps: len(f.Steps), base: map[string]json.RawMessage{}}
	idx := f.graph().index
	for k, v := range f.Params {
		if _, ok := idx[k]; !ok {
			sp.base[k] = v
		}
	}
	sp.Parts = make([]string, (len(f.Steps)+partSteps-1)/partSteps)
	size, first := 0, 0
	flush := func(end int) error {
		id := specID(f.Key, sp.Token, len(sp.Spec))
		sp.Spec = append(sp.Spec, first)
		if err := putPart(ctx, s, id, specPart{First: first, Steps: f.Steps[first:end]}); err != nil {
			return err
		}
		written = append(written, id)
		first, size = end, 0
		return nil
	}
	for i, st := range f.Steps {
		b, err := json.Marshal(st)
		if err != nil {
			return nil, written, err
		}
		if size > 0 && size+len(b) > specPartBytes {
			if err := flush(i); err != nil {
				return nil, written, err
			}
		}
		size += len(b) + 1
	}
	if err := flush(len(f.Steps)); err != nil {
		return nil, written, err
	}
	f.split = sp
	parts, err := writeParts(ctx, s, nil, f, true)
	written = append(written, parts...)
	if err != nil {
		return nil, written, err
	}
	head, err = f.headValue()
	return head, written, err
}

// writeParts stores, under new ids, each state part of f whose steps
// differ from before's (every part that is not empty, when before is nil
// or f.allDirty), names them in f.split, and returns their ids.
func writeParts(ctx context.Context, s task.Store, before, f *Flow, fresh bool) ([]string, error) {
	sp := f.split
	var written []string
	for n := range sp.Parts {
		lo, hi := n*partSteps, min(sp.Steps, (n+1)*partSteps)
		changed := before == nil || f.allDirty
		for i := lo; i < hi && !changed; i++ {
			// Results change only with their step's record (retry, which
			// deletes them, sets allDirty).
			changed = before.Progress[i] != f.Progress[i]
		}
		if !changed {
			continue
		}
		p := statePart{First: lo, Progress: slices.Clone(f.Progress[lo:hi])}
		for i := lo; i < hi; i++ {
			if v, ok := f.Params[f.Steps[i].Name]; ok {
				if p.Params == nil {
					p.Params = map[string]json.RawMessage{}
				}
				p.Params[f.Steps[i].Name] = v
			}
		}
		if fresh && p.Params == nil && !slices.ContainsFunc(p.Progress, func(x Progress) bool { return x != Progress{} }) {
			sp.Parts[n] = "" // nothing to store yet
			continue
		}
		suffix := randomHex(6)
		id := partID(f.Key, sp.Token, n, suffix)
		if err := putPart(ctx, s, id, p); err != nil {
			return written, err
		}
		stateParts.put(id, p)
		written = append(written, id)
		sp.Parts[n] = suffix
	}
	return written, nil
}

// headValue is the head document's value of the split flow f.
func (f *Flow) headValue() ([]byte, error) {
	return json.Marshal(headDoc{Flow: *f, Params: f.split.base, Split: f.split})
}

// partIDs lists the parts the head of f names.
func (f *Flow) partIDs() []string {
	sp := f.split
	var ids []string
	for n := range sp.Spec {
		ids = append(ids, specID(f.Key, sp.Token, n))
	}
	for n, suffix := range sp.Parts {
		if suffix != "" {
			ids = append(ids, partID(f.Key, sp.Token, n, suffix))
		}
	}
	return ids
}

// putSplit writes f, read as before at version: its changed parts, then
// the head. task.ErrConflict: another write came first (the parts written
// are deleted again).
func putSplit(ctx context.Context, s task.Store, before, f *Flow) (task.Document, error) {
	oldParts := slices.Clone(before.split.Parts)
	written, err := writeParts(ctx, s, before, f, false)
	var stored task.Document
	if err == nil {
		var b []byte
		if b, err = f.headValue(); err == nil {
			stored, err = s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: f.Key, Version: before.Version, Value: b})
		}
	}
	if err != nil {
		deleteParts(ctx, s, written)
		return stored, err
	}
	var replaced []string
	for n, suffix := range oldParts {
		if suffix != "" && suffix != f.split.Parts[n] {
			replaced = append(replaced, partID(f.Key, f.split.Token, n, suffix))
		}
	}
	// Off the write's path: the next write of the flow need not wait.
	go deleteParts(ctx, s, replaced)
	return stored, nil
}
