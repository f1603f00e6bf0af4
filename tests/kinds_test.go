package tests

// A library user's kind fed from the shell: `leasepool publish --kind
// resize` run by a Go worker process registered for "resize", the warning
// when no live worker runs a kind, and --strict.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasepool/leasepool/task"
)

// resizeWorkerBin builds testdata/resizeworker, a worker of the kind
// "resize" only, once per test binary.
func resizeWorkerBin(t *testing.T) string {
	t.Helper()
	return buildBinary(t, "./testdata/resizeworker")
}

// startResizeWorker starts the resize worker on storeURL and waits until
// the registry lists it live.
func startResizeWorker(t *testing.T, storeURL, id string) *exec.Cmd {
	t.Helper()
	cmd := startProc(t, id, exec.Command(resizeWorkerBin(t), "--store", storeURL, "--id", id)).cmd
	eventually(t, 30*time.Second, id+" in the registry", func() bool {
		out, _, code := runCLI(t, "--store", storeURL, "--log-level", "error", "workers", "--json")
		var ws []task.WorkerInfo
		if code != 0 || json.Unmarshal([]byte(out), &ws) != nil {
			return false
		}
		for _, w := range ws {
			if w.ID == id && len(w.Kinds) == 1 && w.Kinds[0] == "resize" && w.Until.After(time.Now()) {
				return true
			}
		}
		return false
	})
	return cmd
}

// warningLines are the lines of stderr that start with "warning:".
func warningLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "warning:") {
			out = append(out, l)
		}
	}
	return out
}

// showTask reads a task through `leasepool show --json`; nil if not found.
func showTask(t *testing.T, storeURL, key string) *task.Task {
	t.Helper()
	out, stderr, code := runCLI(t, "--store", storeURL, "--log-level", "error", "show", key, "--json")
	if code != 0 {
		if strings.Contains(stderr, "not found") {
			return nil
		}
		t.Fatalf("show %s: exit %d: %s", key, code, stderr)
	}
	var tk task.Task
	if err := json.Unmarshal([]byte(out), &tk); err != nil {
		t.Fatalf("show %s: %v\n%s", key, err, out)
	}
	return &tk
}

func TestCLIPublishesCustomKindToGoWorker(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	storeURL := "sqlite:" + filepath.Join(dir, "s.db")
	publish := func(args ...string) (stderr string, code int) {
		t.Helper()
		_, stderr, code = runCLI(t, append([]string{"--store", storeURL, "--log-level", "error", "publish"}, args...)...)
		return stderr, code
	}

	// No worker yet: the task is stored, and the publisher is told it waits.
	stderr, code := publish("resize-41", "--kind", "resize", "--payload", `{"id":41}`)
	want := `warning: no live worker runs kind "resize" (live: none); the task waits until one does`
	if got := warningLines(stderr); code != 0 || len(got) != 1 || got[0] != want {
		t.Fatalf("publish before any worker: exit %d, stderr %q; want exit 0 and %q", code, stderr, want)
	}
	// --strict refuses it and the store is left as it was, byte for byte.
	before := dirState(t, dir)
	stderr, code = publish("resize-40", "--kind", "resize", "--strict")
	if code != 2 || !strings.Contains(stderr, `no live worker runs kind "resize" (live: none); a strict publish refuses it`) {
		t.Errorf("--strict before any worker: exit %d, stderr %q; want exit 2 naming the kind", code, stderr)
	}
	after := dirState(t, dir)
	for name, content := range before {
		if after[name] != content {
			t.Errorf("%s changed by a refused --strict publish", name)
		}
	}
	if len(after) != len(before) {
		t.Errorf("files before %v, after %v", mapKeys(before), mapKeys(after))
	}

	worker := startResizeWorker(t, storeURL, "resize-1")
	stderr, code = publish("resize-42", "--kind", "resize", "--payload", `{"id":42}`, "--strict")
	if code != 0 || stderr != "" {
		t.Errorf("publish with a live resize worker: exit %d, stderr %q; want no warning", code, stderr)
	}
	stderr, code = publish("resze-43", "--kind", "resze", "--payload", `{"id":43}`)
	want = `warning: no live worker runs kind "resze" (live: resize); the task waits until one does`
	if got := warningLines(stderr); code != 0 || len(got) != 1 || got[0] != want {
		t.Errorf("mistyped kind: exit %d, stderr %q; want exit 0 and %q", code, stderr, want)
	}
	stderr, code = publish("resze-44", "--kind", "resze", "--strict")
	if code != 2 || !strings.Contains(stderr, `invalid: --kind: no live worker runs kind "resze" (live: resize); a strict publish refuses it`) {
		t.Errorf("--strict mistyped kind: exit %d, stderr %q", code, stderr)
	}
	if tk := showTask(t, storeURL, "resze-44"); tk != nil {
		t.Errorf("a refused --strict publish stored %s", tk.Key)
	}

	// The Go worker runs both resize tasks, the one published before it
	// started included, and leaves the mistyped one alone.
	for _, key := range []string{"resize-41", "resize-42"} {
		var tk *task.Task
		eventually(t, 30*time.Second, key+" succeeded", func() bool {
			tk = showTask(t, storeURL, key)
			return tk != nil && tk.State == task.StateSucceeded
		})
		var res struct {
			By      string `json:"by"`
			Resized int    `json:"resized"`
		}
		w := tk.Attempts[0]
		if err := json.Unmarshal(w.Result, &res); err != nil || w.WorkerID != "resize-1" || res.By != "resize-1" ||
			fmt.Sprintf("resize-%d", res.Resized) != key {
			t.Errorf("%s ran on %s with result %s", key, w.WorkerID, w.Result)
		}
	}
	if tk := showTask(t, storeURL, "resze-43"); tk == nil || tk.State != task.StatePending || tk.AttemptsStarted != 0 {
		t.Errorf("resze-43: %+v, want pending and never claimed", tk)
	}

	// Stopped, the worker leaves the registry: the warning is back.
	if err := worker.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := worker.Wait(); err != nil {
		t.Fatalf("resize worker: %v", err)
	}
	stderr, _ = publish("resize-45", "--kind", "resize")
	if got := warningLines(stderr); len(got) != 1 || !strings.Contains(got[0], `"resize" (live: none)`) {
		t.Errorf("after the worker stopped: stderr %q, want the warning", stderr)
	}
}

