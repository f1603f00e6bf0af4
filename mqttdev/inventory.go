// The device inventory: what each device announces of itself and what
// an operator decided of it, one document per device.

package mqttdev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/leasepool/leasepool/mqttdev/protocol"
	"github.com/leasepool/leasepool/task"
)

// InventoryNamespace is the task.Document namespace of the inventory: one
// document per device id.
const InventoryNamespace = "leasepool.device-inventory"

// Inventory is one device's entry. What the device announced and what an
// operator decided are kept apart: whoever can publish a device's status
// sets its attributes, only an operator sets its labels or vouches for it.
type Inventory struct {
	ID string `json:"id"`
	// Attributes are what the device announced in its last status that
	// carried any, as a worker received it at AnnouncedAt.
	Attributes  Labels    `json:"attributes,omitempty"`
	AnnouncedAt time.Time `json:"announced_at,omitzero"`
	// Labels are set by an operator (SetLabels).
	Labels Labels `json:"labels,omitempty"`
	// Vouched says who vouched for the device (Vouch); until someone
	// does, the device is new and no selection of a rollout takes it.
	Vouched *Vouching `json:"vouched,omitempty"`
	// Version is the document's version (compare-and-set).
	Version int64 `json:"version"`
}

// Vouching is who vouched for a device, and when.
type Vouching struct {
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// New reports whether nobody vouched for the device.
func (inv Inventory) New() bool { return inv.Vouched == nil }

// ValidateLabelKey, ValidateLabelValue: see package protocol.
func ValidateLabelKey(key string) error { return protocol.ValidateLabelKey(key) }

// ValidateLabelValue checks the value of label key; see package protocol.
func ValidateLabelValue(key, value string) error { return protocol.ValidateLabelValue(key, value) }

// GetInventory returns device id's entry; a device with none yet has an
// empty one (Version 0).
func GetInventory(ctx context.Context, ds task.DocumentStore, id string) (Inventory, error) {
	if err := ValidateID("device", id); err != nil {
		return Inventory{}, err
	}
	d, err := ds.GetDocument(ctx, InventoryNamespace, id)
	if errors.Is(err, task.ErrNotFound) {
		return Inventory{ID: id}, nil
	}
	if err != nil {
		return Inventory{}, err
	}
	return decodeInventory(d)
}

func decodeInventory(d task.Document) (Inventory, error) {
	var inv Inventory
	if err := json.Unmarshal(d.Value, &inv); err != nil {
		return Inventory{}, fmt.Errorf("device inventory %s: %w", d.ID, err)
	}
	inv.ID, inv.Version = d.ID, d.Version
	return inv, nil
}

// Inventories returns every device's entry, by id. A malformed document is
// skipped (task.SkipMalformed), not fatal to the listing.
func Inventories(ctx context.Context, ds task.DocumentStore) (map[string]Inventory, error) {
	docs, err := ds.Documents(ctx, InventoryNamespace)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Inventory, len(docs))
	for _, d := range docs {
		inv, err := decodeInventory(d)
		if err != nil {
			task.SkipMalformed(InventoryNamespace, d.ID, err)
			continue
		}
		out[d.ID] = inv
	}
	return out, nil
}

// updateInventory applies fn to device id's entry by compare-and-set,
// reading again on a conflict. fn returns false to write nothing.
func updateInventory(ctx context.Context, ds task.DocumentStore, id string, fn func(*Inventory) (bool, error)) (Inventory, error) {
	for {
		inv, err := GetInventory(ctx, ds, id)
		if err != nil {
			return Inventory{}, err
		}
		change, err := fn(&inv)
		if err != nil || !change {
			return inv, err
		}
		if len(inv.Labels) == 0 {
			inv.Labels = nil
		}
		value, err := json.Marshal(inv)
		if err != nil {
			return Inventory{}, err
		}
		d, err := ds.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: InventoryNamespace, ID: id, Version: inv.Version, Value: value,
			Terms: inventoryTerms(inv)})
		if errors.Is(err, task.ErrConflict) {
			continue
		}
		if err != nil {
			return Inventory{}, err
		}
		inv.Version = d.Version
		return inv, nil
	}
}

// inventoryTerms are the index terms of an entry (task.Document.Terms),
// as Select looks them up: "label:k=v" per operator label, "attr:k=v"
// per announced attribute. A pair no selector could name (written around
// the API) has none.
func inventoryTerms(inv Inventory) []string {
	terms := make([]string, 0, len(inv.Labels)+len(inv.Attributes))
	for _, src := range []struct {
		source Source
		labels Labels
	}{{SourceLabel, inv.Labels}, {SourceAttribute, inv.Attributes}} {
		for k, v := range src.labels {
			if ValidateLabelKey(k) == nil && ValidateLabelValue(k, v) == nil {
				terms = append(terms, Requirement{Source: src.source, Key: k, Value: v}.Term())
			}
		}
	}
	return terms
}

