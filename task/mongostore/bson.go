package mongostore

// The stored task document: task.Task to and from BSON, the JSON payload
// stored as a BSON value (key order kept) and read back as JSON.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/leasepool/leasepool/task"
)

// taskDoc is the stored task document. Field names are those of docs/tasks.md.
// Durations are int64 nanoseconds; times are BSON dates, so they keep
// millisecond precision only.
type taskDoc struct {
	ID                   bson.ObjectID `bson:"_id"`
	Key                  string        `bson:"key"`
	Kind                 string        `bson:"kind"`
	Payload              bson.RawValue `bson:"payload"`
	Trace                *traceDoc     `bson:"trace,omitempty"`
	Priority             int64         `bson:"priority"`
	RunAt                time.Time     `bson:"run_at"`
	Seq                  int64         `bson:"seq"`
	Bucket               int64         `bson:"bucket"` // task.ShareBucket(seq), for CandidateQuery.Share
	SpecificWorkerIDs    []string      `bson:"specific_worker_ids"`
	ConcurrentWorkerCnt  int64         `bson:"concurrent_worker_cnt"`
	SuccessWorkerCnt     int64         `bson:"success_worker_cnt"`
	MaxUnexpectedRetries int64         `bson:"max_unexpected_retries"`
	PingInterval         int64         `bson:"ping_interval"`
	WorkerTimeout        int64         `bson:"worker_timeout"`
	LockKeys             []string      `bson:"lock_keys"`
	// Group is set at publish and never changes, so leaving it out of a
	// $set of a task without one never leaves a stale one behind.
	Group          string       `bson:"group,omitempty"`
	Workers        []attemptDoc `bson:"workers"`
	Attempts       int64        `bson:"attempts"`
	History        []attemptDoc `bson:"history"` // not omitempty: Update $sets every field
	HistoryDropped int64        `bson:"history_dropped"`
	Cancelled      bool         `bson:"cancelled"`
	State          string       `bson:"state"`
	NextClaimAt    time.Time    `bson:"next_claim_at"`
	Version        int64        `bson:"version"`
	CreatedAt      time.Time    `bson:"created_at"`
	UpdatedAt      time.Time    `bson:"updated_at"`
	ChangesVersion int64        `bson:"changes_version"`
	Changes        []changeDoc  `bson:"changes"`
}

// traceDoc is a task.Trace. A task's trace is set at publish (and by a
// rerun) and never removed, so leaving it out of a $set of a task without
// one never leaves a stale one behind.
type traceDoc struct {
	Traceparent string `bson:"traceparent,omitempty"`
	Tracestate  string `bson:"tracestate,omitempty"`
}

// changeDoc is a task.Change.
type changeDoc struct {
	Op       string    `bson:"op"`
	WorkerID string    `bson:"worker_id,omitempty"`
	Instance string    `bson:"instance,omitempty"`
	Attempt  int64     `bson:"attempt,omitempty"`
	Error    string    `bson:"error,omitempty"`
	Until    time.Time `bson:"until,omitempty"`
}

type attemptDoc struct {
	WorkerID   string    `bson:"worker_id"`
	Instance   string    `bson:"instance,omitempty"`
	State      string    `bson:"state"`
	Attempt    int64     `bson:"attempt"`
	LeaseUntil time.Time `bson:"lease_until"`
	StartedAt  time.Time `bson:"started_at"`
	// ClaimVersion is task.Attempt.ClaimVersion.
	ClaimVersion int64     `bson:"claim_version,omitempty"`
	EndedAt      time.Time `bson:"ended_at"`
	Error        string    `bson:"error,omitempty"`
	// Result is stored as a BSON value, as the payload is.
	Result        bson.RawValue `bson:"result,omitempty"`
	Log           []logDoc      `bson:"log,omitempty"`
	LogDropped    int64         `bson:"log_dropped,omitempty"`
	OutputDropped bool          `bson:"output_dropped,omitempty"`
	Slots         []string      `bson:"slots,omitempty"`
}

