package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const dbFlowJSON = `{
  "params": {"name": "db-1", "cpu": 4},
  "steps": [
    {"name": "check", "kind": "noop", "retries": 1, "rollback": {"kind": "noop"}},
    {"name": "init", "kind": "exec", "payload": {"argv": ["true"]}, "timeout": "30s",
     "rollback": {"kind": "exec", "payload": {"argv": ["true"]}, "retries": 2}},
    {"name": "deduct", "kind": "noop"}
  ]
}`

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "flow.json")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFlowPublishBadInput(t *testing.T) {
	c := setup(t)
	for _, bad := range []struct{ body, field string }{
		{`{"steps": []}`, "steps"},
		{`{"steps": [{"name": "a", "kind": "noop", "retries": "x"}]}`, "steps.retries"},
		{`{"steps": [{"name": "a", "kind": "noop", "timeout": "soon"}]}`, "steps[0].timeout"},
		{`{"steps": [{"name": "a", "kind": "noop", "rollback": {"kind": ""}}]}`, "steps[0].rollback.kind"},
		{`{"steps": [{"name": "a", "kind": "noop", "colour": 1}]}`, `"colour"`},
		{`{"key": "other", "steps": [{"name": "a", "kind": "noop"}]}`, "key"},
		{`{"params": [1], "steps": [{"name": "a", "kind": "noop"}]}`, "params"},
		{`{"steps": [{"name": "a", "kind": "noop"}]} {}`, "more than one"},
	} {
		_, err := c.run("flow", "publish", "f1", "--file", writeFile(t, bad.body))
		if err == nil || exitStatus(err) != exitBadInput || !strings.Contains(err.Error(), bad.field) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming %s, exit 2", bad.body, err, bad.field)
		}
	}
	if fileExists(c.path) {
		t.Errorf("bad input created the store")
	}
}

func TestFlowCommands(t *testing.T) {
	c := setup(t)
	file := writeFile(t, dbFlowJSON)
	if out := c.must("flow", "publish", "db-1", "--file", file); out != "inserted db-1 (running)\n" {
		t.Errorf("publish printed %q", out)
	}
	if out := c.must("flow", "publish", "db-1", "--file", file); out != "existing db-1 (running)\n" {
		t.Errorf("publish again printed %q", out)
	}
	out := c.must("flow", "show", "db-1")
	for _, want := range []string{"flow db-1: running, step 1/3 check, run 1", "cpu: 4"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	// The steps by level, their columns apart by spaces (the running
	// step's time is still growing).
	var table []string
	for _, line := range strings.Split(out, "\n")[1:5] {
		table = append(table, strings.Join(strings.Fields(line), " "))
	}
	if len(table) != 4 || table[0] != "LEVEL STEP KIND STATE ATTEMPTS TOOK NEEDS ROLLBACK" ||
		!strings.HasPrefix(table[1], "1 check noop running 1 ") || !strings.HasSuffix(table[1], " - -") ||
		table[2] != "2 init exec waiting 0 - check -" || table[3] != "3 deduct noop waiting 0 - init none" {
		t.Errorf("show's steps:\n%s", strings.Join(table, "\n"))
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(c.must("flow", "show", "db-1", "--json")), &doc); err != nil || string(doc["state"]) != `"running"` {
		t.Errorf("show --json: %v %s", err, doc["state"])
	}
	var graph struct {
		Levels [][]string `json:"levels"`
		Steps  []struct {
			Name  string   `json:"name"`
			State string   `json:"state"`
			Needs []string `json:"needs"`
		} `json:"steps"`
	}
	if err := json.Unmarshal(doc["graph"], &graph); err != nil || len(graph.Levels) != 3 || graph.Levels[1][0] != "init" ||
		graph.Steps[0].State != "running" || graph.Steps[2].Needs[0] != "init" {
		t.Errorf("show --json graph: %v %s", err, doc["graph"])
	}
	// The first step's task is an ordinary task with the deterministic key.
	if task := c.show("db-1/1/check/do"); string(task["kind"]) != `"noop"` {
		t.Errorf("step task kind %s", task["kind"])
	}
	if out := c.must("flow", "ls"); !strings.Contains(out, "db-1  running  step 1/3 check") {
		t.Errorf("ls printed %q", out)
	}
	if out := c.must("flow", "cancel", "db-1", "--rollback"); out != "db-1: rolling_back (step 1/3 check)\n" {
		t.Errorf("cancel printed %q", out)
	}
	if _, err := c.run("flow", "retry", "db-1"); err == nil || exitStatus(err) != exitFailed || !strings.Contains(err.Error(), "not finished") {
		t.Errorf("retry while rolling back: %v", err)
	}
	if _, err := c.run("flow", "show", "nope"); err == nil || !strings.Contains(err.Error(), "flow not found") {
		t.Errorf("show missing: %v", err)
	}
	if out := c.must("flow", "ls", "--active", "--json"); !strings.Contains(out, `"key": "db-1"`) {
		t.Errorf("ls --active --json printed %q", out)
	}
}

// TestFlowShowMaxFailedNeeds: show names a fan-in step's max_failed_needs
// beside its needs, in the text and in --json's graph.
func TestFlowShowMaxFailedNeeds(t *testing.T) {
	c := setup(t)
	file := writeFile(t, `{"steps": [
  {"name": "u1", "kind": "noop"}, {"name": "u2", "kind": "noop"},
  {"name": "all", "kind": "noop", "needs": ["u1", "u2"], "max_failed_needs": 1}
]}`)
	c.must("flow", "publish", "fleet", "--file", file)
	out := c.must("flow", "show", "fleet")
	var row string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "all" {
			row = strings.Join(f, " ")
		}
	}
	if row != "2 all noop waiting 0 - u1,u2 (max_failed_needs 1) none" {
		t.Errorf("show's row of the fan-in step: %q\n%s", row, out)
	}
	var doc struct {
		Graph struct {
			Steps []struct {
				Name           string `json:"name"`
				MaxFailedNeeds int    `json:"max_failed_needs"`
			} `json:"steps"`
		} `json:"graph"`
	}
	if err := json.Unmarshal([]byte(c.must("flow", "show", "fleet", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if s := doc.Graph.Steps; len(s) != 3 || s[2].Name != "all" || s[2].MaxFailedNeeds != 1 || s[0].MaxFailedNeeds != 0 {
		t.Errorf("show --json graph steps: %+v", s)
	}
}
