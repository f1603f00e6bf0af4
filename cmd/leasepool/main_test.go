package main

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

func TestMain(m *testing.M) {
	// tuneGC's follower of the live heap runs for the process's life.
	goleak.VerifyTestMain(m, append(testutil.PahoShutdownGoroutines(),
		goleak.IgnoreTopFunction("github.com/leasepool/leasepool/cmd/leasepool.followLiveHeap"))...)
}

// harness runs the leasepool CLI as main does, against one store.
type harness struct {
	t     *testing.T
	store string // --store value
	path  string // the store file
}

// setup returns a CLI on a fresh store file in t.TempDir() (not created yet).
func setup(t *testing.T) *harness {
	t.Helper()
	path := filepath.Join(t.TempDir(), "x.db")
	return &harness{t: t, store: "sqlite:" + path, path: path}
}

// run runs leasepool --store STORE args... and returns its stdout.
func (c *harness) run(args ...string) (string, error) {
	c.t.Helper()
	return runArgs(c.t, append([]string{"--store", c.store}, args...)...)
}

// runMu serialises app runs: urfave/cli v2 mutates its package-level
// HelpFlag while parsing, so two apps cannot parse at once in one process
// (the binary runs one). Tests still run their setup in parallel.
var runMu sync.Mutex

func runArgs(t *testing.T, args ...string) (string, error) {
	t.Helper()
	// The app installs a process-wide slog default writing to its stderr,
	// and parallel tests' stores may log through another test's writer.
	var stdout, stderr testutil.SyncBuffer
	app := newApp(&stdout, &stderr)
	runMu.Lock()
	err := app.RunContext(t.Context(), interspersed(app, append([]string{"leasepool"}, args...)))
	runMu.Unlock()
	if s := stderr.String(); s != "" {
		t.Logf("stderr of %v:\n%s", args, s)
	}
	return stdout.String(), err
}

// must runs args and fails the test on error.
func (c *harness) must(args ...string) string {
	c.t.Helper()
	out, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("leasepool %v: %v", args, err)
	}
	return out
}

func (c *harness) show(key string) map[string]json.RawMessage {
	c.t.Helper()
	var m map[string]json.RawMessage
	out := c.must("show", key, "--json")
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		c.t.Fatalf("show --json: %v\n%s", err, out)
	}
	return m
}

func (c *harness) state(key string) string {
	c.t.Helper()
	var s string
	if err := json.Unmarshal(c.show(key)["state"], &s); err != nil {
		c.t.Fatal(err)
	}
	return s
}