// logDoc is a task.LogLine.
type logDoc struct {
	At  time.Time `bson:"at"`
	Msg string    `bson:"msg"`
}

// nonNil keeps arrays arrays: a nil slice would be stored as null, and the
// worker-id filter matches on an empty array.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// toDoc converts t for storage. t.ID must be empty or an ObjectID in hex.
func toDoc(t *task.Task) (*taskDoc, error) {
	var id bson.ObjectID
	if t.ID != "" {
		var err error
		if id, err = bson.ObjectIDFromHex(t.ID); err != nil {
			return nil, fmt.Errorf("%w: _id %q is not an ObjectID: %w", task.ErrInvalid, t.ID, err)
		}
	}
	payload, err := jsonToBSON(t.Payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload: %w", task.ErrInvalid, err)
	}
	d := &taskDoc{
		ID:                   id,
		Key:                  t.Key,
		Kind:                 t.Kind,
		Payload:              payload,
		Priority:             int64(t.Priority),
		RunAt:                t.RunAt.UTC(),
		Seq:                  t.Seq,
		Bucket:               int64(task.ShareBucket(t.Seq)),
		SpecificWorkerIDs:    nonNil(t.SpecificWorkerIDs),
		ConcurrentWorkerCnt:  int64(t.ConcurrentWorkerCnt),
		SuccessWorkerCnt:     int64(t.SuccessWorkerCnt),
		MaxUnexpectedRetries: int64(t.MaxUnexpectedRetries),
		PingInterval:         int64(t.PingInterval),
		WorkerTimeout:        int64(t.WorkerTimeout),
		LockKeys:             nonNil(t.LockKeys),
		Group:                t.Group,
		Workers:              make([]attemptDoc, len(t.Attempts)),
		Attempts:             int64(t.AttemptsStarted),
		Cancelled:            t.Cancelled,
		State:                string(t.State),
		NextClaimAt:          t.NextClaimAt.UTC(),
		Version:              t.Version,
		CreatedAt:            t.CreatedAt.UTC(),
		UpdatedAt:            t.UpdatedAt.UTC(),
		ChangesVersion:       t.ChangesVersion,
		Changes:              make([]changeDoc, len(t.Changes)),
	}
	if !t.Trace.IsZero() {
		d.Trace = &traceDoc{Traceparent: t.Trace.Traceparent, Tracestate: t.Trace.Tracestate}
	}
	for i, c := range t.Changes {
		d.Changes[i] = changeDoc{Op: c.Op, WorkerID: c.WorkerID, Instance: c.Instance, Attempt: int64(c.Attempt), Error: c.Error, Until: c.Until.UTC()}
	}
	for i, w := range t.Attempts {
		if d.Workers[i], err = toAttemptDoc(w); err != nil {
			return nil, err
		}
	}
	d.History = make([]attemptDoc, 0, len(t.History))
	for _, w := range t.History {
		h, err := toAttemptDoc(w)
		if err != nil {
			return nil, err
		}
		d.History = append(d.History, h)
	}
	d.HistoryDropped = int64(t.HistoryDropped)
	return d, nil
}

func toAttemptDoc(w task.Attempt) (attemptDoc, error) {
	d := attemptDoc{
		WorkerID:      w.WorkerID,
		Instance:      w.Instance,
		State:         string(w.State),
		Attempt:       int64(w.Attempt),
		LeaseUntil:    w.LeaseUntil.UTC(),
		StartedAt:     w.StartedAt.UTC(),
		ClaimVersion:  w.ClaimVersion,
		EndedAt:       w.EndedAt.UTC(),
		Error:         w.Error,
		LogDropped:    int64(w.LogDropped),
		OutputDropped: w.OutputDropped,
		Slots:         w.Slots,
	}
	if len(w.Result) > 0 {
		r, err := jsonToBSON(w.Result)
		if err != nil {
			return d, fmt.Errorf("%w: result of attempt %d: %w", task.ErrInvalid, w.Attempt, err)
		}
		d.Result = r
	}
	for _, l := range w.Log {
		d.Log = append(d.Log, logDoc{At: l.At.UTC(), Msg: l.Msg})
	}
	return d, nil
}

