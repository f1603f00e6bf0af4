package task_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

func deep(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// TestValidateRefusesHostileInput: every check a caller's publish meets,
// with the one-line error naming the field.
// notInPath ends the error of a key no URL path can name.
const notInPath = ` (no leading "/", "//", or "." or ".." between slashes)`

func TestPathNameable(t *testing.T) {
	for key, want := range map[string]bool{
		"a": true, "a/b": true, "a/": true, "flow/1/step/do": true, "a.b": true, "...": true,
		"/": false, "/a": false, "a//b": false, ".": false, "..": false, "a/.": false, "./a": false, "a/../b": false,
	} {
		if got := task.PathNameable(key); got != want {
			t.Errorf("PathNameable(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestValidateRefusesHostileInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(p *task.PublishParams)
		want string
	}{
		{"reserved key", func(p *task.PublishParams) { p.Key = "leasepool:control" },
			`invalid: key: "leasepool:control" is reserved (the leasepool: prefix is leasepool's own)`},
		{"reserved flow key", func(p *task.PublishParams) { p.Key = "leasepool:flow:x" },
			`invalid: key: "leasepool:flow:x" is reserved (the leasepool: prefix is leasepool's own)`},
		{"dot key", func(p *task.PublishParams) { p.Key = "." }, `invalid: key: "." cannot be named in a URL path` + notInPath},
		{"dot-dot key", func(p *task.PublishParams) { p.Key = ".." }, `invalid: key: ".." cannot be named in a URL path` + notInPath},
		{"slash key", func(p *task.PublishParams) { p.Key = "/" }, `invalid: key: "/" cannot be named in a URL path` + notInPath},
		{"leading slash", func(p *task.PublishParams) { p.Key = "/a" }, `invalid: key: "/a" cannot be named in a URL path` + notInPath},
		{"double slash", func(p *task.PublishParams) { p.Key = "a//b" }, `invalid: key: "a//b" cannot be named in a URL path` + notInPath},
		{"dot segment", func(p *task.PublishParams) { p.Key = "a/./b" }, `invalid: key: "a/./b" cannot be named in a URL path` + notInPath},
		{"dot-dot segment", func(p *task.PublishParams) { p.Key = "a/.." }, `invalid: key: "a/.." cannot be named in a URL path` + notInPath},
		{"payload 65 deep", func(p *task.PublishParams) { p.Payload = json.RawMessage(deep(65)) },
			"invalid: payload: nested deeper than 64 levels"},
		{"payload 10,000 deep", func(p *task.PublishParams) { p.Payload = json.RawMessage(deep(10000)) },
			"invalid: payload: nested deeper than 64 levels"},
		{"payload not UTF-8", func(p *task.PublishParams) { p.Payload = json.RawMessage("\"\xff\"") },
			"invalid: payload: is not valid UTF-8"},
		{"key not UTF-8", func(p *task.PublishParams) { p.Key = "a\xffb" }, `invalid: key: "a\xffb" is not valid UTF-8`},
		{"run_at 9999", func(p *task.PublishParams) { p.RunAt = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) },
			"invalid: run_at: 9999-01-01T00:00:00Z is outside 2000-01-01 .. 2200-01-01"},
		{"run_at 1999", func(p *task.PublishParams) { p.RunAt = time.Date(1999, 12, 31, 23, 0, 0, 0, time.UTC) },
			"invalid: run_at: 1999-12-31T23:00:00Z is outside 2000-01-01 .. 2200-01-01"},
	}
	for _, tt := range tests {
		p := valid()
		tt.edit(&p)
		err := p.Validate()
		if !errors.Is(err, task.ErrInvalid) || err.Error() != tt.want {
			t.Errorf("%s: Validate() = %v; want %q", tt.name, err, tt.want)
		}
		if _, err2 := task.NewTask(p, t0); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%s: NewTask: %v; want Validate's error", tt.name, err2)
		}
	}
	for _, ok := range []func(p *task.PublishParams){
		func(p *task.PublishParams) { p.Key = "leasepool" },
		func(p *task.PublishParams) { p.Key = "x:leasepool:y" },
		func(p *task.PublishParams) { p.LockKeys = []string{"ratelimit", "device:rate:1"} },
		// Named like leasepool's own locks, which live in namespaces of their own.
		func(p *task.PublishParams) {
			p.LockKeys = []string{"rate:lock:device:1#3", "leasepool.retention", "mqtt-broker:127.0.0.1:1883"}
		},
		func(p *task.PublishParams) { p.Payload = json.RawMessage(`{"s":"[[[[{{{{\"","a":` + deep(63) + `}`) },
		func(p *task.PublishParams) { p.RunAt = task.MinTime },
		func(p *task.PublishParams) { p.RunAt = task.MaxTime },
	} {
		p := valid()
		ok(&p)
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v; want accepted at the bounds", p, err)
		}
	}
}

// TestResultDepth: a handler's result is held to the same limit.
func TestResultDepth(t *testing.T) {
	t.Parallel()
	if err := task.ValidateResult(json.RawMessage(deep(task.MaxJSONDepth))); err != nil {
		t.Errorf("ValidateResult %d deep: %v", task.MaxJSONDepth, err)
	}
	err := task.ValidateResult(json.RawMessage(deep(1001)))
	if want := "invalid: result: nested deeper than 64 levels"; err == nil || err.Error() != want {
		t.Errorf("ValidateResult 1,001 deep: %v; want %q", err, want)
	}
}

// TestSnoozeAndRetryAreBounded: a handler asking for a far-future snooze or
// retry gets MaxTime, never a time the stores cannot order.
func TestSnoozeAndRetryAreBounded(t *testing.T) {
	t.Parallel()
	far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	tk := doc(t, nil, running("a", 1, t0.Add(time.Minute)))
	if err := tk.Snooze(task.Holder{TaskKey: tk.Key, WorkerID: "a", Attempt: 1}, far, t0); err != nil {
		t.Fatal(err)
	}
	if !tk.RunAt.Equal(task.MaxTime) || !tk.NextClaimAt.Equal(task.MaxTime) {
		t.Errorf("Snooze to %d: run_at %s, next_claim_at %s; want %s", far.Year(), tk.RunAt, tk.NextClaimAt, task.MaxTime)
	}
	tk = doc(t, nil, running("a", 1, t0.Add(time.Minute)))
	if err := tk.Fail(task.Holder{TaskKey: tk.Key, WorkerID: "a", Attempt: 1}, "boom", far, t0); err != nil {
		t.Fatal(err)
	}
	if tk.RunAt.After(task.MaxTime) {
		t.Errorf("Fail with retry at %d: run_at %s; want at most %s", far.Year(), tk.RunAt, task.MaxTime)
	}
}

// TestSkipMalformedCountsOnce: a reader reporting the same document on
// every read logs and counts it once.
func TestSkipMalformedCountsOnce(t *testing.T) {
	t.Parallel()
	const kind = "test.malformed-once"
	for range 3 {
		task.SkipMalformed(kind, "doc@1", errors.New("bad"))
	}
	task.SkipMalformed(kind, "doc@2", errors.New("bad again"))
	if n := task.MalformedCounts()[kind]; n != 2 {
		t.Errorf("MalformedCounts()[%s] = %d; want 2 (two versions, each once)", kind, n)
	}
}