func TestPublishLsShowCancelRetry(t *testing.T) {
	t.Parallel()
	c := setup(t)

	// The key comes before the flags: interspersed reorders.
	if out := c.must("publish", "a1", "--kind", "noop", "--priority", "3"); !strings.Contains(out, "inserted a1 (pending") {
		t.Errorf("publish = %q", out)
	}
	if out := c.must("publish", "--kind", "sleep", "--payload", `{"duration":"1s"}`, "b2"); !strings.Contains(out, "inserted b2") {
		t.Errorf("publish = %q", out)
	}
	if out := c.must("publish", "a1", "--kind", "noop"); !strings.Contains(out, "existing a1") {
		t.Errorf("second publish = %q, want existing", out)
	}

	out := c.must("ls")
	if !strings.Contains(out, "KEY") || !strings.Contains(out, "a1") || !strings.Contains(out, "b2") {
		t.Errorf("ls = %q", out)
	}
	if strings.Index(out, "a1") > strings.Index(out, "b2") {
		t.Errorf("ls not in publish order:\n%s", out)
	}
	if out := c.must("ls", "--kind", "sleep"); strings.Contains(out, "a1") || !strings.Contains(out, "b2") {
		t.Errorf("ls --kind sleep = %q", out)
	}

	out = c.must("show", "a1")
	for _, want := range []string{"key", "a1", "noop", "pending", "priority", "3", "worker_timeout", "4s"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}

	if out := c.must("cancel", "a1"); !strings.Contains(out, "cancelled a1") {
		t.Errorf("cancel = %q", out)
	}
	if st := c.state("a1"); st != "cancelled" {
		t.Errorf("state after cancel = %s", st)
	}
	if _, err := c.run("cancel", "a1"); !errors.Is(err, task.ErrFinished) {
		t.Errorf("second cancel = %v, want ErrFinished", err)
	}
	if out := c.must("ls", "--state", "cancelled"); !strings.Contains(out, "a1") || strings.Contains(out, "b2") {
		t.Errorf("ls --state cancelled = %q", out)
	}

	if out := c.must("retry", "a1"); !strings.Contains(out, "retrying a1 (pending)") {
		t.Errorf("retry = %q", out)
	}
	if _, err := c.run("retry", "a1"); !errors.Is(err, task.ErrNotFinished) {
		t.Errorf("retry of pending = %v, want ErrNotFinished", err)
	}
	if out := c.must("ls", "--state", "cancelled"); strings.Contains(out, "a1") {
		t.Errorf("ls --state cancelled after retry = %q", out)
	}

	// publish --rerun resets a finished task.
	c.must("cancel", "b2")
	if out := c.must("publish", "b2", "--kind", "sleep", "--rerun"); !strings.Contains(out, "rerun b2 (pending") {
		t.Errorf("publish --rerun = %q", out)
	}

	if _, err := c.run("show", "nope"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("show of a missing key = %v, want ErrNotFound", err)
	}
	if _, err := c.run("cancel", "nope"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("cancel of a missing key = %v, want ErrNotFound", err)
	}
}

var designFields = []string{"key", "kind", "payload", "priority", "run_at", "specific_worker_ids",
	"concurrent_worker_cnt", "success_worker_cnt", "max_unexpected_retries", "ping_interval",
	"worker_timeout", "lock_keys", "workers", "state", "next_claim_at", "version"}

func TestJSONFieldNames(t *testing.T) {
	t.Parallel()
	c := setup(t)
	before := time.Now()
	c.must("publish", "dev/1", "--kind", "exec", "--payload", `{"argv":["true"]}`, "--pin", "w1,w2", "--lock", "device:1",
		"--workers", "2", "--successes", "2", "--retries", "0", "--ping", "2s", "--timeout", "9s", "--delay", "1h", "--priority", "-4")

	var list []map[string]json.RawMessage
	out := c.must("ls", "--json")
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 {
		t.Fatalf("ls --json = %v, %s", err, out)
	}
	shown := c.show("dev/1")
	for name, m := range map[string]map[string]json.RawMessage{"ls": list[0], "show": shown} {
		for _, f := range designFields {
			if _, ok := m[f]; !ok {
				t.Errorf("%s --json lacks %q:\n%s", name, f, out)
			}
		}
	}
	var got struct {
		Key                  string         `json:"key"`
		Kind                 string         `json:"kind"`
		Payload              any            `json:"payload"`
		Priority             int            `json:"priority"`
		RunAt                time.Time      `json:"run_at"`
		SpecificWorkerIDs    []string       `json:"specific_worker_ids"`
		ConcurrentWorkerCnt  int            `json:"concurrent_worker_cnt"`
		SuccessWorkerCnt     int            `json:"success_worker_cnt"`
		MaxUnexpectedRetries int            `json:"max_unexpected_retries"`
		PingInterval         string         `json:"ping_interval"`
		WorkerTimeout        string         `json:"worker_timeout"`
		LockKeys             []string       `json:"lock_keys"`
		Workers              []task.Attempt `json:"workers"`
		State                string         `json:"state"`
		NextClaimAt          time.Time      `json:"next_claim_at"`
		Version              int64          `json:"version"`
	}
	b, _ := json.Marshal(shown)
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Key != "dev/1" || got.Kind != "exec" || got.Priority != -4 || got.State != "pending" || got.Version < 1 ||
		!slices.Equal(got.SpecificWorkerIDs, []string{"w1", "w2"}) || !slices.Equal(got.LockKeys, []string{"device:1"}) ||
		got.ConcurrentWorkerCnt != 2 || got.SuccessWorkerCnt != 2 || got.MaxUnexpectedRetries != 0 ||
		got.PingInterval != "2s" || got.WorkerTimeout != "9s" || got.Workers == nil || len(got.Workers) != 0 {
		t.Errorf("show --json = %+v", got)
	}
	if d := got.RunAt.Sub(before); d < time.Hour || d > time.Hour+time.Minute || !got.NextClaimAt.Equal(got.RunAt) {
		t.Errorf("run_at %s next_claim_at %s, want about an hour from %s", got.RunAt, got.NextClaimAt, before)
	}
	if m, ok := got.Payload.(map[string]any); !ok || m["argv"] == nil {
		t.Errorf("payload = %#v, want the JSON object", got.Payload)
	}

	// An empty listing is an empty array, not null.
	if out := c.must("ls", "--json", "--state", "running"); strings.TrimSpace(out) != "[]" {
		t.Errorf("empty ls --json = %q", out)
	}
	// publish --json prints the task document too.
	out = c.must("publish", "dev/1", "--kind", "exec", "--payload", `{"argv":["true"]}`, "--json")
	var pub map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &pub); err != nil || string(pub["key"]) != `"dev/1"` {
		t.Errorf("publish --json = %v %s", err, out)
	}
}