func fromAttemptDoc(d attemptDoc) (task.Attempt, error) {
	w := task.Attempt{
		WorkerID:      d.WorkerID,
		Instance:      d.Instance,
		State:         task.AttemptState(d.State),
		Attempt:       int(d.Attempt),
		LeaseUntil:    utc(d.LeaseUntil),
		StartedAt:     utc(d.StartedAt),
		ClaimVersion:  d.ClaimVersion,
		EndedAt:       utc(d.EndedAt),
		Error:         d.Error,
		LogDropped:    int(d.LogDropped),
		OutputDropped: d.OutputDropped,
		Slots:         d.Slots,
	}
	r, err := bsonToJSON(d.Result)
	if err != nil {
		return w, fmt.Errorf("result of attempt %d: %w", w.Attempt, err)
	}
	w.Result = r
	for _, l := range d.Log {
		w.Log = append(w.Log, task.LogLine{At: utc(l.At), Msg: l.Msg})
	}
	return w, nil
}

// utc turns a decoded BSON date back into time.Time, keeping the zero time
// zero.
func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

// fromDoc converts a stored document.
func fromDoc(d *taskDoc) (*task.Task, error) {
	payload, err := bsonToJSON(d.Payload)
	if err != nil {
		return nil, fmt.Errorf("task %s: payload: %w", d.Key, err)
	}
	t := &task.Task{
		ID:                   d.ID.Hex(),
		Key:                  d.Key,
		Kind:                 d.Kind,
		Payload:              payload,
		Priority:             int(d.Priority),
		RunAt:                utc(d.RunAt),
		Seq:                  d.Seq,
		SpecificWorkerIDs:    d.SpecificWorkerIDs,
		ConcurrentWorkerCnt:  int(d.ConcurrentWorkerCnt),
		SuccessWorkerCnt:     int(d.SuccessWorkerCnt),
		MaxUnexpectedRetries: int(d.MaxUnexpectedRetries),
		PingInterval:         task.Duration(d.PingInterval),
		WorkerTimeout:        task.Duration(d.WorkerTimeout),
		LockKeys:             d.LockKeys,
		Group:                d.Group,
		Attempts:             make([]task.Attempt, len(d.Workers)),
		AttemptsStarted:      int(d.Attempts),
		Cancelled:            d.Cancelled,
		State:                task.State(d.State),
		NextClaimAt:          utc(d.NextClaimAt),
		Version:              d.Version,
		CreatedAt:            utc(d.CreatedAt),
		UpdatedAt:            utc(d.UpdatedAt),
		ChangesVersion:       d.ChangesVersion,
	}
	if d.Trace != nil {
		t.Trace = task.Trace{Traceparent: d.Trace.Traceparent, Tracestate: d.Trace.Tracestate}
	}
	for _, c := range d.Changes {
		t.Changes = append(t.Changes, task.Change{Op: c.Op, WorkerID: c.WorkerID, Instance: c.Instance, Attempt: int(c.Attempt), Error: c.Error, Until: utc(c.Until)})
	}
	if len(t.SpecificWorkerIDs) == 0 {
		t.SpecificWorkerIDs = nil
	}
	if len(t.LockKeys) == 0 {
		t.LockKeys = nil
	}
	for i, w := range d.Workers {
		if t.Attempts[i], err = fromAttemptDoc(w); err != nil {
			return nil, fmt.Errorf("task %s: %w", d.Key, err)
		}
	}
	for _, w := range d.History {
		h, err := fromAttemptDoc(w)
		if err != nil {
			return nil, fmt.Errorf("task %s: history: %w", d.Key, err)
		}
		t.History = append(t.History, h)
	}
	t.HistoryDropped = int(d.HistoryDropped)
	return t, nil
}

// decodeTask decodes a raw stored document.
func decodeTask(raw bson.Raw) (*task.Task, error) {
	var d taskDoc
	if err := bson.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("decode task document: %w", err)
	}
	return fromDoc(&d)
}

