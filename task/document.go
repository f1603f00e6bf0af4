package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Document is a versioned JSON document of state that is not a task, such
// as the control doorbell: named by Namespace and ID, written only by
// compare-and-set on Version.
type Document struct {
	Namespace string `json:"namespace"`
	ID        string `json:"id"`
	// Version is the stored version: 1 after the first write, one more
	// with each write. PutDocument takes the version the writer read, 0
	// for a document it expects not to exist.
	Version int64           `json:"version"`
	Value   json.RawMessage `json:"value"`
	// UpdatedAt is the store's time of the last write, set by PutDocument.
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// DocumentStore keeps versioned documents, part of every Store. Every
// successful write is one change on the store's change stream, delivered
// to the streams that ask for its namespace (WatchParams.Documents) in the
// order of the writes to that document.
//
// Namespaces starting with DocumentPrefix ("leasepool.") are leasepool's
// own; any other namespace is free for applications. PutDocument refuses a
// write to one of leasepool's own unless its context comes from
// WithInternalWrite.
type DocumentStore interface {
	// GetDocument returns the document, or ErrNotFound.
	GetDocument(ctx context.Context, namespace, id string) (Document, error)
	// PutDocument writes d.Value if the stored version equals d.Version
	// (no document stored, for 0), and returns the document as stored,
	// with Version d.Version+1; otherwise ErrConflict, writing nothing. Of
	// concurrent puts of one document with the same Version, exactly one
	// succeeds.
	PutDocument(ctx context.Context, d Document) (Document, error)
	// DeleteDocument deletes the document if its stored version equals
	// version (any version, for 0): ErrNotFound if there is none,
	// ErrConflict if its version differs.
	DeleteDocument(ctx context.Context, namespace, id string, version int64) error
	// Documents returns every document of namespace, by id.
	Documents(ctx context.Context, namespace string) ([]Document, error)
}

// DocumentPrefix starts the namespaces of leasepool's own documents
// (leasepool.pause, leasepool.schedule, ...).
const DocumentPrefix = "leasepool."

// MaxDocumentSize bounds a document's value, in bytes of JSON.
const MaxDocumentSize = 1 << 20

// CheckDocument is the check every backend's PutDocument makes: valid
// names, a namespace under DocumentPrefix only in a context from
// WithInternalWrite, and a value of valid JSON within MaxDocumentSize. It
// returns the value to store ("null" for none).
func CheckDocument(ctx context.Context, d Document) (json.RawMessage, error) {
	if err := CheckDocumentName(d.Namespace, d.ID); err != nil {
		return nil, err
	}
	if strings.HasPrefix(d.Namespace, DocumentPrefix) && !isInternalWrite(ctx) {
		return nil, invalid("document namespace", fmt.Sprintf("%q is reserved (the %s prefix is leasepool's own)", d.Namespace, DocumentPrefix))
	}
	if d.Version < 0 {
		return nil, invalid("document version", fmt.Sprintf("%d is negative", d.Version))
	}
	v := d.Value
	if len(v) == 0 {
		v = json.RawMessage("null")
	}
	if len(v) > MaxDocumentSize {
		return nil, invalid("document value", fmt.Sprintf("is %d bytes, more than %d", len(v), MaxDocumentSize))
	}
	if !json.Valid(v) {
		return nil, invalid("document value", "is not valid JSON")
	}
	return v, nil
}

// CheckDocumentName validates a document's namespace and id.
func CheckDocumentName(namespace, id string) error {
	if err := ValidateName("document namespace", namespace); err != nil {
		return err
	}
	return ValidateName("document id", id)
}

// WantsDocuments reports whether a stream opened with p carries the
// document writes of namespace.
func (p WatchParams) WantsDocuments(namespace string) bool {
	for _, ns := range p.Documents {
		if ns == namespace {
			return true
		}
	}
	return false
}

// RetryConflict reports whether a compare-and-set of a document that
// failed with *err is to be tried again (read, change, put): on a
// conflict, unless ctx has ended, and then *err becomes why.
func RetryConflict(ctx context.Context, err *error) bool {
	if !errors.Is(*err, ErrConflict) {
		return false
	}
	if cerr := ctx.Err(); cerr != nil {
		*err = cerr
		return false
	}
	return true
}
