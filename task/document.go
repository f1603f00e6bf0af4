package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
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
	// Terms are the strings DocumentsByTerms finds the document by (such
	// as "label:region=eu"), kept in an index that every write of the
	// document replaces in the same transaction, and a delete removes:
	// the index never disagrees with the documents. A put stores them
	// sorted, without duplicates; see CheckTerms for their limits.
	Terms []string `json:"terms,omitempty"`
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
	// DocumentsByTerms returns the documents of namespace whose Terms
	// include every one of terms (at least one), by id, read from the
	// index rather than the whole namespace. It also returns every
	// document of namespace stored by a version of the store that kept
	// no terms (a database from before them, never written since; on
	// MongoDB also one a process of such a version wrote since): the
	// index cannot tell what terms those would carry, so they come with
	// Terms nil, and the caller checks each document it gets.
	DocumentsByTerms(ctx context.Context, namespace string, terms []string) ([]Document, error)
}

// DocumentPrefix starts the namespaces of leasepool's own documents
// (leasepool.pause, leasepool.schedule, ...).
const DocumentPrefix = "leasepool."

// MaxDocumentSize bounds a document's value, in bytes of JSON.
const MaxDocumentSize = 1 << 20

// CheckDocument is the check every backend's PutDocument makes: valid
// names, a namespace under DocumentPrefix only in a context from
// WithInternalWrite, a value of valid JSON within MaxDocumentSize, and
// valid terms (CheckTerms: the backend stores what it returns). It
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
	if _, err := CheckTerms("document terms", d.Terms); err != nil {
		return nil, err
	}
	return v, nil
}

// MaxDocumentTerms bounds a document's terms, and the terms of one
// DocumentsByTerms query.
const MaxDocumentTerms = 128

// MaxTermLen bounds a term, in bytes.
const MaxTermLen = 256

// CheckTerms validates the terms of a document (field "document terms")
// or of a query ("terms"): at most MaxDocumentTerms, each 1 to MaxTermLen
// bytes of UTF-8 without control characters. It returns them sorted,
// without duplicates, in a new slice (nil for none).
func CheckTerms(field string, terms []string) ([]string, error) {
	if len(terms) > MaxDocumentTerms {
		return nil, invalid(field, fmt.Sprintf("%d terms, more than %d", len(terms), MaxDocumentTerms))
	}
	for i, t := range terms {
		switch {
		case t == "":
			return nil, invalid(field, fmt.Sprintf("term %d: must not be empty", i))
		case len(t) > MaxTermLen:
			return nil, invalid(field, fmt.Sprintf("term %d: is %d bytes, more than %d", i, len(t), MaxTermLen))
		case !utf8.ValidString(t):
			return nil, invalid(field, fmt.Sprintf("term %d: is not valid UTF-8", i))
		}
		for _, c := range t {
			if unicode.IsControl(c) {
				return nil, invalid(field, fmt.Sprintf("term %d: control character %U", i, c))
			}
		}
	}
	if len(terms) == 0 {
		return nil, nil
	}
	out := slices.Clone(terms)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// CheckTermsQuery validates the terms of a DocumentsByTerms query: a
// valid namespace and 1 to MaxDocumentTerms valid terms, returned sorted
// without duplicates.
func CheckTermsQuery(namespace string, terms []string) ([]string, error) {
	if err := ValidateName("document namespace", namespace); err != nil {
		return nil, err
	}
	if len(terms) == 0 {
		return nil, invalid("terms", "give at least one")
	}
	return CheckTerms("terms", terms)
}

// HasTerms reports whether a document's terms (sorted, as stored) include
// every one of terms.
func HasTerms(stored, terms []string) bool {
	for _, t := range terms {
		if _, ok := slices.BinarySearch(stored, t); !ok {
			return false
		}
	}
	return true
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