// unindexedTerm is a term no entry carries (they all start with label: or
// attr:): a query for it returns the entries stored without terms alone.
const unindexedTerm = "index:none"

// IndexInventory gives their terms to the inventory entries stored before
// entries had any (written by an older leasepool), so that selections
// read them off the index again; it returns how many it wrote. Until
// then Select takes them as candidates of every selection: none is ever
// missed, they only cost a decode each. An entry written meanwhile by
// someone else got its terms from that write, and is left alone.
func IndexInventory(ctx context.Context, ds task.DocumentStore) (int, error) {
	docs, err := ds.DocumentsByTerms(ctx, InventoryNamespace, []string{unindexedTerm})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, d := range docs {
		inv, err := decodeInventory(d)
		if err != nil {
			continue // left as it is: Select skips it as malformed anyway
		}
		d.Terms = inventoryTerms(inv)
		switch _, err := ds.PutDocument(task.WithInternalWrite(ctx), d); {
		case err == nil:
			n++
		case !errors.Is(err, task.ErrConflict):
			return n, fmt.Errorf("index device inventory %s: %w", d.ID, err)
		}
	}
	return n, nil
}

// LabelChange is an operator's edit of a device's labels: keys to set and
// keys to remove.
type LabelChange struct {
	Set    Labels   `json:"set,omitempty"`
	Remove []string `json:"remove,omitempty"`
}

// ParseLabelArgs reads the CLI's label arguments: "k=v" sets, "k-"
// removes. Errors wrap task.ErrInvalid and name the argument.
func ParseLabelArgs(args []string) (LabelChange, error) {
	var ch LabelChange
	if len(args) == 0 {
		return ch, fmt.Errorf("%w: labels: give at least one k=v or k-", task.ErrInvalid)
	}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			if ch.Set == nil {
				ch.Set = Labels{}
			}
			if _, dup := ch.Set[k]; dup {
				return ch, fmt.Errorf("%w: label key %q: is given twice", task.ErrInvalid, k)
			}
			ch.Set[k] = v
			continue
		}
		k, ok := strings.CutSuffix(a, "-")
		if !ok {
			return ch, fmt.Errorf("%w: label %q: want k=v to set or k- to remove", task.ErrInvalid, a)
		}
		ch.Remove = append(ch.Remove, k)
	}
	return ch, ch.Validate()
}

// Validate checks every key and value.
func (ch LabelChange) Validate() error {
	if len(ch.Set)+len(ch.Remove) == 0 {
		return fmt.Errorf("%w: labels: no change given", task.ErrInvalid)
	}
	if err := ch.Set.Validate("labels"); err != nil {
		return err
	}
	for _, k := range ch.Remove {
		if err := ValidateLabelKey(k); err != nil {
			return fmt.Errorf("labels: %w", err)
		}
		if _, ok := ch.Set[k]; ok {
			return fmt.Errorf("%w: labels: %s is both set and removed", task.ErrInvalid, k)
		}
	}
	return nil
}

// SetLabels applies ch to device id's operator labels and returns the
// entry as stored. It checks id and ch first: nothing is written on an
// error, which wraps task.ErrInvalid and names the field.
func SetLabels(ctx context.Context, ds task.DocumentStore, id string, ch LabelChange) (Inventory, error) {
	if err := ValidateID("device", id); err != nil {
		return Inventory{}, err
	}
	if err := ch.Validate(); err != nil {
		return Inventory{}, err
	}
	return updateInventory(ctx, ds, id, func(inv *Inventory) (bool, error) {
		next := maps.Clone(inv.Labels)
		if next == nil {
			next = Labels{}
		}
		maps.Copy(next, ch.Set)
		for _, k := range ch.Remove {
			delete(next, k)
		}
		if err := next.Validate("labels"); err != nil {
			return false, err
		}
		if maps.Equal(next, inv.Labels) {
			return false, nil
		}
		inv.Labels = next
		return true, nil
	})
}

// StoreInventory keeps announced attributes in ds's inventory documents;
// pass it as HandlerConfig.Inventory.
func StoreInventory(ds task.DocumentStore) AttributeStore { return inventoryStore{ds} }

type inventoryStore struct{ ds task.DocumentStore }

func (s inventoryStore) PutAttributes(ctx context.Context, id string, attrs Labels, at time.Time) error {
	return PutAttributes(ctx, s.ds, id, attrs, at)
}

