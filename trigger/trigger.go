// Package trigger publishes a task for every matching change of the
// user's own MongoDB collections. A trigger is a stored definition (a
// document in Namespace): a collection, an optional filter (a match
// expression), the kinds of change it takes, and the task each change
// publishes. The elected worker runs every trigger (Runner.Duty): it
// follows the collection's change stream from the trigger's stored
// position, publishes one task per change under a key derived from the
// change's resume token, so that a replay publishes nothing new, and
// stores the position only after the tasks before it are published. When
// the server no longer has the position, it rescans the matching
// documents and publishes each under a key of its _id and version.
//
// The store must offer task.CollectionWatcher (the MongoDB backend does);
// on another, Add refuses. On the embedded store a trigger names a table
// instead (Trigger.Table, table.go): SQL triggers record each change in
// the user's own transaction, and the runner publishes what they
// recorded. docs/triggers.md has the guarantees.
package trigger

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasepool/leasepool/task"
)

// Trigger is one stored trigger. JSON names are those of the record.
type Trigger struct {
	Name string `json:"name"`
	// Collection is DB.COLL: the database, a dot, the collection.
	Collection string `json:"collection,omitempty"`
	// Table, instead of Collection, is a table of the embedded store's
	// file (table.go): SQL triggers on it record each matching change in
	// the user's own transaction.
	Table string `json:"table,omitempty"`
	// Filter is a match expression (MongoDB extended JSON) on the changed
	// document; empty: every change. Deletes carry no document, so the
	// filter does not apply to them.
	Filter json.RawMessage `json:"filter,omitempty"`
	// Operations are the kinds of change that publish: insert, update,
	// replace, delete. Default DefaultOperations.
	Operations []string `json:"operations"`
	// Fields, when set, are the fields of the document (dotted paths)
	// that make the payload, with _id; default the whole document.
	Fields []string `json:"fields,omitempty"`
	// VersionField names a field that changes with every write of a
	// document (a version counter, an updated-at): a rescan keys each
	// document's task by its _id and this field, so that it publishes
	// nothing for a document whose task it published before. Default: a
	// hash of the whole document.
	VersionField string `json:"version_field,omitempty"`
	// Kind and Options are the task each change publishes (RunAt is not
	// used: the task is claimable when published).
	Kind    string       `json:"kind"`
	Options task.Options `json:"-"`
	// Paused triggers publish nothing; their position stays, so Resume
	// publishes what changed meanwhile.
	Paused bool `json:"paused,omitempty"`
	// Since is when the trigger was added: the changes from then on
	// publish.
	Since     time.Time `json:"since"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// DefaultOperations are the kinds of change a trigger takes by default.
var DefaultOperations = []string{task.OpInsert, task.OpUpdate, task.OpReplace}

// KeyPrefix starts every task key a trigger publishes:
// trigger:NAME:HASH for a change, trigger:NAME:scan:HASH for a rescan.
const KeyPrefix = "trigger:"

// hashLen is how many hex digits of a SHA-256 a key keeps: 128 bits.
const hashLen = 32

// ChangeKey is the task key of the change whose resume token is token:
// the same change read again has the same token, so the same key.
func ChangeKey(name string, token task.Token) string {
	sum := sha256.Sum256(token)
	return KeyPrefix + name + ":" + hex.EncodeToString(sum[:])[:hashLen]
}

// ScanKey is the task key a rescan publishes for the document of id at
// version (the VersionField's value, or a hash of the document).
func ScanKey(name string, id, version json.RawMessage) string {
	h := sha256.New()
	h.Write(id)
	h.Write([]byte{0})
	h.Write(version)
	return KeyPrefix + name + ":scan:" + hex.EncodeToString(h.Sum(nil))[:hashLen]
}

// internalPrefix is kept for leasepool's own names.
const internalPrefix = "leasepool."

// SplitCollection reads DB.COLL.
func SplitCollection(s string) (db, coll string, err error) {
	db, coll, ok := strings.Cut(s, ".")
	switch {
	case s == "":
		return "", "", invalid("collection", "required: DB.COLL")
	case !ok || db == "" || coll == "":
		return "", "", invalid("collection", fmt.Sprintf("%q: want DB.COLL, a database, a dot and a collection", s))
	case len(db) > 63 || strings.ContainsAny(db, "/\\. \"$\x00"):
		return "", "", invalid("collection", fmt.Sprintf("%q: %q is not a valid database name", s, db))
	case strings.ContainsAny(coll, "$\x00") || len(s) > 255:
		return "", "", invalid("collection", fmt.Sprintf("%q: %q is not a valid collection name", s, coll))
	}
	return db, coll, nil
}

// Watch is what the trigger watches.
func (t *Trigger) Watch() task.CollectionWatch {
	db, coll, _ := SplitCollection(t.Collection)
	return task.CollectionWatch{Database: db, Collection: coll, Filter: t.Filter, Operations: t.Operations}
}

// Validate checks t as given (defaults applied by withDefaults) and
// changes nothing. Its errors wrap task.ErrInvalid and name the field, on
// one line. The server's checks (the collection exists, the filter's
// operators) are Add's.
func (t *Trigger) Validate() error {
	if t.Table != "" {
		return t.validateTable()
	}
	if err := validateName(t.Name); err != nil {
		return err
	}
	if strings.HasPrefix(t.Name, internalPrefix) {
		return invalid("name", fmt.Sprintf("%q: the prefix %q is leasepool's own", t.Name, internalPrefix))
	}
	if _, _, err := SplitCollection(t.Collection); err != nil {
		return err
	}
	if len(t.Filter) > 0 {
		if !json.Valid(t.Filter) {
			return invalid("filter", "is not valid JSON")
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(t.Filter, &obj); err != nil {
			return invalid("filter", "is not a JSON object (a match expression, such as {\"status\": \"new\"})")
		}
		if len(t.Filter) > maxFilter {
			return invalid("filter", fmt.Sprintf("is %d bytes, more than %d", len(t.Filter), maxFilter))
		}
	}
	if len(t.Operations) == 0 {
		return invalid("operations", "name at least one of "+strings.Join(task.CollectionOperations, ", "))
	}
	for i, op := range t.Operations {
		if !slices.Contains(task.CollectionOperations, op) {
			return invalid("operations", fmt.Sprintf("%q is not one of %s", op, strings.Join(task.CollectionOperations, ", ")))
		}
		if slices.Contains(t.Operations[:i], op) {
			return invalid("operations", fmt.Sprintf("%q is named twice", op))
		}
	}
	for _, f := range append(slices.Clone(t.Fields), t.VersionField) {
		if f == "" && f == t.VersionField {
			continue
		}
		if f == "" || strings.HasPrefix(f, "$") || strings.Contains(f, "..") || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") {
			field := "fields"
			if f == t.VersionField && !slices.Contains(t.Fields, f) {
				field = "version_field"
			}
			return invalid(field, fmt.Sprintf("%q is not a field path (names joined by dots)", f))
		}
	}
	if !t.Options.RunAt.IsZero() {
		return invalid("run_at", "a trigger's task is claimable when published")
	}
	if err := t.params(ChangeKey(t.Name, nil), nil).Validate(); err != nil {
		return err
	}
	return nil
}

// maxFilter bounds a filter, in bytes of JSON.
const maxFilter = 64 << 10

func validateName(name string) error {
	if err := task.ValidateName("name", name); err != nil {
		return err
	}
	if !task.PathNameable(name) { // /api/v1/triggers/NAME/pause must reach it
		return invalid("name", fmt.Sprintf("%q cannot be named in a URL path", name))
	}
	if strings.Contains(name, ":") {
		return invalid("name", fmt.Sprintf("%q: a colon would make its task keys ambiguous", name))
	}
	if longest := ScanKey(name, nil, nil); len(longest) > task.MaxNameLen {
		return invalid("name", fmt.Sprintf("is longer than %d bytes", task.MaxNameLen-len(longest)+len(name)))
	}
	return nil
}

// withDefaults fills what was left zero.
func (t *Trigger) withDefaults() {
	if len(t.Operations) == 0 && t.Table != "" {
		t.Operations = slices.Clone(DefaultTableOperations)
	}
	if len(t.Operations) == 0 {
		t.Operations = slices.Clone(DefaultOperations)
	}
	if len(t.Filter) > 0 && strings.TrimSpace(string(t.Filter)) == "" {
		t.Filter = nil
	}
}

// params is the publish of key with payload.
func (t *Trigger) params(key string, payload json.RawMessage) task.PublishParams {
	o := t.Options
	o.RunAt = time.Time{}
	return task.PublishParams{Key: key, Kind: t.Kind, Payload: payload, Options: o}
}

// Payload is the payload of a change of the document doc (of id): the
// document, or its Fields with _id; the _id alone when the change carries
// no document (a delete, or a document deleted since).
func (t *Trigger) Payload(id, doc json.RawMessage) json.RawMessage {
	if doc == nil {
		if id == nil {
			return json.RawMessage(`{}`)
		}
		return json.RawMessage(`{"_id":` + string(id) + `}`)
	}
	if len(t.Fields) == 0 {
		return doc
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		return doc
	}
	out := map[string]any{}
	if v, ok := m["_id"]; ok {
		out["_id"] = v
	}
	for _, f := range t.Fields {
		if v, ok := lookup(m, f); ok {
			setPath(out, f, v)
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return doc
	}
	return b
}

// lookup finds the dotted path f in m.
func lookup(m map[string]json.RawMessage, f string) (json.RawMessage, bool) {
	head, rest, nested := strings.Cut(f, ".")
	v, ok := m[head]
	if !ok || !nested {
		return v, ok
	}
	var sub map[string]json.RawMessage
	if json.Unmarshal(v, &sub) != nil {
		return nil, false
	}
	return lookup(sub, rest)
}

// setPath sets the dotted path f of out to v, making the objects on the way.
func setPath(out map[string]any, f string, v json.RawMessage) {
	head, rest, nested := strings.Cut(f, ".")
	if !nested {
		out[head] = v
		return
	}
	sub, ok := out[head].(map[string]any)
	if !ok {
		sub = map[string]any{}
		out[head] = sub
	}
	setPath(sub, rest, v)
}

// version is what a rescan keys doc by, beside its _id.
func (t *Trigger) version(doc json.RawMessage) json.RawMessage {
	if t.VersionField != "" {
		var m map[string]json.RawMessage
		if json.Unmarshal(doc, &m) == nil {
			if v, ok := lookup(m, t.VersionField); ok {
				return v
			}
		}
		return json.RawMessage("null")
	}
	sum := sha256.Sum256(doc)
	return json.RawMessage(`"` + hex.EncodeToString(sum[:]) + `"`)
}

func invalid(field, msg string) error {
	return fmt.Errorf("%w: %s: %s", task.ErrInvalid, field, msg)
}
