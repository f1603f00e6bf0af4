// Selectors: which devices of the inventory a listing or a rollout takes,
// by the labels an operator set or the attributes devices announced.

package mqttdev

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/leasepool/leasepool/task"
)

// Source is what a selector term reads: the operator's labels or the
// device's announced attributes.
type Source string

const (
	// SourceLabel is the labels an operator set (SetLabels); a term
	// without a prefix reads them.
	SourceLabel Source = "label"
	// SourceAttribute is what the device announced of itself: whoever can
	// publish its status sets them, so they are not evidence of anything
	// an operator decided.
	SourceAttribute Source = "attr"
)

// Selector picks devices: every requirement must hold.
type Selector []Requirement

// Requirement is one term of a selector: key=value, or key!=value (true
// also for a device without the key), on the operator's labels or the
// announced attributes.
type Requirement struct {
	Source Source `json:"source"`
	Key    string `json:"key"`
	Value  string `json:"value"`
	Not    bool   `json:"not,omitempty"`
}

// MaxSelectorTerms bounds a selector.
const MaxSelectorTerms = 32

// ParseSelector reads "k=v,k!=v,attr:k=v,label:k=v,...": a term without a
// prefix, or with "label:", reads the operator's labels; "attr:" reads the
// attributes the device announced. Errors wrap task.ErrInvalid and name
// the term.
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%w: select: must not be empty", task.ErrInvalid)
	}
	terms := strings.Split(s, ",")
	if len(terms) > MaxSelectorTerms {
		return nil, fmt.Errorf("%w: select: %d terms, more than %d", task.ErrInvalid, len(terms), MaxSelectorTerms)
	}
	var sel Selector
	for _, term := range terms {
		term = strings.TrimSpace(term)
		k, v, ok := strings.Cut(term, "=")
		if !ok {
			return nil, fmt.Errorf("%w: select: term %q: want key=value or key!=value", task.ErrInvalid, term)
		}
		r := Requirement{Source: SourceLabel, Key: k, Value: v}
		// Keys hold no ':', values may: the prefix is before the '='.
		if src, key, ok := strings.Cut(k, ":"); ok {
			switch Source(src) {
			case SourceLabel, SourceAttribute:
				r.Source, r.Key = Source(src), key
			default:
				return nil, fmt.Errorf("%w: select: term %q: unknown prefix %q, want label: or attr:", task.ErrInvalid, term, src)
			}
		}
		if key, isNot := strings.CutSuffix(r.Key, "!"); isNot {
			r.Key, r.Not = key, true
		}
		if err := ValidateLabelKey(r.Key); err != nil {
			return nil, fmt.Errorf("select: term %q: %w", term, err)
		}
		if err := ValidateLabelValue(r.Key, r.Value); err != nil {
			return nil, fmt.Errorf("select: term %q: %w", term, err)
		}
		sel = append(sel, r)
	}
	return sel, nil
}

// Matches reports whether a device with these operator labels and
// announced attributes meets every requirement.
func (s Selector) Matches(labels, attributes Labels) bool {
	for _, r := range s {
		from := labels
		if r.Source == SourceAttribute {
			from = attributes
		}
		v, ok := from[r.Key]
		if (ok && v == r.Value) == r.Not {
			return false
		}
	}
	return true
}

// Attributes returns the terms that read announced attributes.
func (s Selector) Attributes() Selector {
	return slices.DeleteFunc(slices.Clone(s), func(r Requirement) bool { return r.Source != SourceAttribute })
}

// String is the selector as ParseSelector reads it, label terms without
// their prefix.
func (s Selector) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// Term is the index term of a device that meets r, were r key=value:
// "label:k=v" or "attr:k=v" (inventoryTerms).
func (r Requirement) Term() string {
	return string(r.Source) + ":" + r.Key + "=" + r.Value
}

// String is the term as ParseSelector reads it.
func (r Requirement) String() string {
	op := "="
	if r.Not {
		op = "!="
	}
	prefix := ""
	if r.Source == SourceAttribute {
		prefix = "attr:"
	}
	return prefix + r.Key + op + r.Value
}

// Selection is what a selector picks from the inventory.
type Selection struct {
	// Devices are the vouched devices that match, sorted.
	Devices []string `json:"devices"`
	// New are the devices that match but nobody vouched for (Vouch),
	// sorted: left out.
	New []string `json:"new,omitempty"`
}

// Select returns the devices of the inventory that match sel, the
// vouched apart from the new.
//
// The candidates come from the inventory's index: the entries carrying
// the terms of every key=value requirement of sel, intersected by the
// store (task.DocumentStore.DocumentsByTerms), plus any entry stored
// before entries had terms (see IndexInventory); Matches then checks
// each in full (the != requirements among them). A selector of !=
// requirements alone, which an entry matches by lacking a pair, has no
// term to look up: it reads the whole inventory.
func Select(ctx context.Context, ds task.DocumentStore, sel Selector) (Selection, error) {
	var docs []task.Document
	var err error
	if terms := sel.terms(); len(terms) > 0 {
		docs, err = ds.DocumentsByTerms(ctx, InventoryNamespace, terms)
	} else {
		docs, err = ds.Documents(ctx, InventoryNamespace)
	}
	if err != nil {
		return Selection{}, err
	}
	var out Selection
	for _, d := range docs {
		inv, err := decodeInventory(d)
		switch {
		case err != nil:
			task.SkipMalformed(InventoryNamespace, d.ID, err)
		// A document under an id ValidateID refuses (written around the
		// API) is no device to command.
		case ValidateID("device", d.ID) != nil, !sel.Matches(inv.Labels, inv.Attributes):
		case inv.New():
			out.New = append(out.New, d.ID)
		default:
			out.Devices = append(out.Devices, d.ID)
		}
	}
	slices.Sort(out.Devices)
	slices.Sort(out.New)
	return out, nil
}

// terms are the index terms of sel's key=value requirements: a device
// that matches sel carries every one of them.
func (s Selector) terms() []string {
	var terms []string
	for _, r := range s {
		if !r.Not {
			terms = append(terms, r.Term())
		}
	}
	return terms
}

// SelectDevices returns the ids, sorted, of the vouched devices in the
// inventory that match sel; a new device is never among them.
func SelectDevices(ctx context.Context, ds task.DocumentStore, sel Selector) ([]string, error) {
	s, err := Select(ctx, ds, sel)
	return s.Devices, err
}