// PutAttributes records what device id announced, received at at; an
// unchanged announcement writes nothing.
func PutAttributes(ctx context.Context, ds task.DocumentStore, id string, attrs Labels, at time.Time) error {
	if err := ValidateID("device", id); err != nil {
		return err
	}
	if err := attrs.Validate("attributes"); err != nil {
		return err
	}
	_, err := updateInventory(ctx, ds, id, func(inv *Inventory) (bool, error) {
		if maps.Equal(inv.Attributes, attrs) {
			return false, nil
		}
		inv.Attributes, inv.AnnouncedAt = maps.Clone(attrs), at.UTC()
		return true, nil
	})
	return err
}

// ReplaceLabels sets device id's operator labels to labels exactly (none
// for an empty map), and returns the entry as stored. Nothing is written
// on an error, which wraps task.ErrInvalid and names the field.
func ReplaceLabels(ctx context.Context, ds task.DocumentStore, id string, labels Labels) (Inventory, error) {
	if err := ValidateID("device", id); err != nil {
		return Inventory{}, err
	}
	if err := labels.Validate("labels"); err != nil {
		return Inventory{}, err
	}
	return updateInventory(ctx, ds, id, func(inv *Inventory) (bool, error) {
		if maps.Equal(inv.Labels, labels) {
			return false, nil
		}
		inv.Labels = maps.Clone(labels)
		return true, nil
	})
}

// MaxVouchedByLen bounds who a vouching names.
const MaxVouchedByLen = 128

// Vouch records that by (an operator, "credential" for a device given an
// MQTT credential) vouches for device id: from now on selections take it
// (Select). A device with no entry yet gets one, so that a device
// provisioned ahead of its first status is vouched when it comes; one
// already vouched for keeps its first vouching. Errors wrap task.ErrInvalid
// and name the field; nothing is written on one.
func Vouch(ctx context.Context, ds task.DocumentStore, id, by string) error {
	_, err := VouchAt(ctx, ds, id, by, time.Now())
	return err
}

// VouchAt is Vouch at a given time, returning the entry as stored.
func VouchAt(ctx context.Context, ds task.DocumentStore, id, by string, at time.Time) (Inventory, error) {
	if err := ValidateID("device", id); err != nil {
		return Inventory{}, err
	}
	if err := ValidateVouchedBy(by); err != nil {
		return Inventory{}, err
	}
	return updateInventory(ctx, ds, id, func(inv *Inventory) (bool, error) {
		if inv.Vouched != nil {
			return false, nil
		}
		inv.Vouched = &Vouching{By: by, At: at.UTC()}
		return true, nil
	})
}

// ValidateVouchedBy checks who a vouching names: 1 to MaxVouchedByLen
// bytes, no control character. Errors wrap task.ErrInvalid and name by.
func ValidateVouchedBy(by string) error {
	switch {
	case by == "":
		return fmt.Errorf("%w: by: must not be empty", task.ErrInvalid)
	case len(by) > MaxVouchedByLen:
		return fmt.Errorf("%w: by: longer than %d bytes", task.ErrInvalid, MaxVouchedByLen)
	}
	for _, c := range by {
		if c < ' ' || c == 0x7f {
			return fmt.Errorf("%w: by: control character %U", task.ErrInvalid, c)
		}
	}
	return nil
}

// Unvouch makes device id new again, as when its credential is revoked:
// selections leave it out until someone vouches for it again. A device
// not vouched for is left as it is.
func Unvouch(ctx context.Context, ds task.DocumentStore, id string) error {
	if err := ValidateID("device", id); err != nil {
		return err
	}
	_, err := updateInventory(ctx, ds, id, func(inv *Inventory) (bool, error) {
		if inv.Vouched == nil {
			return false, nil
		}
		inv.Vouched = nil
		return true, nil
	})
	return err
}

// Forget removes device id's inventory entry (attributes, labels,
// vouching) and its stored online state. Its tasks stay. A device that
// announces itself again later comes back as new: the worker that stores
// its next status finds no state and writes its attributes again. It
// returns an error wrapping task.ErrNotFound when neither was stored.
func Forget(ctx context.Context, ds task.DocumentStore, id string) error {
	if err := ValidateID("device", id); err != nil {
		return err
	}
	// The entry goes first: a worker storing the device's status in
	// between finds its state, and the next status it stores, finding
	// none, writes the attributes again. The other order could let that
	// worker see the state gone while the entry was still there, and
	// never write the attributes again.
	found := false
	for _, ns := range []string{InventoryNamespace, StateNamespace} {
		switch err := ds.DeleteDocument(ctx, ns, id, 0); {
		case err == nil:
			found = true
		case !errors.Is(err, task.ErrNotFound):
			return fmt.Errorf("forget device %s: %w", id, err)
		}
	}
	if !found {
		return fmt.Errorf("device %s: %w: not in the inventory and no state stored", id, task.ErrNotFound)
	}
	return nil
}