func TestRetriesZeroMeansNone(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "a", "--kind", "noop")
	c.must("publish", "b", "--kind", "noop", "--retries", "0")
	if got := string(c.show("a")["max_unexpected_retries"]); got != "3" {
		t.Errorf("default retries = %s, want 3", got)
	}
	if got := string(c.show("b")["max_unexpected_retries"]); got != "0" {
		t.Errorf("--retries 0 = %s, want 0", got)
	}
}

// dirState lists a directory's files and their contents.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m[e.Name()] = string(b)
	}
	return m
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	garbage := make([]byte, 8192)
	if _, err := rand.Read(garbage); err != nil {
		t.Fatal(err)
	}
	garbage[0] = 'X' // never the SQLite header
	tests := []struct {
		name    string
		corrupt bool // write garbage to the store file first
		args    []string
		names   string // the error must contain this
	}{
		{"kind no live worker runs, strict", false, []string{"publish", "k", "--kind", "bogus", "--strict"}, "kind"},
		{"missing kind", false, []string{"publish", "k"}, "kind"},
		{"payload not JSON", false, []string{"publish", "k", "--kind", "noop", "--payload", "{"}, "--payload"},
		{"exec payload without argv", false, []string{"publish", "k", "--kind", "exec", "--payload", "{}"}, "argv"},
		{"sleep payload unknown field", false, []string{"publish", "k", "--kind", "sleep", "--payload", `{"secs":1}`}, "payload"},
		{"delay zero", false, []string{"publish", "k", "--kind", "noop", "--delay", "0"}, "--delay"},
		{"delay negative", false, []string{"publish", "k", "--kind", "noop", "--delay", "-1m"}, "--delay"},
		{"debounce zero", false, []string{"publish", "k", "--kind", "noop", "--debounce", "0s"}, "--debounce"},
		{"debounce negative", false, []string{"publish", "k", "--kind", "noop", "--debounce", "-5s"}, "--debounce"},
		{"debounce huge", false, []string{"publish", "k", "--kind", "noop", "--debounce", "25h"}, "--debounce"},
		{"ping negative", false, []string{"publish", "k", "--kind", "noop", "--ping", "-1s"}, "--ping"},
		{"ping zero", false, []string{"publish", "k", "--kind", "noop", "--ping", "0s"}, "--ping"},
		{"timeout not above ping", false, []string{"publish", "k", "--kind", "noop", "--ping", "2s", "--timeout", "2s"}, "--timeout"},
		{"timeout not above ping", false, []string{"publish", "k", "--kind", "noop", "--ping", "2s", "--timeout", "2s"}, "--timeout"},
		{"timeout zero", false, []string{"publish", "k", "--kind", "noop", "--timeout", "0s"}, "--timeout"},
		{"workers zero", false, []string{"publish", "k", "--kind", "noop", "--workers", "0"}, "--workers"},
		{"successes zero", false, []string{"publish", "k", "--kind", "noop", "--successes", "0"}, "--successes"},
		{"retries negative", false, []string{"publish", "k", "--kind", "noop", "--retries", "-1"}, "--retries"},
		{"priority not a number", false, []string{"publish", "k", "--kind", "noop", "--priority", "high"}, "priority"},
		{"lock with control char", false, []string{"publish", "k", "--kind", "noop", "--lock", "dev\x01"}, "lock_keys"},
		{"key with control char", false, []string{"publish", "k\n", "--kind", "noop"}, "key"},
		{"no key", false, []string{"publish", "--kind", "noop"}, "KEY"},
		{"two keys", false, []string{"publish", "a", "b", "--kind", "noop"}, "KEY"},
		{"unknown flag", false, []string{"publish", "k", "--kind", "noop", "--bogus"}, "bogus"},
		{"state bogus", false, []string{"ls", "--state", "bogus"}, "--state"},
		{"limit negative", false, []string{"ls", "--limit", "-1"}, "--limit"},
		{"log level bogus", false, []string{"--log-level", "loud", "ls"}, "--log-level"},
		{"show missing store", false, []string{"show", "k"}, "--store"},
		{"ls missing store", false, []string{"ls"}, "--store"},
		{"cancel missing store", false, []string{"cancel", "k"}, "--store"},
		{"retry missing store", false, []string{"retry", "k"}, "--store"},
		{"show without key", false, []string{"show"}, "KEY"},
		{"publish to corrupted store", true, []string{"publish", "k", "--kind", "noop"}, "--store"},
		{"ls corrupted store", true, []string{"ls"}, "--store"},
		{"show corrupted store", true, []string{"show", "k"}, "--store"},
		{"cancel corrupted store", true, []string{"cancel", "k"}, "--store"},
		{"publish to corrupted store with header", true, []string{"publish", "k", "--kind", "noop"}, "--store"},
		{"ls corrupted store with header", true, []string{"ls"}, "--store"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := setup(t)
			if tt.corrupt {
				b := garbage
				if strings.HasSuffix(tt.name, "with header") {
					b = append([]byte("SQLite format 3\x00"), garbage...)
				}
				if err := os.WriteFile(c.path, b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			before := dirState(t, filepath.Dir(c.path))
			out, err := c.run(tt.args...)
			if err == nil {
				t.Fatalf("leasepool %q succeeded: %q", tt.args, out)
			}
			if !strings.Contains(err.Error(), tt.names) {
				t.Errorf("error %q does not name %q", err, tt.names)
			}
			after := dirState(t, filepath.Dir(c.path))
			if len(after) != len(before) {
				t.Errorf("files before %v, after %v", keys(before), keys(after))
			}
			for name, content := range before {
				if after[name] != content {
					t.Errorf("%s changed", name)
				}
			}
		})
	}
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestUnknownStoreScheme(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"foo:x", "x.db", "sqlite:", "postgres://h/db", "sqlite:x?synchronous=off"} {
		_, err := runArgs(t, "--store", store, "publish", "k", "--kind", "noop")
		if err == nil || !strings.Contains(err.Error(), "--store") {
			t.Errorf("--store %s: %v, want an error naming --store", store, err)
		}
	}
	if _, err := os.Stat("x"); err == nil {
		t.Error("--store foo:x created a file")
	}
}

