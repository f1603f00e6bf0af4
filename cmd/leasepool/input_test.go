package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/leasepool/leasepool/internal/testutil"
	"github.com/leasepool/leasepool/task"
)

// runMain runs the CLI as main does, with stdin, and returns its output and
// exit status.
func runMain(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errw testutil.SyncBuffer
	runMu.Lock()
	code = run(t.Context(), append([]string{"leasepool"}, args...), strings.NewReader(stdin), &out, &errw)
	runMu.Unlock()
	return out.String(), errw.String(), code
}

// errorLine returns the one "leasepool: " error line of stderr, failing the
// test when there is not exactly one or when help was printed.
func errorLine(t *testing.T, stderr string) string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "leasepool: ") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || strings.Contains(stderr, "OPTIONS:") || strings.Contains(stderr, "Incorrect Usage") {
		t.Fatalf("stderr has %d error lines (want 1, no help):\n%s", len(lines), stderr)
	}
	return lines[0]
}

func (c *harness) count() int {
	c.t.Helper()
	var ts []json.RawMessage
	if err := json.Unmarshal([]byte(c.must("ls", "--json", "--limit", "0")), &ts); err != nil {
		c.t.Fatal(err)
	}
	return len(ts)
}

// TestPublishRefusesPoisonInput: each bad publish exits 2 with one line
// naming the field or flag, and writes nothing.
func TestPublishRefusesPoisonInput(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "ok", "--kind", "noop")
	big := `{"s":"` + strings.Repeat("x", task.MaxPayloadSize) + `"}`
	bigFile := filepath.Join(t.TempDir(), "big.json")
	if err := os.WriteFile(bigFile, []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		stdin string
		args  []string
		want  string // in the error line
	}{
		{"key not UTF-8", "", []string{"publish", "a\xffb", "--kind", "noop"}, "key:"},
		{"key control", "", []string{"publish", "a\x1bb", "--kind", "noop"}, "key:"},
		{"kind not UTF-8", "", []string{"publish", "k", "--kind", "no\xc3"}, "kind"},
		{"lease too short", "", []string{"publish", "k", "--kind", "noop", "--ping", "1ns", "--timeout", "2ns"}, "ping_interval"},
		{"timeout under floor", "", []string{"publish", "k", "--kind", "noop", "--timeout", "50ms"}, "worker_timeout"},
		{"pin names no id", "", []string{"publish", "k", "--kind", "noop", "--pin", ",,,"}, "--pin"},
		{"pin empty item", "", []string{"publish", "k", "--kind", "noop", "--pin", "w1,,w2"}, "--pin"},
		{"lock names no key", "", []string{"publish", "k", "--kind", "noop", "--lock", ","}, "--lock"},
		{"pin not UTF-8", "", []string{"publish", "k", "--kind", "noop", "--pin", "w\xff"}, "specific_worker_ids"},
		{"device unknown field", "", []string{"publish", "k", "--kind", "device", "--payload", `{"device":"d1","command":"on","ack_timout":"1s"}`}, "ack_timout"},
		{"delay does not parse", "", []string{"publish", "k", "--kind", "noop", "--delay", "soon"}, "--delay"},
		{"unknown flag", "", []string{"publish", "k", "--kind", "noop", "--bogus"}, "--bogus"},
		{"no kind", "", []string{"publish", "k"}, "--kind"},
		{"no key", "", []string{"publish", "--kind", "noop"}, "KEY"},
		{"payload too big", "", []string{"publish", "k", "--kind", "noop", "--payload", big}, "payload"},
		{"payload-file too big", "", []string{"publish", "k", "--kind", "noop", "--payload-file", bigFile}, "--payload-file"},
		{"stdin too big", big, []string{"publish", "k", "--kind", "noop", "--payload", "-"}, "--payload"},
		{"stdin not JSON", "{", []string{"publish", "k", "--kind", "noop", "--payload", "-"}, "--payload"},
		{"payload and file", "", []string{"publish", "k", "--kind", "noop", "--payload", "{}", "--payload-file", bigFile}, "--payload"},
		{"missing payload-file", "", []string{"publish", "k", "--kind", "noop", "--payload-file", filepath.Join(t.TempDir(), "nope")}, "--payload-file"},
		{"unknown command", "", []string{"publsh", "k"}, `"publsh"`},
		{"unknown subcommand", "", []string{"device", "simulat"}, `"simulat"`},
		{"worker kinds names none", "", []string{"worker", "--kinds", ",,"}, "--kinds"},
		{"ls limit does not parse", "", []string{"ls", "--limit", "x"}, "--limit"},
		{"pause two targets", "", []string{"pause", "--kind", "a", "--all"}, "exactly one"},
		{"resume no target", "", []string{"resume"}, "--lock"},
		{"limit without rate", "", []string{"limit", "set", "device:*"}, "--rate"},
		{"limit rate does not parse", "", []string{"limit", "set", "device:*", "--rate", "2/fast"}, "--rate"},
		{"limit key and kind", "", []string{"limit", "set", "device:x", "--kind", "k", "--rate", "1/s"}, "KEY"},
		{"limit rm no target", "", []string{"limit", "rm"}, "KEY"},
		{"group control", "", []string{"publish", "k", "--kind", "noop", "--group", "ac\x01me"}, "--group"},
		{"limit group control", "", []string{"limit", "set", "--group", "a\tb", "--weight", "2"}, "--group"},
		{"weight 0", "", []string{"limit", "set", "--group", "acme", "--weight", "0"}, "--weight"},
		{"weight above 1000", "", []string{"limit", "set", "--group", "acme", "--weight", "1001"}, "--weight"},
		{"weight on a lock key", "", []string{"limit", "set", "tenant:*", "--weight", "2"}, "--weight"},
		{"concurrency 0", "", []string{"limit", "set", "--group", "acme", "--concurrency", "0"}, "--concurrency"},
		{"limit group and kind", "", []string{"limit", "set", "--group", "acme", "--kind", "k", "--weight", "2"}, "--group"},
	}
	for _, tt := range tests {
		_, stderr, code := runMain(t, tt.stdin, append([]string{"--store", c.store}, tt.args...)...)
		if code != exitBadInput {
			t.Errorf("%s: exit status %d, want %d", tt.name, code, exitBadInput)
		}
		if line := errorLine(t, stderr); !strings.Contains(line, tt.want) || !strings.Contains(line, "--help") {
			t.Errorf("%s: error %q does not name %s or point at --help", tt.name, line, tt.want)
		}
	}
	if n := c.count(); n != 1 {
		t.Errorf("%d tasks after refused publishes, want 1", n)
	}
	if out := strings.TrimSpace(c.must("limit", "ls", "--json")); out != "[]" {
		t.Errorf("limits after refused limit sets: %s, want none", out)
	}
}

