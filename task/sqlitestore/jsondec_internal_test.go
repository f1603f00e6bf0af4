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

// checkParseJSON fails unless parseJSON(doc) is what json.Unmarshal
// decodes into a new Task, or fails where it fails.
func checkParseJSON(t *testing.T, doc []byte) {
	t.Helper()
	want := new(task.Task)
	wantErr := json.Unmarshal(doc, want)
	got, err := parseJSON(doc)
	switch {
	case (err != nil) != (wantErr != nil):
		t.Fatalf("parseJSON(%s): error %v, json.Unmarshal's %v", doc, err, wantErr)
	case err == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("parseJSON(%s)\n got %+v\nwant %+v", doc, got, want)
	}
}

// fast reports whether doc decodes without falling back to json.Unmarshal.
func fast(doc []byte) bool {
	d := jsonDecoder{b: doc}
	return d.task(new(task.Task)) && d.end()
}

func randomTask(rng *rand.Rand, pieces []string) *task.Task {
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
		zone := time.FixedZone("", (rng.IntN(48)-24)*1800)
		if rng.IntN(2) == 0 {
			zone = time.UTC
		}
		return time.Unix(rng.Int64N(1<<34), rng.Int64N(1e9)).In(zone)
	}
	raw := func() json.RawMessage {
		return json.RawMessage([]string{`{}`, `{"a":[1,2.5e3,"x\"y",null,true]}`, `"s"`, `-0.5`, `[]`, `null`, `{"k":{"n":{}}}`}[rng.IntN(7)])
	}
	tk := &task.Task{ID: str(), Key: str(), Kind: str(), Priority: rng.IntN(100) - 50, RunAt: when(), Seq: rng.Int64() - rng.Int64(),
		ConcurrentWorkerCnt: rng.IntN(3), SuccessWorkerCnt: rng.IntN(3), MaxUnexpectedRetries: rng.IntN(5) - 1,
		PingInterval: task.Duration(rng.Int64N(1e12)), WorkerTimeout: task.Duration(-rng.Int64N(1e6)), AttemptsStarted: rng.IntN(9),
		State: task.State(str()), NextClaimAt: when(), Version: rng.Int64N(1000), CreatedAt: when(), UpdatedAt: when(),
		Cancelled: rng.IntN(2) == 0, HistoryDropped: rng.IntN(3), ChangesVersion: rng.Int64N(3)}
	if rng.IntN(2) == 0 {
		tk.Payload = raw()
	}
	worker := func() task.Attempt {
		w := task.Attempt{WorkerID: str(), Instance: str(), State: task.AttemptState(str()), Attempt: rng.IntN(9),
			LeaseUntil: when(), StartedAt: when(), ClaimVersion: rng.Int64N(3), EndedAt: when(), Error: str(), LogDropped: rng.IntN(2), OutputDropped: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			w.Result = raw()
			w.Log = []task.LogLine{{At: when(), Msg: str()}}
		}
		return w
	}
	for range rng.IntN(3) {
		tk.Attempts = append(tk.Attempts, worker())
	}
	for range rng.IntN(2) {
		tk.History = append(tk.History, worker())
	}
	for range rng.IntN(3) {
		c := task.Change{Op: str(), WorkerID: str(), Instance: str(), Attempt: rng.IntN(3), Error: str(), Until: when()}
		if rng.IntN(3) == 0 {
			c.Log = []task.LogLine{{At: when(), Msg: str()}}
		}
		tk.Changes = append(tk.Changes, c)
	}
	if rng.IntN(2) == 0 {
		tk.LockKeys = []string{str(), str()}
	}
	if rng.IntN(2) == 0 {
		tk.SpecificWorkerIDs = []string{str()}
	}
	switch rng.IntN(4) {
	case 0:
		tk.Trace = task.Trace{Traceparent: str(), Tracestate: str()}
	case 1:
		tk.Trace = task.Trace{Tracestate: str()}
	}
	return tk
}