func TestExistingStoreUnchangedByBadInput(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "k", "--kind", "noop")
	v := string(c.show("k")["version"])
	for _, args := range [][]string{
		{"publish", "k", "--kind", "noop", "--workers", "0"},
		{"publish", "k2", "--kind", "bogus", "--strict"},
		{"publish", "k", "--kind", "noop", "--ping", "5s", "--timeout", "1s", "--rerun"},
	} {
		if _, err := c.run(args...); err == nil {
			t.Errorf("%v succeeded", args)
		}
	}
	if got := string(c.show("k")["version"]); got != v {
		t.Errorf("version %s -> %s after refused commands", v, got)
	}
	if _, err := c.run("show", "k2"); !errors.Is(err, task.ErrNotFound) {
		t.Errorf("refused publish stored k2: %v", err)
	}
}

func TestInterspersed(t *testing.T) {
	t.Parallel()
	app := newApp(&testutil.SyncBuffer{}, &testutil.SyncBuffer{})
	tests := []struct{ in, want string }{
		{"lp", "lp"},
		{"lp --store sqlite:x", "lp --store sqlite:x"},
		{"lp publish KEY --kind noop", "lp publish --kind noop -- KEY"},
		{"lp publish --kind noop KEY", "lp publish --kind noop -- KEY"},
		{"lp publish --kind=noop KEY --json", "lp publish --kind=noop --json -- KEY"},
		{"lp --store sqlite:x --log-level debug publish KEY --priority -3 --rerun", "lp --store sqlite:x --log-level debug publish --priority -3 --rerun -- KEY"},
		{"lp publish KEY --ping -1s --delay -1m", "lp publish --ping -1s --delay -1m -- KEY"},
		{"lp show --json KEY", "lp show --json -- KEY"},
		{"lp show KEY --json", "lp show --json -- KEY"},
		{"lp publish --kind noop -- --odd-key", "lp publish --kind noop -- --odd-key"},
		{"lp publish - --kind noop", "lp publish --kind noop -- -"},
		{"lp ls --state running", "lp ls --state running --"},
		{"lp nope a --x", "lp nope a --x"},
		{"lp publish KEY --kind", "lp publish --kind -- KEY"},
		// bench has an action and a subcommand: global flags still move.
		{"lp bench --store sqlite:x --runs 1", "lp --store sqlite:x bench --runs 1 --"},
		{"lp bench curve --store sqlite:x --workers 1", "lp --store sqlite:x bench curve --workers 1 --"},
	}
	for _, tt := range tests {
		got := strings.Join(interspersed(app, strings.Fields(tt.in)), " ")
		if got != tt.want {
			t.Errorf("interspersed(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestEmbeddedProcs(t *testing.T) {
	for _, c := range []struct {
		env         string
		procs, want int
	}{{"", 2, 4}, {"", 1, 3}, {"2", 2, 2}, {"8", 8, 8}} {
		if got := embeddedProcsFor(c.env, c.procs); got != c.want {
			t.Errorf("embeddedProcsFor(%q, %d) = %d, want %d", c.env, c.procs, got, c.want)
		}
	}
}

// TestGCPercentFor: 400 % while the garbage it allows stays within 64
// MiB, then what keeps it there, down to Go's default.
func TestGCPercentFor(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400}, {1 << 20, 400}, {16 << 20, 400}, {32 << 20, 200}, {25 << 20, 256}, {64 << 20, 100}, {1 << 30, 100},
	} {
		if got := gcPercentFor(c.live); got != c.want {
			t.Errorf("gcPercentFor(%d MiB) = %d, want %d", c.live>>20, got, c.want)
		}
	}
}

// TestTuneGC: GOGC from the environment stands; otherwise gcPercent.
func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	t.Setenv("GOGC", "")
	tuneGC()
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, gcPercent)
	}
	t.Setenv("GOGC", "50")
	tuneGC()
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=50 set: tuneGC changed the GC percent to %d", got)
	}
}
