package sqlitestore

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// marshalStd is what appendJSON must write: json.Marshal without HTML
// escaping.
func marshalStd(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func checkAppendJSON(t *testing.T, tk *task.Task) {
	t.Helper()
	want := marshalStd(t, tk)
	got, err := appendJSON([]byte("prefix"), tk)
	if err != nil {
		t.Fatalf("appendJSON: %v", err)
	}
	if !bytes.HasPrefix(got, []byte("prefix")) || !bytes.Equal(got[len("prefix"):], want) {
		t.Fatalf("appendJSON wrote\n%s\njson.Marshal writes\n%s", got, want)
	}
}

const awkward = "a<b>&c\"q\\s\n\r\t\b\f\x00\x1f\x7f \u2028\u2029 \xff\xfe ü€µ😀 /"

func TestAppendJSONMatchesMarshal(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 24, 17, 10, 45, 123456789, time.UTC)
	east := time.FixedZone("east", 5*3600+30*60)
	full := &task.Task{
		ID: "42", Key: "k" + awkward, Kind: "kind" + awkward, Payload: json.RawMessage(" { \"a\" : [1, 2, \"<x>\"] } "),
		Trace:    task.Trace{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "v=" + awkward},
		Priority: -7, RunAt: t0, Seq: 1 << 40, SpecificWorkerIDs: []string{"w1", awkward},
		ConcurrentWorkerCnt: 2, SuccessWorkerCnt: 3, MaxUnexpectedRetries: -1,
		PingInterval: task.Duration(1500 * time.Millisecond), WorkerTimeout: task.Duration(3 * time.Microsecond),
		LockKeys: []string{"device:1", "rate:x#2"},
		Group:    "acme",
		Attempts: []task.Attempt{
			{WorkerID: "w1", Instance: "i1", State: task.AttemptRunning, Attempt: 3, LeaseUntil: t0.Add(time.Second), StartedAt: t0, ClaimVersion: 17},
			{WorkerID: "w2", State: task.AttemptFail, Attempt: 2, LeaseUntil: t0.In(east), StartedAt: t0.Add(-time.Hour), ClaimVersion: 9, EndedAt: t0.Add(-time.Minute),
				Error: "boom" + awkward, Result: json.RawMessage(`{"r": true}`), Log: []task.LogLine{{At: t0, Msg: awkward}, {At: t0.Add(time.Nanosecond), Msg: ""}},
				LogDropped: 4, OutputDropped: true, Slots: []string{"group:acme#1"}},
		},
		AttemptsStarted: 3,
		History:         []task.Attempt{{WorkerID: "w0", State: "SNOOZED", Attempt: 1, StartedAt: t0.Add(-2 * time.Hour), EndedAt: t0.Add(-90 * time.Minute)}},
		HistoryDropped:  9, Cancelled: true, State: task.StateRunning, NextClaimAt: t0.Add(4 * time.Second),
		Version: 17, CreatedAt: time.Time{}, UpdatedAt: t0.Truncate(time.Second),
		ChangesVersion: 17,
		Changes:        []task.Change{{Op: "claimed", WorkerID: "w1", Instance: "i1", Attempt: 3, Until: t0}, {Op: "logged", Log: []task.LogLine{{At: t0, Msg: "m"}}, Error: "e"}},
	}
	// A field added to these types must be set here, so that the
	// comparison shows whether appendJSON writes it.
	everyFieldSet(t, full)
	everyFieldSet(t, full.Attempts[0], full.Attempts[1])
	everyFieldSet(t, full.Changes[0], full.Changes[1])
	checkAppendJSON(t, full)
	checkAppendJSON(t, &task.Task{})
	checkAppendJSON(t, &task.Task{Attempts: []task.Attempt{}, SpecificWorkerIDs: []string{}, Payload: json.RawMessage{}})
	tk, err := task.NewTask(task.PublishParams{Key: "plain", Kind: "noop"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	checkAppendJSON(t, tk)
}

// everyFieldSet fails unless each field of the struct type of vs is set
// in at least one of them.
func everyFieldSet(t *testing.T, vs ...any) {
	t.Helper()
	typ := reflect.Indirect(reflect.ValueOf(vs[0])).Type()
	for i := range typ.NumField() {
		set := false
		for _, v := range vs {
			set = set || !reflect.Indirect(reflect.ValueOf(v)).Field(i).IsZero()
		}
		if !set && typ.Field(i).Name != "CreatedAt" { // the zero time is a case of its own
			t.Errorf("the fixture leaves %s.%s unset: set it, so appendJSON is checked on it", typ.Name(), typ.Field(i).Name)
		}
	}
}

// Random documents, strings of random bytes and runes included.
func TestAppendJSONRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	pieces := []string{"a", "Z", "<", "&", "\"", "\\", "\n", "\x00", "\x1f", "\x7f", "\u2028", "\xff", "\xe2\x80", "é", "€", "😀", " "}
	str := func() string {
		var b strings.Builder
		for range rng.IntN(8) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		return b.String()
	}
	when := func() time.Time {
		if rng.IntN(4) == 0 {
			return time.Time{}
		}
		zone := time.FixedZone("z", (rng.IntN(48)-24)*1800)
		return time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)).In(zone)
	}
	for range 500 {
		tk := &task.Task{Key: str(), Kind: str(), Priority: rng.IntN(100) - 50, RunAt: when(), Seq: rng.Int64(),
			PingInterval: task.Duration(rng.Int64N(1e12)), WorkerTimeout: task.Duration(-rng.Int64N(1e6)),
			State: task.State(str()), NextClaimAt: when(), Version: rng.Int64N(1000), CreatedAt: when(), UpdatedAt: when(), Cancelled: rng.IntN(2) == 0}
		for range rng.IntN(3) {
			tk.Attempts = append(tk.Attempts, task.Attempt{WorkerID: str(), Instance: str(), State: task.AttemptState(str()), Attempt: rng.IntN(9),
				LeaseUntil: when(), StartedAt: when(), EndedAt: when(), Error: str(), Log: []task.LogLine{{At: when(), Msg: str()}}})
		}
		for range rng.IntN(3) {
			tk.Changes = append(tk.Changes, task.Change{Op: str(), WorkerID: str(), Attempt: rng.IntN(3), Error: str(), Until: when()})
		}
		if rng.IntN(2) == 0 {
			tk.LockKeys = []string{str(), str()}
		}
		if rng.IntN(2) == 0 {
			tk.Trace = task.Trace{Traceparent: str(), Tracestate: str()}
		}
		checkAppendJSON(t, tk)
	}
}

func TestAppendJSONRefusesWhatMarshalRefuses(t *testing.T) {
	t.Parallel()
	for name, tk := range map[string]*task.Task{
		"year 10000":       {RunAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"negative year":    {Attempts: []task.Attempt{{StartedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}}},
		"result not json":  {Attempts: []task.Attempt{{Result: json.RawMessage(`{"a":`)}}},
		"payload not json": {Payload: json.RawMessage(`nope`)},
	} {
		if _, err := json.Marshal(tk); err == nil {
			t.Fatalf("%s: json.Marshal accepts it; the case is wrong", name)
		}
		if b, err := appendJSON(nil, tk); err == nil {
			t.Errorf("%s: appendJSON wrote %s; want an error as json.Marshal gives", name, b)
		}
	}
}
