package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/internal/testutil"
)

// runStdin runs leasepool --store STORE args... with stdin as standard
// input, returning stdout, stderr and the exit status, as main would.
func (c *harness) runStdin(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	var stdout, stderr testutil.SyncBuffer
	runMu.Lock()
	code := run(c.t.Context(), append([]string{"leasepool", "--store", c.store}, args...), strings.NewReader(stdin), &stdout, &stderr)
	runMu.Unlock()
	return stdout.String(), stderr.String(), code
}

// TestPublishFile: every good line is published, each refused line is
// reported with its number and field, and the exit status says so.
func TestPublishFile(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "--kind", "noop", "old")
	lines := []string{
		`{"key":"a","kind":"noop","payload":{"n":1}}`,
		`{"key":"a","kind":"noop","payload":{"n":2}}`,
		``,
		`{"key":"old","kind":"noop"}`,
		`{"key":"b","kind":""}`,
		`not json`,
		`{"key":"c","kind":"noop","priority":"x"}`,
		`{"key":"d","kind":"noop","payload":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`,
		`{"key":"e","kind":"noop","payload":"` + strings.Repeat("x", maxFileLine) + `"}`,
		`{"key":"f","kind":"noop"}`,
	}
	file := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := c.runStdin("", "publish", "--file", file)
	if code != exitFailed || out != "inserted 2, existing 2, rerun 0, refused 5, failed 0 (9 lines)\n" {
		t.Errorf("exit %d, stdout %q; want 1 and the summary", code, out)
	}
	for _, want := range []string{"line 5: kind: ", "line 6: body: ", "line 7: priority: ", "line 8: payload: ",
		fmt.Sprintf("line 9: longer than %d bytes", maxFileLine), "5 of 9 lines not published"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if got := c.show("a")["payload"]; strings.Join(strings.Fields(string(got)), "") != `{"n":1}` {
		t.Errorf("a's payload %s; want the first line's", got)
	}
	if c.state("f") != "pending" {
		t.Errorf("f after the refused lines: %s", c.state("f"))
	}
	for _, k := range []string{"b", "c", "d", "e"} {
		if _, err := c.run("show", k); err == nil {
			t.Errorf("refused %s was stored", k)
		}
	}

	// Standard input; a file of good lines exits 0.
	var in strings.Builder
	for i := range 12000 {
		fmt.Fprintf(&in, `{"key":"s%05d","kind":"noop","lock_keys":["l%d"]}`+"\n", i, i%7)
	}
	out, errOut, code = c.runStdin(in.String(), "publish", "--file", "-")
	if code != exitOK || out != "inserted 12000, existing 0, rerun 0, refused 0, failed 0 (12000 lines)\n" {
		t.Errorf("stdin: exit %d, %q\n%s", code, out, errOut)
	}
	if c.state("s11999") != "pending" {
		t.Errorf("s11999 not stored")
	}

	// --file with KEY or a task flag is a usage error, nothing read.
	for _, args := range [][]string{{"publish", "--file", "-", "k"}, {"publish", "--file", "-", "--kind", "noop"}} {
		if _, errOut, code := c.runStdin(`{"key":"u","kind":"noop"}`, args...); code != exitBadInput || !strings.Contains(errOut, "--file") {
			t.Errorf("%v: exit %d %s; want 2 naming --file", args, code, errOut)
		}
	}
	if _, err := c.run("show", "u"); err == nil {
		t.Errorf("a refused command line stored u")
	}
}

// TestPublishDebounce: publish --debounce on a pending key replaces its
// payload and says so; publish --file lines debounce alike, and a bad
// debounce line is refused naming the field.
func TestPublishDebounce(t *testing.T) {
	t.Parallel()
	c := setup(t)
	if out := c.must("publish", "--kind", "noop", "--debounce", "1m", "--payload", `{"n":1}`, "k"); !strings.HasPrefix(out, "inserted k ") {
		t.Fatalf("first publish: %q", out)
	}
	if out := c.must("publish", "--kind", "noop", "--debounce", "1m", "--payload", `{"n":2}`, "k"); !strings.HasPrefix(out, "debounced k ") {
		t.Fatalf("second publish: %q", out)
	}
	if got := c.show("k")["payload"]; strings.Join(strings.Fields(string(got)), "") != `{"n":2}` {
		t.Errorf("k's payload %s; want the second publish's", got)
	}
	lines := `{"key":"k","kind":"noop","payload":{"n":3},"debounce":"1m"}
{"key":"k","kind":"noop","payload":{"n":4},"debounce":"1m"}
{"key":"k","kind":"noop","payload":{"n":5},"debounce":"0s"}
{"key":"k","kind":"noop","payload":{"n":6},"debounce":"-1s"}
{"key":"k","kind":"noop","payload":{"n":7},"debounce":"48h"}
{"key":"k","kind":"noop","payload":{"n":8}}
`
	out, errOut, code := c.runStdin(lines, "publish", "--file", "-")
	if code != exitFailed || out != "inserted 0, existing 1, rerun 0, debounced 2, refused 3, failed 0 (6 lines)\n" {
		t.Errorf("exit %d, stdout %q; want 1 and the summary\n%s", code, out, errOut)
	}
	for _, want := range []string{"line 3: debounce: ", "line 4: debounce: ", "line 5: debounce: "} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if got := c.show("k")["payload"]; strings.Join(strings.Fields(string(got)), "") != `{"n":4}` {
		t.Errorf("k's payload %s; want line 2's", got)
	}
	if _, _, code := c.runStdin("", "publish", "--file", "-", "--debounce", "1s"); code == exitOK {
		t.Errorf("--debounce with --file accepted")
	}
}