// docFields returns d's fields in order as a bson.D, for $setOnInsert and
// $set.
func docFields(d *taskDoc) (bson.D, error) {
	raw, err := bson.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode task %s: %w", d.Key, err)
	}
	var out bson.D
	if err := bson.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("encode task %s: %w", d.Key, err)
	}
	return out, nil
}

// jsonToBSON converts a JSON payload to a BSON value with object key order
// kept: documents, arrays, strings, int64 (integers that fit), doubles,
// booleans and null. An empty payload is stored as null.
func jsonToBSON(js json.RawMessage) (bson.RawValue, error) {
	var v any = nil
	if len(bytes.TrimSpace(js)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.UseNumber()
		var err error
		if v, err = jsonValue(dec); err != nil {
			return bson.RawValue{}, err
		}
		if _, err := dec.Token(); err != io.EOF {
			return bson.RawValue{}, fmt.Errorf("trailing data after the JSON value")
		}
	}
	if v == nil { // an empty payload, or JSON null: the driver marshals no untyped nil
		return bson.RawValue{Type: bson.TypeNull}, nil
	}
	typ, data, err := bson.MarshalValue(v)
	if err != nil {
		return bson.RawValue{}, err
	}
	return bson.RawValue{Type: typ, Value: data}, nil
}

func jsonValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok := tok.(type) {
	case json.Delim:
		if tok == '[' {
			a := bson.A{}
			for dec.More() {
				v, err := jsonValue(dec)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := dec.Token() // ]
			return a, err
		}
		d := bson.D{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := jsonValue(dec)
			if err != nil {
				return nil, err
			}
			d = append(d, bson.E{Key: k.(string), Value: v})
		}
		_, err := dec.Token() // }
		return d, err
	case json.Number:
		if i, err := strconv.ParseInt(string(tok), 10, 64); err == nil && (i != 0 || tok[0] != '-') {
			return i, nil
		}
		f, err := strconv.ParseFloat(string(tok), 64)
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", tok, err)
		}
		return f, nil
	default: // string, bool, nil
		return tok, nil
	}
}

// bsonToJSON converts a stored payload back to JSON. Types JSON has no
// word for (ObjectIDs, dates... written by other tools) come out as
// relaxed Extended JSON.
func bsonToJSON(v bson.RawValue) (json.RawMessage, error) {
	if v.Type == 0 || v.Type == bson.TypeNull {
		return nil, nil
	}
	var b bytes.Buffer
	if err := writeJSON(&b, v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func writeJSON(b *bytes.Buffer, v bson.RawValue) error {
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		elems, err := v.Document().Elements()
		if err != nil {
			return err
		}
		b.WriteByte('{')
		for i, e := range elems {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, e.Key())
			b.WriteByte(':')
			if err := writeJSON(b, e.Value()); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case bson.TypeArray:
		vals, err := v.Array().Values()
		if err != nil {
			return err
		}
		b.WriteByte('[')
		for i, e := range vals {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSON(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case bson.TypeString:
		writeString(b, v.StringValue())
	case bson.TypeInt32:
		b.WriteString(strconv.FormatInt(int64(v.Int32()), 10))
	case bson.TypeInt64:
		b.WriteString(strconv.FormatInt(v.Int64(), 10))
	case bson.TypeDouble:
		f, err := json.Marshal(v.Double())
		if err != nil {
			return err
		}
		b.Write(f)
	case bson.TypeBoolean:
		b.WriteString(strconv.FormatBool(v.Boolean()))
	case bson.TypeNull, bson.TypeUndefined:
		b.WriteString("null")
	default:
		doc, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false)
		if err != nil {
			return err
		}
		var wrapped struct {
			V json.RawMessage `json:"v"`
		}
		if err := json.Unmarshal(doc, &wrapped); err != nil {
			return err
		}
		b.Write(wrapped.V)
	}
	return nil
}

func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	b.Truncate(b.Len() - 1) // Encode's newline
}
