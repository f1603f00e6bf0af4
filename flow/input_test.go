package flow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func deepJSON(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// chainFile is a flow of n steps, each needing the one before, and the
// first needing the last: a cycle as long as the flow.
func chainFile(n int) string {
	var b strings.Builder
	b.WriteString(`{"key":"f","steps":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"s%d","kind":"k","needs":["s%d"]}`, i, (i+n-1)%n)
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestSpecRefusesHostileInput: what a flow file may not carry, refused by
// ParseSpec or Validate with the field named, before anything is written.
func TestSpecRefusesHostileInput(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	for _, tt := range []struct{ file, want string }{
		{`{"key":"leasepool:x","steps":[{"name":"a","kind":"k"}]}`,
			`invalid: key: "leasepool:x" is reserved (the leasepool: prefix is leasepool's own)`},
		{`{"key":"leasepool:flow:x","steps":[{"name":"a","kind":"k"}]}`,
			`invalid: key: "leasepool:flow:x" is reserved (the leasepool: prefix is leasepool's own)`},
		{`{"key":"f","params":{"p":` + deepJSON(64) + `},"steps":[{"name":"a","kind":"k"}]}`,
			"invalid: params: nested deeper than 64 levels"},
		{`{"key":"f","steps":[{"name":"a","kind":"k","payload":` + deepJSON(65) + `}]}`,
			"invalid: steps[0].payload: nested deeper than 64 levels"},
		{`{"key":"f","steps":[{"name":"a","kind":"k","rollback":{"kind":"k","payload":` + deepJSON(65) + `}}]}`,
			"invalid: steps[0].rollback.payload: nested deeper than 64 levels"},
		{`{"key":"f","steps":[{"name":"a","kind":"k","payload":` + deepJSON(10000) + `}]}`,
			"invalid: steps: nested deeper than 64 levels"},
		{"{\"key\":\"f\xff\",\"steps\":[{\"name\":\"a\",\"kind\":\"k\"}]}", "invalid: key: is not valid UTF-8"},
		{"{\"key\":\"f\",\"steps\":[{\"name\":\"a\xc3\",\"kind\":\"k\"}]}", "invalid: steps: is not valid UTF-8"},
	} {
		spec, err := ParseSpec(strings.NewReader(tt.file))
		if err == nil {
			err = spec.Validate()
		}
		if !errors.Is(err, task.ErrInvalid) || err.Error() != tt.want {
			t.Errorf("%.60s: %v; want %q", tt.file, err, tt.want)
		}
	}
	// Through Publish too, which validates before it writes.
	_, _, err := Publish(t.Context(), s, Spec{Key: "leasepool:x", Steps: []Step{{Name: "a", Action: Action{Kind: "k"}}}})
	if !errors.Is(err, task.ErrInvalid) {
		t.Fatalf("Publish with a reserved key: %v; want ErrInvalid", err)
	}
	if all, err := s.List(t.Context(), task.ListQuery{Reserved: true}); err != nil || len(all) != 0 {
		t.Fatalf("store after refused flows: %d documents (%v); want none", len(all), err)
	}
}

// TestDeepestFlowRuns: a flow at every bound (parameters and payloads
// nested task.MaxJSONDepth deep) is stored and its step task published,
// though the step's envelope wraps them a level or two deeper.
func TestDeepestFlowRuns(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	file := `{"key":"deep","params":{"p":` + deepJSON(task.MaxJSONDepth-1) + `},"steps":[` +
		`{"name":"a","kind":"k","payload":` + deepJSON(task.MaxJSONDepth) + `,"rollback":{"kind":"k","payload":` + deepJSON(task.MaxJSONDepth) + `}}]}`
	spec, err := ParseSpec(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := Publish(t.Context(), s, spec)
	if err != nil {
		t.Fatalf("Publish the deepest flow: %v", err)
	}
	if _, err := s.Get(t.Context(), f.Progress[0].Do.Task); err != nil {
		t.Fatalf("the first step's task %s: %v", f.Progress[0].Do.Task, err)
	}
}

// TestListSkipsMalformedDocuments: a flow document that does not decode
// is skipped (and counted) by List and the reconciler, never their error.
func TestListSkipsMalformedDocuments(t *testing.T) {
	t.Parallel()
	s := openStore(t)
	ctx := t.Context()
	if _, _, err := Publish(ctx, s, Spec{Key: "good", Steps: threeSteps()}); err != nil {
		t.Fatal(err)
	}
	for key, payload := range map[string]string{
		"bad-type":     `{"steps":7}`,
		"bad-progress": `{"key":"x","steps":[{"name":"a","kind":"k"}],"progress":[]}`,
		"not-object":   `[1,2]`,
	} {
		_, err := s.PutDocument(task.WithInternalWrite(ctx), task.Document{Namespace: Namespace, ID: key, Value: json.RawMessage(payload)})
		if err != nil {
			t.Fatal(err)
		}
	}
	before := task.MalformedCounts()[Namespace]
	for _, q := range []ListQuery{{}, {Active: true}} {
		fs, err := List(ctx, s, q)
		if err != nil || len(fs) != 1 || fs[0].Key != "good" {
			t.Fatalf("List(%+v) = %d flows, %v; want good only", q, len(fs), err)
		}
	}
	if _, err := Reconcile(ctx, s, nil); err != nil {
		t.Fatalf("Reconcile over malformed documents: %v", err)
	}
	// Counted once each in the process, whichever test read them first.
	if n := task.MalformedCounts()[Namespace]; n < 3 || n-before > 3 {
		t.Errorf("MalformedCounts()[%s] = %d (was %d); want the three documents, each once", Namespace, n, before)
	}
}

// FuzzFlowFile: whatever a flow file holds, ParseSpec and Validate never
// panic and refuse with task.ErrInvalid; a spec they accept publishes
// (under a fresh key) and reads back equal.
func FuzzFlowFile(f *testing.F) {
	for _, seed := range []string{
		`{"key":"db-1","params":{"cpu":4},"steps":[{"name":"check","kind":"noop","rollback":{"kind":"noop"}},{"name":"init","kind":"noop","timeout":"1s","retries":2,"lock_keys":["device:1"],"priority":3}]}`,
		`{"key":"leasepool:flow:x","steps":[{"name":"a","kind":"k"}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","lock_keys":["rate:x#0"]}]}`,
		`{"key":"f","params":{"p":` + deepJSON(70) + `},"steps":[{"name":"a","kind":"k"}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","payload":` + deepJSON(1001) + `}]}`,
		"{\"key\":\"f\xff\",\"steps\":[{\"name\":\"a\",\"kind\":\"k\"}]}",
		`{"key":"f","steps":[{"name":"a","kind":"k","payload":{"s":"\"[[[\\"}}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","timeout":"-1s"}]}`,
		`{"key":"f","steps":[]}`, `{}`, `[]`, `null`, ``, `{"key":"f"}{"key":"g"}`,
		// DAGs, signals and timers, and what they may not be.
		`{"key":"f","steps":[{"name":"a","kind":"k"},{"name":"b","kind":"k","needs":["a"]},{"name":"c","kind":"k","needs":["a"]},{"name":"d","kind":"k","needs":["b","c"]}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","needs":["b"]},{"name":"b","kind":"k","needs":["a"]}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","needs":["a"]}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","needs":["zz","a"]}]}`,
		`{"key":"f","steps":[{"name":"a","type":"teleport"}]}`,
		`{"key":"f","steps":[{"name":"a","sleep":"-5m"}]}`,
		`{"key":"f","steps":[{"name":"a","sleep":"10m"},{"name":"b","until":"2100-01-01T00:00:00+01:00"}]}`,
		`{"key":"f","steps":[{"name":"a","until":"1999-12-31T23:59:59Z"}]}`,
		`{"key":"f","steps":[{"name":"a","until":"2200-01-02T00:00:00Z"}]}`,
		`{"key":"f","steps":[{"name":"a","until":"99999-01-01T00:00:00Z"}]}`,
		`{"key":"f","steps":[{"name":"ok","type":"signal","timeout":"24h","default":{"approved":false}},{"name":"b","kind":"k","needs":["ok"]}]}`,
		`{"key":"f","steps":[{"name":"ok","type":"signal","default":1}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k"},{"name":"b","kind":"k"},{"name":"all","kind":"k","needs":["a","b"],"max_failed_needs":1}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k"},{"name":"b","kind":"k","needs":["a"],"max_failed_needs":-1}]}`,
		`{"key":"f","steps":[{"name":"a","kind":"k","max_failed_needs":3}]}`,
		chainFile(100), chainFile(10000),
	} {
		f.Add([]byte(seed))
	}
	s := openStore(f)
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, b []byte) {
		spec, err := ParseSpec(bytes.NewReader(b))
		if err == nil {
			err = spec.Validate()
		}
		if err != nil {
			if !errors.Is(err, task.ErrInvalid) {
				t.Fatalf("refused without task.ErrInvalid: %v", err)
			}
			return
		}
		spec.Key = fmt.Sprintf("fuzz-%d", n.Add(1))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		fl, res, err := Publish(ctx, s, spec)
		if err != nil || res != task.Inserted {
			t.Fatalf("Publish of a valid spec: %v %v", res, err)
		}
		got, err := Get(ctx, s, fl.Key)
		if err != nil {
			t.Fatalf("Get %s: %v", fl.Key, err)
		}
		want, _ := json.Marshal(spec.Steps)
		have, _ := json.Marshal(got.Steps)
		if !bytes.Equal(want, have) {
			t.Fatalf("steps read back differ:\n got %s\nwant %s", have, want)
		}
		params := map[string]json.RawMessage{}
		if len(spec.Params) > 0 {
			if err := json.Unmarshal(spec.Params, &params); err != nil {
				t.Fatal(err)
			}
		}
		want, _ = json.Marshal(params)
		have, _ = json.Marshal(got.Params)
		if !bytes.Equal(want, have) {
			t.Fatalf("params read back differ:\n got %s\nwant %s", have, want)
		}
		if _, err := List(ctx, s, ListQuery{Limit: 1}); err != nil {
			t.Fatalf("List after publishing %s: %v", fl.Key, err)
		}
	})
}
