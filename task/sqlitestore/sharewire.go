// sharewire.go holds what processes sharing one store file say to each
// other over the writer's Unix socket (see share.go): frames, requests,
// replies and errors.

package sqlitestore

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/leasepool/leasepool/task"
)

// A frame is a 4-byte big-endian length, an 8-byte request id and a JSON
// body: a wireRequest from a client, or a wireReply from the writer with
// the id of the request it answers.
const (
	frameHeader = 12
	// maxFrame bounds a frame's body: a task of the largest payload, or a
	// document of the largest value, with room for its other fields.
	maxFrame = 4 << 20
)

func appendFrame(b []byte, id uint64, body []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	b = binary.BigEndian.AppendUint64(b, id)
	return append(b, body...)
}

func readFrame(r *bufio.Reader) (id uint64, body []byte, err error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n > maxFrame {
		return 0, nil, fmt.Errorf("sqlitestore: share frame of %d bytes (at most %d)", n, maxFrame)
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return binary.BigEndian.Uint64(h[4:]), body, nil
}

// The methods a client sends to the writer: the Store's writes, and
// hello, which a client sends first on each connection.
const (
	methodHello          = "hello"
	methodInsert         = "insert"
	methodUpdate         = "update"
	methodAcquireLocks   = "acquire-locks"
	methodReleaseLocks   = "release-locks"
	methodDeleteFinished = "delete-finished"
	methodRegister       = "register-worker"
	methodUnregister     = "unregister-worker"
	methodPutDocument    = "put-document"
	methodDeleteDocument = "delete-document"
)

// wireRequest is one write a client asks the writer to make.
type wireRequest struct {
	Method string `json:"m"`
	// Deadline is the store-clock time (unix ns) after which the writer
	// must not apply the request: a client that has had no answer by then
	// knows, once it holds the write lock, that the request is either
	// committed or never will be.
	Deadline int64 `json:"d,omitempty"`
	// Internal carries task.WithInternalWrite.
	Internal bool `json:"i,omitempty"`
	// Schema is the client's schema version (hello): a writer of another
	// version refuses it, and the client writes the file itself.
	Schema int `json:"sv,omitempty"`

	// Task is the task of insert and update (Task.AppendJSON) without its
	// payload, which Payload carries byte for byte (see wireTask); Seq and
	// Version are the version update replaces.
	Task    json.RawMessage `json:"t,omitempty"`
	Payload json.RawMessage `json:"pl,omitempty"`
	Seq     int64           `json:"s,omitempty"`
	Version int64           `json:"v,omitempty"`
	// Prev is the kind and state of the version update replaces, when the
	// client knows them: the writer then need not read them to keep the
	// counts.
	Prev *seenWire `json:"p,omitempty"`

	Locks    *task.LockParams     `json:"l,omitempty"`
	Delete   *task.DeleteParams   `json:"x,omitempty"`
	Register *task.RegisterParams `json:"r,omitempty"`
	Document *task.Document       `json:"doc,omitempty"`
	// Namespace, ID and Instance name what unregister-worker and
	// delete-document remove.
	Namespace string `json:"ns,omitempty"`
	ID        string `json:"id,omitempty"`
	Instance  string `json:"in,omitempty"`
}

type seenWire struct {
	Kind  string     `json:"k"`
	State task.State `json:"s"`
}

// wireReply is the writer's answer to one request.
type wireReply struct {
	Err *wireError `json:"e,omitempty"`
	// Change is the change seq the write appended (insert, update), so
	// that the client's own streams need not decode its writes.
	Change  int64 `json:"c,omitempty"`
	Seq     int64 `json:"s,omitempty"`
	Version int64 `json:"v,omitempty"`
	// Inserted and Stored answer insert: the task under the key when it
	// was not inserted.
	Inserted      bool            `json:"ins,omitempty"`
	Stored        json.RawMessage `json:"t,omitempty"`
	StoredPayload json.RawMessage `json:"pl,omitempty"`
	Document      *task.Document  `json:"doc,omitempty"`
	Deleted       int             `json:"n,omitempty"`
}

// wireError is an error that crosses the socket keeping what callers test
// with errors.Is and errors.As.
type wireError struct {
	Kind    string `json:"k"`
	Message string `json:"m"`
	// Locked and Taken carry a *task.LockedError and a
	// *task.WorkerIDTakenError.
	Locked *task.LockedError `json:"l,omitempty"`
	Taken  *task.WorkerInfo  `json:"w,omitempty"`
}

// Kinds of wireError besides the sentinels of errorKinds.
const (
	// kindNotApplied: the writer did not apply the request and never will
	// (its deadline passed, or the writer is closing); the client writes
	// it itself.
	kindNotApplied = "not-applied"
	// kindUnknown: the writer's outcome is unknown (the writer's store
	// closed while the write was queued).
	kindUnknown = "unknown"
)

// errorKinds are the sentinels a reply's error keeps.
var errorKinds = []struct {
	kind string
	err  error
}{
	{"invalid", task.ErrInvalid},
	{"not-found", task.ErrNotFound},
	{"conflict", task.ErrConflict},
	{"locked", task.ErrLocked},
	{"worker-id-taken", task.ErrWorkerIDTaken},
	{"read-only", ErrReadOnly},
	{"schema-changed", ErrSchemaChanged},
}

// errNotApplied is what a request refused unapplied by the writer
// returns inside the Store: the caller writes directly.
var errNotApplied = errors.New("sqlitestore: not applied by the writer")

func toWire(err error) *wireError {
	if err == nil {
		return nil
	}
	w := &wireError{Message: err.Error()}
	switch {
	case errors.Is(err, errNotApplied):
		w.Kind = kindNotApplied
		return w
	case errors.Is(err, task.ErrClosed):
		w.Kind = kindUnknown
		return w
	}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			w.Kind = k.kind
			break
		}
	}
	var le *task.LockedError
	if errors.As(err, &le) {
		w.Locked = le
	}
	var te *task.WorkerIDTakenError
	if errors.As(err, &te) {
		w.Taken = &te.Holder
	}
	return w
}

// remoteError is an error the writer returned: its message, wrapping the
// sentinel (or typed error) it wrapped there.
type remoteError struct {
	msg string
	err error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.err }

func (w *wireError) toError() error {
	if w == nil {
		return nil
	}
	var inner error
	switch {
	case w.Locked != nil:
		inner = w.Locked
	case w.Taken != nil:
		inner = &task.WorkerIDTakenError{Holder: *w.Taken}
	default:
		for _, k := range errorKinds {
			if k.kind == w.Kind {
				inner = k.err
			}
		}
	}
	return &remoteError{msg: w.Message, err: inner}
}

// marshalWire encodes a request or reply. Raw JSON (payloads, document
// values) crosses byte for byte: json.Marshal would escape <, > and & in
// it, and a task read back would differ from the one written.
func marshalWire(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// wireTask splits t into its JSON without the payload and the payload,
// which Task.AppendJSON would escape.
func wireTask(t *task.Task) (doc, payload json.RawMessage, err error) {
	c := *t
	c.Payload = nil
	doc, err = c.AppendJSON(nil)
	return doc, t.Payload, err
}

// fromWire is the task wireTask split.
func fromWire(doc, payload json.RawMessage) (*task.Task, error) {
	t, err := task.ParseJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("%w: task: %w", task.ErrInvalid, err)
	}
	if len(payload) > 0 {
		t.Payload = append(json.RawMessage(nil), payload...)
	}
	return t, nil
}
