package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasepool/leasepool/flow"
)

// TestFlowExamples: every flow file under examples/ publishes through
// `leasepool flow publish` (strict parsing, validation, device steps
// checked as commands) and starts the steps that need nothing.
func TestFlowExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.json")
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v; want at least 3 flow files", files, err)
	}
	c := setup(t)
	for _, file := range files {
		key := strings.TrimSuffix(filepath.Base(file), ".json")
		if out := c.must("flow", "publish", key, "--file", file); out != "inserted "+key+" (running)\n" {
			t.Errorf("%s: publish printed %q", file, out)
			continue
		}
		var f flow.Flow
		if err := json.Unmarshal([]byte(c.must("flow", "show", key, "--json")), &f); err != nil {
			t.Fatalf("%s: show --json: %v", file, err)
		}
		needs := flow.Needs(f.Steps)
		for i, p := range f.Progress {
			if root := len(needs[i]) == 0; root != (p.State == flow.StepRunning) {
				t.Errorf("%s: step %s is %s with needs %v", file, f.Steps[i].Name, p.State, f.Steps[i].Needs)
			}
		}
	}
}
