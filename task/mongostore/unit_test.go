package mongostore

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/leasepool/leasepool/task"
)

// These tests need no server: they check the pieces that read MongoDB's
// shapes (change events, server errors) and the clock arithmetic.

func mustMarshal(t *testing.T, v any) bson.Raw {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sampleTask(t *testing.T) (*task.Task, bson.Raw) {
	t.Helper()
	now := time.Date(2025, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	tk, err := task.NewTask(task.PublishParams{Key: "k1", Kind: "kind", Payload: json.RawMessage(`{"b":1,"a":[true,"x"]}`)}, now)
	if err != nil {
		t.Fatal(err)
	}
	tk.ID, tk.Seq = bson.NewObjectID().Hex(), 42
	d, err := toDoc(tk)
	if err != nil {
		t.Fatal(err)
	}
	return tk, mustMarshal(t, d)
}

func TestDecodeEvent(t *testing.T) {
	tk, full := sampleTask(t)
	token := bson.D{{Key: "_data", Value: "8263A1B2C3000000012B022C0100296E5A1004"}}
	cases := map[string]struct {
		event   bson.D
		key     string
		hasTask bool
		version int64
		skip    bool
		err     error
	}{
		"insert": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "insert"},
			{Key: "fullDocument", Value: full},
			{Key: "ns", Value: bson.D{{Key: "db", Value: "d"}, {Key: "coll", Value: "tasks"}}},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: bson.NewObjectID()}}},
		}, key: "k1", hasTask: true},
		// MongoDB: an update whose document was deleted before the lookup.
		"update without full document": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "update"},
			{Key: "fullDocument", Value: nil},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "key", Value: "k2"}}},
			{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: bson.D{{Key: "priority", Value: 3}}}}},
		}, key: "k2"},
		// MongoDB: the looked-up document may be a later write's; the
		// version this write stored comes from updatedFields.
		"update with version": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "update"},
			{Key: "fullDocument", Value: full},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: bson.NewObjectID()}}},
			{Key: "updateDescription", Value: bson.D{{Key: "updatedFields", Value: bson.D{{Key: "version", Value: int64(6)}}}}},
		}, key: "k1", hasTask: true, version: 6},
		"test server update with version": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "update"},
			{Key: "fullDocument", Value: full},
			{Key: "documentKey", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "version", Value: int64(9)}}}}},
		}, key: "k1", hasTask: true, version: 9},
		// mongo-java-server: documentKey holds the update operators and
		// there is no updateDescription.
		"test server update": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "update"},
			{Key: "fullDocument", Value: full},
			{Key: "documentKey", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "priority", Value: 3}}}}},
		}, key: "k1", hasTask: true},
		"no key anywhere": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "update"},
			{Key: "documentKey", Value: bson.D{{Key: "_id", Value: bson.NewObjectID()}}},
		}, skip: true},
		"full document that is not a task": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "replace"},
			{Key: "fullDocument", Value: bson.D{{Key: "key", Value: "k3"}, {Key: "workers", Value: "oops"}}},
		}, key: "k3"},
		"invalidate": {event: bson.D{
			{Key: "_id", Value: token}, {Key: "operationType", Value: "invalidate"},
		}, err: task.ErrHistoryLost},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			ev, skip, err := decodeEvent(mustMarshal(t, c.event))
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v; want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("decodeEvent: %v", err)
			}
			if skip != c.skip {
				t.Fatalf("skip = %v; want %v", skip, c.skip)
			}
			if skip {
				return
			}
			if ev.Version != c.version {
				t.Errorf("Version = %d; want %d", ev.Version, c.version)
			}
			if ev.Key != c.key {
				t.Errorf("Key = %q; want %q", ev.Key, c.key)
			}
			if (ev.Task != nil) != c.hasTask {
				t.Fatalf("Task = %v; want present=%v", ev.Task, c.hasTask)
			}
			if ev.Task != nil && (ev.Task.ID != tk.ID || ev.Task.Seq != 42 || string(ev.Task.Payload) != `{"b":1,"a":[true,"x"]}`) {
				t.Errorf("Task = %+v", ev.Task)
			}
			var tok bson.D
			if err := bson.Unmarshal(ev.Token, &tok); err != nil || len(tok) != 1 || tok[0].Key != "_data" {
				t.Errorf("Token %v does not hold the event's _id: %v", bson.Raw(ev.Token), err)
			}
		})
	}
}

