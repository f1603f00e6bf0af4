package tests

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// logLines returns the lines of out that are JSON log records (a JSON
// object with a level and a message), as the CLI writes them where stderr
// is not a terminal.
func logLines(out string) []string {
	var found []string
	for l := range strings.SplitSeq(out, "\n") {
		var rec struct {
			Level *string `json:"level"`
			Msg   *string `json:"msg"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(l)), &rec) == nil && rec.Level != nil && rec.Msg != nil {
			found = append(found, l)
		}
	}
	return found
}

// TestOneShotCommandsPrintNoLogs: a one-shot command prints its answer,
// warnings and errors, and no log line, even the first on a fresh store
// (whose open logs its new clock epoch at info); --log-level info brings
// that line back.
func TestOneShotCommandsPrintNoLogs(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fresh := func(name string) string { return "sqlite:" + filepath.Join(dir, name+".db") }
	published := fresh("published")
	for _, c := range []struct {
		store string
		args  []string
	}{
		{published, []string{"publish", "k1", "--kind", "noop"}},
		{fresh("retention"), []string{"retention", "set", "--succeeded", "1h"}},
		{published, []string{"ls"}},
		{published, []string{"show", "k1"}},
		{published, []string{"retention", "show"}},
		{published, []string{"workers"}},
		{published, []string{"devices"}},
		{published, []string{"cancel", "k1"}},
	} {
		stdout, stderr, code := runCLI(t, append([]string{"--store", c.store}, c.args...)...)
		if code != 0 {
			t.Errorf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", c.args, code, stdout, stderr)
		}
		if stdout == "" {
			t.Errorf("%v: printed no answer", c.args)
		}
		if l := logLines(stdout + stderr); len(l) > 0 {
			t.Errorf("%v printed log lines:\n%s", c.args, strings.Join(l, "\n"))
		}
	}
	_, stderr, code := runCLI(t, "--store", fresh("info"), "--log-level", "info", "publish", "k1", "--kind", "noop")
	if l := logLines(stderr); code != 0 || len(l) == 0 || !strings.Contains(stderr, "store clock: new epoch") {
		t.Errorf("publish --log-level info on a fresh store: exit %d, log lines %q, want the store's new epoch", code, l)
	}
}