// The documents the store writes take the fast path, and decode as
// json.Unmarshal decodes them; those of awkward strings fall back.
func TestParseJSONMatchesUnmarshal(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	plain := []string{"a", "Z", "0", "-", ":", "é", "€", "😀", " ", "<", "&", "/"}
	awkward := append(plain, "\"", "\\", "\n", "\x00", "\x1f", "\x7f", "\u2028", "\xff", "\xe2\x80")
	fastDocs := 0
	for i := range 2000 {
		pieces := plain
		if i%2 == 1 {
			pieces = awkward
		}
		tk := randomTask(rng, pieces)
		doc, err := appendJSON(nil, tk)
		if err != nil {
			t.Fatal(err)
		}
		checkParseJSON(t, doc)
		if fast(doc) {
			fastDocs++
		} else if i%2 == 0 {
			t.Fatalf("a document of plain strings fell back to json.Unmarshal: %s", doc)
		}
		std, err := json.Marshal(tk) // HTML-escaped: falls back, same result
		if err != nil {
			t.Fatal(err)
		}
		checkParseJSON(t, std)
		for range 3 {
			checkParseJSON(t, mutate(rng, doc))
		}
	}
	if fastDocs < 1000 {
		t.Fatalf("%d of 2000 documents took the fast path", fastDocs)
	}
}

// mutate changes one thing in doc that the fast path does not expect,
// or breaks it.
func mutate(rng *rand.Rand, doc []byte) []byte {
	d := bytes.Clone(doc)
	at := rng.IntN(len(d))
	switch rng.IntN(10) {
	case 0:
		return d[:at]
	case 1: // white space
		return append(d[:at:at], append([]byte(" "), doc[at:]...)...)
	case 2: // a key in other case
		return bytes.Replace(d, []byte(`"key"`), []byte(`"KEY"`), 1)
	case 3: // null for a value
		return bytes.Replace(d, []byte(`"workers":[`), []byte(`"workers":null,"x":[`), 1)
	case 4: // a fraction, an exponent, a leading zero, a lone minus
		return bytes.Replace(d, []byte(`"priority":`), []byte([]string{`"priority":1.0,"p":`, `"priority":1e2,"p":`, `"priority":01,"p":`, `"priority":-,"p":`}[rng.IntN(4)]), 1)
	case 5: // an unknown field
		return bytes.Replace(d, []byte(`{"key"`), []byte(`{"unknown":[{}],"key"`), 1)
	case 6: // a duplicate field
		return bytes.Replace(d, []byte(`,"state":`), []byte(`,"state":"x","state":`), 1)
	case 7: // a random byte
		d[at] = byte(rng.IntN(256))
		return d
	case 8: // an escaped string
		return bytes.Replace(d, []byte(`"kind":"`), []byte(`"kind":"\u0041`), 1)
	default: // a number where a string is written, and the reverse
		return bytes.Replace(d, []byte(`"ping_interval":"`), []byte(`"ping_interval":5,"q":"`), 1)
	}
}

func FuzzParseJSON(f *testing.F) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		doc, _ := appendJSON(nil, randomTask(rng, []string{"a", "é", "\"", "\\u0041"}))
		f.Add(doc)
	}
	f.Add([]byte(`{"workers":[],"lock_keys":[],"changes":[]}`))
	f.Add([]byte(`{"payload":{"a":"}"},"seq":-0}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkParseJSON(t, doc)
	})
}

func BenchmarkParseJSON(b *testing.B) {
	t0 := time.Date(2026, 11, 25, 2, 4, 35, 814478741, time.UTC)
	tk, err := task.NewTask(task.PublishParams{Key: "t101", Kind: "noop", Payload: json.RawMessage(`{}`)}, t0)
	if err != nil {
		b.Fatal(err)
	}
	tk.Seq = 101
	tk.Claim(task.Holder{WorkerID: "w1", Instance: "0606a007d74551b5"}, t0)
	doc, err := appendJSON(nil, tk)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("ParseJSON", func(b *testing.B) {
		for b.Loop() {
			if _, err := parseJSON(doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		for b.Loop() {
			if err := json.Unmarshal(doc, new(task.Task)); err != nil {
				b.Fatal(err)
			}
		}
	})
}