func TestMapErr(t *testing.T) {
	dup := mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "E11000 duplicate key error"}}}
	netErr := mongo.CommandError{Code: 6, Labels: []string{"NetworkError"}, Message: "connection reset"}
	cases := []struct {
		name string
		in   error
		want error // nil: no sentinel, but still wraps in
	}{
		{"no documents", mongo.ErrNoDocuments, task.ErrNotFound},
		{"disconnected", mongo.ErrClientDisconnected, task.ErrClosed},
		{"duplicate key", dup, task.ErrConflict},
		{"history lost", mongo.CommandError{Code: 286, Name: "ChangeStreamHistoryLost"}, task.ErrHistoryLost},
		{"resume token not found", mongo.CommandError{Code: 280, Name: "ChangeStreamFatalError"}, task.ErrHistoryLost},
		{"standalone", mongo.CommandError{Code: 40573, Message: "The $changeStream stage is only supported on replica sets"}, task.ErrWatchUnsupported},
		{"replica sets message", mongo.CommandError{Code: 1, Message: "$changeStream is only supported on replica sets"}, task.ErrWatchUnsupported},
		{"unknown stage", mongo.CommandError{Code: 40324, Message: "Unrecognized pipeline stage name: '$changeStream'"}, task.ErrWatchUnsupported},
		{"network", netErr, nil},
		{"wrapped network", fmt.Errorf("find: %w", netErr), nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := mapErr(c.in)
			if c.want != nil && !errors.Is(got, c.in) && !errors.Is(got, c.want) {
				t.Fatalf("mapErr(%v) = %v lost the cause", c.in, got)
			}
			if c.want != nil && !errors.Is(got, c.want) {
				t.Fatalf("mapErr(%v) = %v; want it to wrap %v", c.in, got, c.want)
			}
			if c.want == nil {
				for _, s := range []error{task.ErrNotFound, task.ErrClosed, task.ErrConflict, task.ErrHistoryLost, task.ErrWatchUnsupported} {
					if errors.Is(got, s) {
						t.Fatalf("mapErr(%v) = %v; mapped a retryable error to %v", c.in, got, s)
					}
				}
				var ce mongo.CommandError
				if !errors.As(got, &ce) || !mongo.IsNetworkError(got) {
					t.Fatalf("mapErr(%v) = %v; the driver error is no longer reachable", c.in, got)
				}
			}
		})
	}
	if mapErr(nil) != nil {
		t.Fatal("mapErr(nil) != nil")
	}
}

func TestClockOffset(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		name             string
		sent, recv, srv  time.Time
		wantOff, wantRTT time.Duration
	}{
		// Local clock 30s ahead; the server read its clock mid-way.
		{"ahead", base.Add(30 * time.Second), base.Add(30*time.Second + 20*time.Millisecond), base.Add(10 * time.Millisecond), -30 * time.Second, 20 * time.Millisecond},
		{"behind", base, base.Add(4 * time.Millisecond), base.Add(time.Minute + 2*time.Millisecond), time.Minute, 4 * time.Millisecond},
		{"same", base, base, base, 0, 0},
	}
	for _, c := range cases {
		off, rtt := clockOffset(c.sent, c.recv, c.srv)
		if off != c.wantOff || rtt != c.wantRTT {
			t.Errorf("%s: offset %s rtt %s; want %s %s", c.name, off, rtt, c.wantOff, c.wantRTT)
		}
	}
}

// Now adds the measured offset to the injected local clock.
func TestNowUsesOffset(t *testing.T) {
	local := time.Date(2025, 1, 1, 0, 0, 30, 0, time.UTC)
	s := &Store{cfg: Config{Clock: func() time.Time { return local }}}
	off, _ := clockOffset(local, local.Add(2*time.Millisecond), local.Add(-30*time.Second+time.Millisecond))
	s.offset.Store(int64(off))
	if got, want := s.Now(), local.Add(-30*time.Second); !got.Equal(want) {
		t.Fatalf("Now() = %s; want %s", got, want)
	}
}

