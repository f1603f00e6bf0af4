package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
	"github.com/leasepool/leasepool/task/sqlitestore"
)

// runStderr runs leasepool --store STORE args... and returns its stdout,
// its stderr and its exit status, as main would exit.
func (c *harness) runStderr(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	var out, errb testutil.SyncBuffer
	app := newApp(&out, &errb)
	runMu.Lock()
	err := app.RunContext(c.t.Context(), interspersed(app, append([]string{"leasepool", "--store", c.store}, args...)))
	runMu.Unlock()
	if err != nil {
		return out.String(), errb.String() + "leasepool: " + oneLine(err) + "\n", exitStatus(err)
	}
	return out.String(), errb.String(), exitOK
}

// registerWorker registers a live worker of kinds in c's store, as a
// worker process does.
func (c *harness) registerWorker(id string, kinds ...string) {
	c.t.Helper()
	ctx := c.t.Context()
	s, err := sqlitestore.Open(ctx, c.path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	defer s.Close()
	now := s.Now()
	w := task.WorkerInfo{ID: id, Instance: id + "-1", Host: "test", PID: os.Getpid(), Kinds: kinds,
		Concurrency: 1, Heartbeat: now, StartedAt: now, Until: now.Add(time.Hour)}
	if err := s.RegisterWorker(ctx, task.RegisterParams{Worker: w, Now: now}); err != nil {
		c.t.Fatal(err)
	}
}

// warnings are the stderr lines that start with "warning:".
func warningLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "warning:") {
			out = append(out, l)
		}
	}
	return out
}