// dirState is every file of dir with its content.
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

func mapKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// `leasepool demo | cat`: progress as plain lines, a few seconds apart,
// with no carriage returns or terminal escapes, none longer than 200
// characters. Not parallel: the demo's tasks hold short leases, and every
// one must end as planned.
func TestDemoOutputPiped(t *testing.T) {
	cmd := exec.Command(leasepoolBin(t), "demo", "--tasks", "50", "--devices", "6", "--commands", "30")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	out, err := cmd.Output() // stdout is a pipe, as with | cat
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s", err, out, tail(stderr.String(), 4000))
	}
	s := string(out)
	if strings.ContainsAny(s, "\r\x1b") {
		t.Errorf("control characters in the demo's output: %q", tail(s, 2000))
	}
	status := regexp.MustCompile(`^\d+\.\ds  pending +\d+  running +\d+  succeeded +\d+  failed +\d+  \(\d+/\d+ done\)`)
	statusLines := 0
	for i, l := range strings.Split(s, "\n") {
		if n := len([]rune(l)); n > 200 {
			t.Errorf("line %d has %d characters: %q", i+1, n, l)
		}
		if strings.ContainsFunc(l, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Errorf("line %d has a control character: %q", i+1, l)
		}
		if status.MatchString(l) {
			statusLines++
		}
	}
	// The first status at once, then one per progress interval (3 s) at most.
	if limit := int(elapsed/(3*time.Second)) + 2; statusLines < 1 || statusLines > limit {
		t.Errorf("%d status lines in %s, want 1 to %d:\n%s", statusLines, elapsed.Round(time.Second), limit, s)
	}
	if !strings.Contains(s, "OK: every task ended as it should") {
		t.Errorf("demo did not end OK:\n%s", s)
	}
	// The demo's output is its own: the logs of its store, broker,
	// devices and worker processes go to the file it names; on stderr
	// there may be a warning, never an info line.
	if l := logLines(s); len(l) > 0 {
		t.Errorf("log lines in the demo's output:\n%s", strings.Join(l, "\n"))
	}
	for _, l := range logLines(stderr.String()) {
		if !strings.Contains(l, `"level":"WARN"`) && !strings.Contains(l, `"level":"ERROR"`) {
			t.Errorf("a log line below warn on the demo's stderr: %s", l)
		}
	}
	if !regexp.MustCompile(`(?m)^logs of the store, broker, devices and workers: \S+demo\.log`).MatchString(s) {
		t.Errorf("the demo does not name its log file:\n%s", s)
	}
	t.Logf("demo output (%s):\n%s", elapsed.Round(time.Second), s)
}
