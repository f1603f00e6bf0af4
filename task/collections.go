package task

import (
	"context"
	"encoding/json"
	"time"
)

// CollectionWatcher is what a Store offers when its backend holds the
// user's own collections beside leasepool's (MongoDB): package trigger
// type-asserts a Store on it, so that it needs no backend. A Store without
// it has no collections to watch.
type CollectionWatcher interface {
	// CheckCollectionWatch checks w against the server and writes nothing:
	// the collection exists and is not leasepool's own, and the filter is
	// a match expression the watch can apply. Its errors wrap ErrInvalid
	// and name the field (collection, filter, operations).
	CheckCollectionWatch(ctx context.Context, w CollectionWatch) error
	// WatchCollection opens a change stream of w's matching changes from
	// the position: after its token, else from its time. It returns
	// ErrHistoryLost when the server no longer has that position (and so
	// may Next, later).
	WatchCollection(ctx context.Context, w CollectionWatch, from CollectionPosition) (CollectionStream, error)
	// ScanCollection returns up to limit documents of w's collection that
	// match w.Filter, in _id order: those after the document whose Cursor
	// is after, when it is not empty.
	ScanCollection(ctx context.Context, w CollectionWatch, after json.RawMessage, limit int) ([]CollectionDocument, error)
}

// CollectionWatch names the changes to watch in a collection.
type CollectionWatch struct {
	Database   string
	Collection string
	// Filter is a match expression (MongoDB extended JSON) on the changed
	// document, tested on the document as the change event carries it;
	// empty matches every document. A delete carries no document: the
	// filter does not apply to deletes.
	Filter json.RawMessage
	// Operations are the kinds of change watched: of CollectionOperations.
	Operations []string
}

// The kinds of change a CollectionWatch may name.
const (
	OpInsert  = "insert"
	OpUpdate  = "update"
	OpReplace = "replace"
	OpDelete  = "delete"
)

// CollectionOperations are every kind of change, in order.
var CollectionOperations = []string{OpInsert, OpUpdate, OpReplace, OpDelete}

// CollectionPosition is where a collection's stream starts: after Token
// when it is set, else from the changes made at StartAt or later (a
// server's clock has seconds: from the start of StartAt's second).
type CollectionPosition struct {
	Token   Token
	StartAt time.Time
}

// CollectionChange is one change of a watched collection.
type CollectionChange struct {
	// Token resumes the stream after this change. The same change read
	// again (a stream resumed from an earlier token) carries the same
	// token.
	Token     Token
	Operation string
	// ID is the document's _id as relaxed extended JSON, nil when the
	// event does not say it.
	ID json.RawMessage
	// Document is the document as relaxed extended JSON: for an update,
	// as looked up when the change was read (a later write's, when one
	// came since); nil for a delete, or for a document gone since.
	Document json.RawMessage
}

// CollectionStream is a stream of a watched collection's changes.
type CollectionStream interface {
	// Next blocks until a change, ctx's end or an error.
	Next(ctx context.Context) (CollectionChange, error)
	// ResumeToken is the position after every change Next has returned
	// (and perhaps past changes the watch left out); nil while the server
	// has named none.
	ResumeToken() Token
	Close() error
}

// CollectionDocument is one document of a scan, as relaxed extended JSON.
type CollectionDocument struct {
	ID       json.RawMessage
	Document json.RawMessage
	// Cursor is where the next page of a scan starts.
	Cursor json.RawMessage
}