func TestPublishAnyKindWarnsWithoutLiveWorker(t *testing.T) {
	t.Parallel()
	c := setup(t)
	stdout, stderr, code := c.runStderr("publish", "resize-42", "--kind", "resize", "--payload", `{"id":42}`)
	if code != exitOK || !strings.Contains(stdout, "resize-42") {
		t.Fatalf("publish --kind resize: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	want := `warning: no live worker runs kind "resize" (live: none); the task waits until one does`
	if got := warningLines(stderr); len(got) != 1 || got[0] != want {
		t.Errorf("warnings %q, want [%q]", got, want)
	}
	if k := string(c.show("resize-42")["kind"]); k != `"resize"` {
		t.Errorf("stored kind %s", k)
	}

	c.registerWorker("w1", "resize", "noop", "exec")
	if _, stderr, code := c.runStderr("publish", "resize-43", "--kind", "resize"); code != exitOK || len(warningLines(stderr)) != 0 {
		t.Errorf("with a live worker of the kind: exit %d, stderr %q; want no warning", code, stderr)
	}
	_, stderr, code = c.runStderr("publish", "resze-44", "--kind", "resze")
	want = `warning: no live worker runs kind "resze" (live: exec, noop, resize); the task waits until one does`
	if got := warningLines(stderr); code != exitOK || len(got) != 1 || got[0] != want {
		t.Errorf("mistyped kind: exit %d, warnings %q, want [%q]", code, got, want)
	}
	// --json output stays one JSON document on stdout.
	stdout, stderr, _ = c.runStderr("publish", "resze-45", "--kind", "resze", "--json")
	if !strings.HasPrefix(stdout, "{") || strings.Contains(stdout, "warning") || len(warningLines(stderr)) != 1 {
		t.Errorf("--json: stdout %q, stderr %q", stdout, stderr)
	}
}

func TestStrictRefusesKindWithoutLiveWorker(t *testing.T) {
	t.Parallel()
	flowFile := filepath.Join(t.TempDir(), "flow.json")
	if err := os.WriteFile(flowFile, []byte(`{"steps": [{"name": "a", "kind": "resze", "rollback": {"kind": "noop"}}, {"name": "b", "kind": "noop"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cmds := []struct {
		name  string
		args  []string
		field string
	}{
		{"publish", []string{"publish", "k", "--kind", "resze", "--strict"}, "--kind"},
		{"schedule add", []string{"schedule", "add", "nightly", "--every", "1h", "--kind", "resze", "--strict"}, "--kind"},
		{"flow publish", []string{"flow", "publish", "f", "--file", flowFile, "--strict"}, "steps[0].kind"},
	}
	for _, tt := range cmds {
		t.Run(tt.name+" no store", func(t *testing.T) {
			t.Parallel()
			c := setup(t)
			before := dirState(t, filepath.Dir(c.path))
			_, stderr, code := c.runStderr(tt.args...)
			want := `leasepool: invalid: ` + tt.field + `: no live worker runs kind "resze" (live: none); a strict publish refuses it`
			if code != exitBadInput || !strings.Contains(stderr, want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
			}
			if after := dirState(t, filepath.Dir(c.path)); len(after) != len(before) {
				t.Errorf("files before %v, after %v: a refused publish created the store", keys(before), keys(after))
			}
		})
		t.Run(tt.name+" live workers", func(t *testing.T) {
			t.Parallel()
			c := setup(t)
			c.registerWorker("w1", "noop", "resize")
			before := dirState(t, filepath.Dir(c.path))
			_, stderr, code := c.runStderr(tt.args...)
			want := `leasepool: invalid: ` + tt.field + `: no live worker runs kind "resze" (live: noop, resize); a strict publish refuses it`
			if code != exitBadInput || !strings.Contains(stderr, want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
			}
			after := dirState(t, filepath.Dir(c.path))
			for name, content := range before {
				if after[name] != content {
					t.Errorf("%s changed by a refused publish", name)
				}
			}
			if len(after) != len(before) {
				t.Errorf("files before %v, after %v", keys(before), keys(after))
			}
			// Without --strict the same command publishes, with the warning.
			args := tt.args[:len(tt.args)-1]
			if _, stderr, code := c.runStderr(args...); code != exitOK || len(warningLines(stderr)) != 1 {
				t.Errorf("without --strict: exit %d, stderr %q; want a publish and one warning", code, stderr)
			}
		})
	}
	t.Run("strict with a live worker", func(t *testing.T) {
		t.Parallel()
		c := setup(t)
		c.registerWorker("w1", "resize")
		_, stderr, code := c.runStderr("publish", "k", "--kind", "resize", "--strict")
		if code != exitOK || len(warningLines(stderr)) != 0 {
			t.Errorf("exit %d, stderr %q; want a publish with no warning", code, stderr)
		}
		if st := c.state("k"); st != "pending" {
			t.Errorf("state %s", st)
		}
	})
}

func TestKindChecks(t *testing.T) {
	t.Parallel()
	flow := func(steps string) string {
		path := filepath.Join(t.TempDir(), "flow.json")
		if err := os.WriteFile(path, []byte(`{"steps": `+steps+`}`), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	tests := []struct {
		name string
		args []string
		want string // the error names this
	}{
		{"missing kind lists every kind", []string{"publish", "k"}, "--kind: required: a built-in kind (exec, noop, sleep, device)"},
		{"kind with control char", []string{"publish", "k", "--kind", "re\x00size"}, "--kind"},
		{"empty kind", []string{"publish", "k", "--kind", ""}, "--kind"},
		{"kind too long", []string{"publish", "k", "--kind", strings.Repeat("k", task.MaxNameLen+1)}, "--kind"},
		{"sleep payload checked", []string{"publish", "k", "--kind", "sleep", "--payload", `{"secs":1}`}, "--payload"},
		{"exec payload checked", []string{"publish", "k", "--kind", "exec"}, "argv"},
		{"schedule exec payload checked", []string{"schedule", "add", "s", "--every", "1h", "--kind", "exec"}, "argv"},
		{"flow sleep payload checked", []string{"flow", "publish", "f", "--file",
			flow(`[{"name": "a", "kind": "sleep", "payload": {"secs": 1}}]`)}, "steps[0].payload: sleep"},
		{"flow exec rollback payload checked", []string{"flow", "publish", "f", "--file",
			flow(`[{"name": "a", "kind": "noop", "rollback": {"kind": "exec", "payload": {"argv": []}}}]`)}, "steps[0].rollback.payload: exec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := setup(t)
			_, stderr, code := c.runStderr(tt.args...)
			if code != exitBadInput || !strings.Contains(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 naming %q", code, stderr, tt.want)
			}
			if _, err := os.Stat(c.path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused input created the store: %v", err)
			}
		})
	}
	// A library user's kind takes any JSON payload: it is theirs to read.
	c := setup(t)
	if _, stderr, code := c.runStderr("publish", "k", "--kind", "resize", "--payload", `{"secs":1,"argv":[]}`); code != exitOK {
		t.Errorf("custom kind with its own payload: exit %d, %s", code, stderr)
	}
}