func TestPayloadRoundTrip(t *testing.T) {
	for _, in := range []string{
		`{"a":[1,2,{"b":"c"}],"n":1.5,"s":"é\u0000<>&","nil":null}`,
		`[true,false]`,
		`"just a string"`,
		`-12345678901234`,
		`{"z":1,"a":2}`,
		`{}`,
	} {
		v, err := jsonToBSON(json.RawMessage(in))
		if err != nil {
			t.Fatalf("%s: jsonToBSON: %v", in, err)
		}
		out, err := bsonToJSON(v)
		if err != nil {
			t.Fatalf("%s: bsonToJSON: %v", in, err)
		}
		if string(out) != in {
			t.Errorf("round trip of %s gave %s", in, out)
		}
	}
	if _, err := jsonToBSON(json.RawMessage(`{"a":1} x`)); err == nil {
		t.Error("trailing data accepted")
	}
}

func FuzzPayload(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `[1,2.5,"x",null,true]`, `{"k":{"n":[{}]}}`, `1e400`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if !json.Valid([]byte(in)) {
			return
		}
		v, err := jsonToBSON(json.RawMessage(in))
		if err != nil {
			return // e.g. numbers out of float64 range, nesting too deep
		}
		out, err := bsonToJSON(v)
		if err != nil {
			t.Fatalf("bsonToJSON after jsonToBSON(%q): %v", in, err)
		}
		var a, b any
		if err := json.Unmarshal([]byte(in), &a); err != nil {
			return // valid JSON that Go cannot hold (e.g. a huge number)
		}
		if err := json.Unmarshal(out, &b); err != nil {
			t.Fatalf("%q came back as invalid JSON %q: %v", in, out, err)
		}
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%q came back as %q", in, out)
		}
	})
}

// version leads the stored document and trails every $set (see versionFirst).
func TestVersionOrder(t *testing.T) {
	_, raw := sampleTask(t)
	var d bson.D
	if err := bson.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	first := versionFirst(d)
	if first[0].Key != "_id" || first[1].Key != "version" || len(first) != len(d) {
		t.Fatalf("versionFirst: keys start %s, %s", first[0].Key, first[1].Key)
	}
	last := versionLast(first)
	if last[len(last)-1].Key != "version" || len(last) != len(d) {
		t.Fatalf("versionLast: last key %s", last[len(last)-1].Key)
	}
}

// judge's cases: which statements of a batch applied, from n matched and
// the tokens stored afterwards.
func TestJudgeBatch(t *testing.T) {
	batch := []*updReq{{key: "a", version: 1}, {key: "b", version: 1}, {key: "c", version: 1}}
	tokens := []string{"ta", "tb", "tc"}
	rest := []int{0, 1, 2}
	for _, tc := range []struct {
		name    string
		matched int64
		stored  map[string]string
		want    []error // nil entries: applied
	}{
		{"confirmed and refused", 1, map[string]string{"a": "ta", "b": "old", "c": "old"},
			[]error{nil, task.ErrConflict, task.ErrConflict}},
		{"missing key", 2, map[string]string{"a": "ta", "b": "tb"},
			[]error{nil, nil, task.ErrNotFound}},
		// b and c applied, then were written again (their tokens replaced)
		// before the find: all unsure ones applied.
		{"all rewritten", 3, map[string]string{"a": "ta", "b": "later", "c": "later"},
			[]error{nil, nil, nil}},
		// One of b and c applied and was rewritten: which one is unknown.
		{"ambiguous", 2, map[string]string{"a": "ta", "b": "later", "c": "later"},
			[]error{nil, errOutcomeUnknown, errOutcomeUnknown}},
		// An applied statement whose document was then deleted.
		{"deleted after applying", 1, map[string]string{},
			[]error{errOutcomeUnknown, errOutcomeUnknown, errOutcomeUnknown}},
		{"none applied", 0, map[string]string{"a": "x", "b": "y"},
			[]error{task.ErrConflict, task.ErrConflict, task.ErrNotFound}},
		{"impossible count", 5, map[string]string{"a": "ta", "b": "x", "c": "y"},
			[]error{nil, errOutcomeUnknown, errOutcomeUnknown}},
	} {
		errs := make([]error, len(batch))
		judge(batch, tokens, rest, tc.matched, tc.stored, errs)
		for i, want := range tc.want {
			if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
				t.Errorf("%s: statement %s: %v; want %v", tc.name, batch[i].key, errs[i], want)
			}
		}
	}
}