// TestExitStatus: 0 on success, 2 for bad input, 1 when the command fails.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "a", "--kind", "noop")
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"show", "a"}, exitOK},
		{[]string{"show", "missing"}, exitFailed},
		{[]string{"show"}, exitBadInput},
		{[]string{"ls", "--state", "done"}, exitBadInput},
		{[]string{"publish", "b", "--kind", "exec", "--payload", `{"argv":[]}`}, exitBadInput},
	} {
		_, stderr, code := runMain(t, "", append([]string{"--store", c.store}, tt.args...)...)
		if code != tt.want {
			t.Errorf("%v: exit status %d, want %d (stderr %q)", tt.args, code, tt.want, stderr)
		}
		if code != exitOK {
			errorLine(t, stderr)
		}
	}
}

func TestPublishPayloadFileAndStdin(t *testing.T) {
	t.Parallel()
	c := setup(t)
	file := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(file, []byte("{\"argv\": [\"true\"]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.must("publish", "f", "--kind", "exec", "--payload-file", file)
	if _, stderr, code := runMain(t, `{"duration":"1ms"}`, "--store", c.store, "publish", "s", "--kind", "sleep", "--payload", "-"); code != 0 {
		t.Fatalf("publish --payload -: status %d: %s", code, stderr)
	}
	for key, want := range map[string]string{"f": `{"argv": ["true"]}`, "s": `{"duration":"1ms"}`} {
		var got json.RawMessage
		if err := json.Unmarshal(c.show(key)["payload"], &got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(bytes.TrimSpace(got), []byte(want)) && compactJSON(t, got) != compactJSON(t, []byte(want)) {
			t.Errorf("%s: payload %s, want %s", key, got, want)
		}
	}
}

func compactJSON(t *testing.T, b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestLsSaysWhenLimited: ls notes on stderr that it stopped at --limit and
// how to go on; --after pages on.
func TestLsSaysWhenLimited(t *testing.T) {
	t.Parallel()
	c := setup(t)
	for _, k := range []string{"a", "b", "c"} {
		c.must("publish", k, "--kind", "noop")
	}
	out, stderr, code := runMain(t, "", "--store", c.store, "ls", "--limit", "2")
	if code != 0 || !strings.Contains(out, "a") || !strings.Contains(out, "b") || strings.Contains(out, "c ") {
		t.Fatalf("ls --limit 2: status %d\n%s", code, out)
	}
	m := regexp.MustCompile(`showing the first 2 tasks; more with --after (\d+)`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("ls --limit 2 does not say it stopped: %q", stderr)
	}
	out, stderr, _ = runMain(t, "", "--store", c.store, "ls", "--limit", "2", "--after", m[1])
	if !strings.Contains(out, "c") || strings.Contains(out, "a ") || strings.Contains(stderr, "showing") {
		t.Errorf("ls --after %s:\n%s\nstderr %q", m[1], out, stderr)
	}
	if _, stderr, _ := runMain(t, "", "--store", c.store, "ls", "--limit", "3"); strings.Contains(stderr, "showing") {
		t.Errorf("ls of everything says it stopped: %q", stderr)
	}
}

// dirStat is every file of dir with its size, mtime and contents' hash.
func dirStat(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%d %s %x", fi.Size(), fi.ModTime().Format(time.RFC3339Nano), b)
	}
	return out
}

func sameDir(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	for name := range after {
		if _, ok := before[name]; !ok {
			t.Errorf("%s left a new file %s", what, name)
		}
	}
	for name, st := range before {
		if after[name] != st {
			t.Errorf("%s changed %s", what, name)
		}
	}
}

var readOnlyCommands = [][]string{{"ls"}, {"ls", "--json"}, {"show", "a"}, {"devices"}}

// TestReadOnlyCommandsOnForeignFile: a SQLite file that is not a leasepool
// store is refused by every read-only command, untouched (bytes, mtime, no
// -wal, -shm or -lock files).
func TestReadOnlyCommandsOnForeignFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	before := dirStat(t, dir)
	for _, file := range []string{path, empty} {
		for _, args := range readOnlyCommands {
			_, stderr, code := runMain(t, "", append([]string{"--store", "sqlite:" + file}, args...)...)
			if code == 0 || !strings.Contains(errorLine(t, stderr), "not a leasepool store") {
				t.Errorf("%v on %s: status %d, stderr %q; want refused", args, filepath.Base(file), code, stderr)
			}
		}
	}
	sameDir(t, "read-only commands on a foreign file", before, dirStat(t, dir))
}

// TestReadOnlyCommandsWriteNothing: on a leasepool store no process has
// open, ls, show and devices change no byte and leave no file. (Tests may
// run as root, where a 0444 file and a read-only directory do not stop a
// write: the read-only open, mode=ro, is what is tested here.)
func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	t.Parallel()
	c := setup(t)
	c.must("publish", "a", "--kind", "noop")
	if err := os.Chmod(c.path, 0o444); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(c.path)
	before := dirStat(t, dir)
	for _, args := range readOnlyCommands {
		out, stderr, code := runMain(t, "", append([]string{"--store", c.store}, args...)...)
		if code != 0 {
			t.Errorf("%v: status %d: %s", args, code, stderr)
		}
		if args[0] != "devices" && !strings.Contains(out, "a") {
			t.Errorf("%v: %q lacks the task", args, out)
		}
	}
	sameDir(t, "read-only commands", before, dirStat(t, dir))
}

// TestHelpShowsEachDefaultOnce: no flag's help line shows a default twice
// (a "(default ...)" in Usage beside urfave/cli's own), and required flags
// are marked.
func TestHelpShowsEachDefaultOnce(t *testing.T) {
	t.Parallel()
	app := newApp(&testutil.SyncBuffer{}, &testutil.SyncBuffer{})
	var walk func(prefix []string, cmds []*cli.Command)
	var names [][]string
	walk = func(prefix []string, cmds []*cli.Command) {
		for _, cmd := range cmds {
			if cmd.Name == "help" {
				continue
			}
			p := append(slices.Clone(prefix), cmd.Name)
			names = append(names, p)
			walk(p, cmd.Subcommands)
		}
	}
	walk(nil, app.Commands)
	for _, n := range names {
		out, stderr, code := runMain(t, "", append(n, "--help")...)
		if code != 0 {
			t.Fatalf("%v --help: status %d: %s", n, code, stderr)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Count(line, "default") > 1 {
				t.Errorf("%v --help shows a default twice: %s", n, strings.TrimSpace(line))
			}
		}
		if n[0] == "publish" {
			for _, want := range []string{"(required)", "(default: 1s, or --timeout/4", "--payload-file"} {
				if !strings.Contains(out, want) {
					t.Errorf("publish --help lacks %q:\n%s", want, out)
				}
			}
		}
	}
}
